#!/usr/bin/env python3
"""mypy over the package, each source file under the module name it is imported by.

    python .ci/typecheck.py [MYPY OPTIONS...]      (from anywhere; `make typecheck`)

pyproject.toml's [tool.setuptools.package-dir] maps three top-level folders into the package:
infra/ -> gpucluster.infra, cli/ -> gpucluster.cli, workloads/ -> gpucluster.workloads. mypy
names a file by the folders it lies in (infra/aws/program.py would be `infra.aws.program`) and
cannot follow the editable install's import hook, so `mypy gpucluster infra cli` checks those
folders under names nothing imports and cannot resolve `gpucluster.infra...` at all. This runs
mypy's own option parsing (pyproject.toml's [tool.mypy]) and build on every folder of that table,
with each file renamed into the package, then prints mypy's usual messages and summary and exits
with mypy's status (0: no errors, 1: errors, 2: a blocking error).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    """{package: folder} from pyproject.toml, e.g. {"gpucluster.infra": "infra", ...}."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: mypy itself depends on tomli there
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def main(argv: list[str]) -> int:
    from mypy import util
    from mypy.defaults import RECURSION_LIMIT
    from mypy.fscache import FileSystemCache
    from mypy.main import process_options, run_build
    from mypy.modulefinder import BuildSource

    t0 = time.time()
    sys.setrecursionlimit(RECURSION_LIMIT)
    os.chdir(ROOT)
    packages = {folder: name for name, folder in package_dirs().items()}
    fscache = FileSystemCache()
    sources, options = process_options(["--config-file", "pyproject.toml", *argv, *packages],
                                       fscache=fscache)
    # process_options named each file by its folders: infra/aws/program.py -> infra.aws.program
    renamed = []
    for s in sources:
        top, dot, rest = s.module.partition(".")
        if top not in packages:
            raise SystemExit(f"typecheck: {s.path} is not in a folder of [tool.setuptools.package-dir]")
        renamed.append(BuildSource(s.path, packages[top] + dot + rest, s.text, s.base_dir))

    _, messages, blockers = run_build(renamed, options, fscache, t0, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    n_errors, n_notes, n_files = util.count_stats(messages)
    if n_errors:
        print(formatter.format_error(n_errors, n_files, len(renamed), blockers=blockers,
                                     use_color=options.color_output))
    else:
        print(formatter.format_success(len(renamed), options.color_output))
    if messages and n_notes < len(messages):
        return 2 if blockers else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
