"""Helpers shared by the outputs tests (local and ssh): which node saved, and what it printed."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def writer(log_dir: Path) -> tuple[int, str]:
    """(node rank, its log) of the node that ran global rank 0, the one that saves: torchrun's
    c10d rendezvous orders the global ranks by (address, pid), so it is any node."""
    found = [(int(p.stem.split("-")[1]), p.read_text()) for p in sorted(log_dir.glob("node-*.log"))]
    found = [(n, text) for n, text in found if "SAVED " in text]
    assert len(found) == 1, [n for n, _ in found]
    return found[0]


def saved(log_text: str, name: str) -> list[str]:
    """The checksums the script printed for `name`, in order."""
    return re.findall(rf"SAVED {re.escape(name)} ([0-9a-f]{{64}})", log_text)
