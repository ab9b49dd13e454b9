"""Package layout that pyproject.toml cannot express: the top-level ``plugins/`` folder (the product's
layout names it) installs as ``deploytk_plugins``, and ``serving/`` (the local Triton server: the
``deploytk-triton`` command, runnable from any folder) as ``deploytk_serving``, not as generic top-level
``plugins`` and ``serving`` packages that would clash in site-packages. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["deploytk", "deploytk.*"]), "deploytk_plugins", "deploytk_serving"],
    package_dir={"deploytk_plugins": "plugins", "deploytk_serving": "serving"},
)
