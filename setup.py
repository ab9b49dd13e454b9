"""Package layout that pyproject.toml cannot express: the top-level ``plugins/`` folder (the product's
layout names it) installs as ``deploytk_plugins``, and ``serving/`` (the local Triton server: the
``deploytk-triton`` command, runnable from any folder) as ``deploytk_serving``, not as generic top-level
``plugins`` and ``serving`` packages that would clash in site-packages. The ready-made configs (``export_configs/``)
and the digits models their checkpoints name (``assets/digits_*``) install inside the package, as
``deploytk/export_configs`` and ``deploytk/assets``, side by side as in the source tree, so that
``deploytk export deit_small_tome_r16`` works from a wheel (deploytk/ready_made.py finds either; which files go in:
pyproject.toml's package-data). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["deploytk", "deploytk.*"]),
        "deploytk_plugins",
        "deploytk_serving",
        "deploytk.export_configs",
        "deploytk.assets",
    ],
    package_dir={
        "deploytk_plugins": "plugins",
        "deploytk_serving": "serving",
        "deploytk.export_configs": "export_configs",
        "deploytk.assets": "assets",
    },
)
