"""Where digits' data file lies, found without importing torch: the copy shipped in this package
(`data/digits.csv.gz`, 57 KB, with `data/DIGITS-LICENSE.txt`: the UCI optdigits test set, CC BY 4.0,
byte for byte the file scikit-learn ships). The ssh launcher and the GKE plan send it to nodes
with the workload scripts, so neither this machine nor a node needs scikit-learn."""

from __future__ import annotations

import os

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")


def local_digits_file() -> str | None:
    """The shipped file, or None when this copy of the package lacks it (a broken install)."""
    return SHIPPED if os.path.isfile(SHIPPED) else None
