"""Package discovery, which pyproject.toml alone cannot express: every package under server/,
plus the policy folder at the top, packaged as effect_ledger._policy (see [tool.setuptools])."""

from setuptools import find_packages, setup

setup(packages=[*find_packages("server"), "effect_ledger._policy"])
