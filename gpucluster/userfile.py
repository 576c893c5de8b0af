"""One bounded reader for every file gpucluster reads from the user or from its home (issue 45
item 4): task, config, stack and env files, the installation id, the settings file, .gitignore and
.gpuclusterignore. Only a regular file is read: it is opened without blocking (a FIFO would block
until a writer came; /dev/zero never ends; both report st_size 0, so a size check by `stat` alone
lets them through) and checked with fstat on the open descriptor; at most `max_bytes` are read.
Every refusal is one line naming what the file is for, its path and what is allowed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpucluster.errors import GpuclusterError, UsageError


def read_bounded(path: str | Path, what: str, max_bytes: int, *, hint: str = "a file",
                 error: type[GpuclusterError] = UsageError) -> bytes:
    """The bytes of the regular file at `path` (links followed), at most `max_bytes` of them.
    FileNotFoundError passes through (the caller says what a missing file means); a folder, a
    device, a pipe or a socket, a file over `max_bytes` or any other OSError is `error` (exit 2)."""
    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise error(f"{what} {shown!r} is a folder, not a file; give {hint}") from None
    except OSError as exc:
        raise error(f"{what} {shown!r} cannot be read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a device, pipe or socket"
            raise error(f"{what} {shown!r} is {kind}, not a file; give {hint}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{what} {shown!r} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{what} {shown!r} is over {max_bytes} bytes; at most {max_bytes} bytes are read")
    return data
