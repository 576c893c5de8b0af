"""Where gpucluster keeps its state: the ledger, run logs, Pulumi state, user price catalog."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError


def home_dir(create: bool = True) -> Path:
    """GPUCLUSTER_HOME if set, else the platform's user data dir; checked to be writable."""
    env = os.environ.get("GPUCLUSTER_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        import platformdirs

        path = Path(platformdirs.user_data_dir("gpucluster", appauthor=False))
    if create:
        ensure_writable_dir(path, "GPUCLUSTER_HOME" if env else "gpucluster data directory")
    return path


def ensure_writable_dir(path: Path, what: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{what} {str(path)!r} is not a writable directory ({exc.strerror or exc}); "
            "set GPUCLUSTER_HOME to a directory you can write"
        ) from None
    return path


def runs_dir(run_id: str) -> Path:
    path = home_dir() / "runs" / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path
