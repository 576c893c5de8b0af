"""Where scikit-learn's digits.csv.gz lies on this machine, found without importing torch or
scikit-learn (the ssh launcher ships it to nodes with the workload scripts)."""

from __future__ import annotations

import importlib.util
import os


def local_digits_file() -> str | None:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
    return path if os.path.exists(path) else None
