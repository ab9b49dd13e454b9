"""``python -m deploytk ARGS``: the ``deploytk`` command where its console script is not installed (a wheel put on
PYTHONPATH with pip's ``install --target``, as scripts/device_check.sh does on the GPU machine)."""

from deploytk.cli import main

if __name__ == "__main__":
    main()
