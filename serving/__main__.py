"""``python -m deploytk_serving REPO`` (installed) or ``python -m serving REPO`` (repository root): deploytk-triton."""

import sys

from .tritonserver import main

sys.exit(main())
