"""Package discovery for the one distribution (metadata lives in pyproject.toml).

`gpucluster/` holds the core; four top-level folders are mapped into it by pyproject.toml's
[tool.setuptools.package-dir]: infra/ -> gpucluster.infra, workloads/ -> gpucluster.workloads,
cli/ -> gpucluster.cli, api/ -> gpucluster.api. setuptools' own `packages.find` cannot add a prefix to what it finds in a
mapped folder, so every package (a folder with an __init__.py) is found here, none listed by hand;
tests/test_wheel.py checks that the wheel holds every module and data file of the source tree.
"""

from setuptools import find_packages, setup

MAPPED = {"gpucluster.infra": "infra", "gpucluster.workloads": "workloads", "gpucluster.cli": "cli",
          "gpucluster.api": "api"}


def discover() -> list[str]:
    found = find_packages(".", include=["gpucluster", "gpucluster.*"])
    for name, folder in MAPPED.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return sorted(found)


setup(packages=discover())
