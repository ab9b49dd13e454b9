"""Package layout that pyproject.toml cannot express: the top-level ``plugins/`` folder (the product's
layout names it) installs as ``deploytk_plugins``, not as a generic top-level ``plugins`` package that
would clash in site-packages. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["deploytk", "deploytk.*"]), "deploytk_plugins"],
    package_dir={"deploytk_plugins": "plugins"},
)
