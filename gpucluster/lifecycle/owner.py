"""Who owns a cluster right now: an OS file lock that the kernel releases when its process dies.

Every command that changes a cluster (`run` from provision to the end of teardown, `up`, `down`,
`gc` deleting a cluster's resources) holds `owner_lock(cluster)`: an exclusive `fcntl.flock` on
`$GPUCLUSTER_HOME/locks/<cluster>.lock`, with {pid, op, run_id, since, host} written inside for
people and for `down --force`. Nothing here guesses from pid files or command lines: the lock is
held exactly as long as the owning process (or a descendant it handed the descriptor to; ours is
opened close-on-exec) lives, so a SIGKILLed `gpucluster run` no longer owns anything.

`owner(name)` asks without taking: it tries a shared lock; if that would block, the cluster is
owned and the info in the file names the owner. The lock is re-entrant within one process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from gpucluster.errors import ClusterBusy, ConfigError
from gpucluster.states import JsonMapping, JsonObject

_held: dict[str, tuple[int, int]] = {}  # cluster -> (fd, depth)
_guard = threading.Lock()


def locks_dir() -> Path:
    from gpucluster.home import home_dir

    path = home_dir() / "locks"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. a file where the folder belongs
        raise _unusable(path, exc) from None
    if not path.is_dir():
        raise ConfigError(f"lock folder {str(path)!r} is not a folder; move it aside (gpucluster makes a new one)")
    return path


def _unusable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(f"lock {str(path)!r} cannot be used ({exc.strerror or exc}); it must be a file in a "
                       "folder you can write: move it aside")


def _path(name: str) -> Path:
    return locks_dir() / f"{name}.lock"


def _read(fd: int) -> JsonObject:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        return json.loads(data.decode() or "{}")
    except (OSError, ValueError):
        return {}


def owner(name: str) -> JsonObject | None:
    """The live owner of cluster `name` ({pid, op, run_id, since, host}), or None when no process
    holds the lock. This process's own lock counts as an owner too."""
    with _guard:
        if name in _held:
            return {**_read(_held[name][0]), "self": True}
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read(fd) or {"pid": None}
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def describe(info: JsonMapping) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since") or 0))
    run = f", run {info['run_id']}" if info.get("run_id") else ""
    return f"gpucluster process {info.get('pid', '?')} ({info.get('op', '?')}{run}, since {since})"


def busy_error(name: str, info: JsonMapping) -> ClusterBusy:
    return ClusterBusy(f"cluster {name!r} is in use by {describe(info)}",
                       hint=f"wait for it to finish, or stop it and its teardown with `gpucluster down {name} --force`")


@contextlib.contextmanager
def owner_lock(name: str, op: str, *, run_id: str | None = None) -> Iterator[None]:
    """Own cluster `name` for the block; ClusterBusy (naming the owner) when another process does."""
    with _guard:
        if name in _held:
            fd, depth = _held[name]
            _held[name] = (fd, depth + 1)
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _guard:
                fd, depth = _held[name]
                _held[name] = (fd, depth - 1)
        return
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # close-on-exec (PEP 446)
    except OSError as exc:  # a folder where the lock belongs, a read-only home, ...
        raise _unusable(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        info = _read(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise busy_error(name, info) from None
        raise
    info = {"pid": os.getpid(), "op": op, "run_id": run_id, "since": time.time(), "host": socket.gethostname()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as exc:  # a full home: nothing has started yet
        os.close(fd)
        raise _unusable(path, exc) from None
    with _guard:
        _held[name] = (fd, 1)
    try:
        yield
    finally:
        with _guard:
            fd, depth = _held.pop(name)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock


def stop_owner(name: str, *, timeout: float = 900.0, poll: float = 0.2,
               say: Callable[[str], None] | None = None) -> JsonObject | None:
    """`down --force`: send the owner SIGTERM (it tears down as on Ctrl-C) and wait until it has
    released the lock, i.e. until its teardown finished or it died. Returns the owner info, or
    None when nothing owned the cluster. Raises ClusterBusy when it still holds it after `timeout`."""
    info = owner(name)
    if info is None or info.get("self"):
        return None
    pid = info.get("pid")
    if not pid or info.get("host") not in (None, socket.gethostname()):
        raise ClusterBusy(f"cluster {name!r} is owned by {describe(info)} on another machine; stop it there")
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGTERM)
    if say:
        say(f"sent SIGTERM to {describe(info)}; waiting for its teardown to finish")
    deadline = time.monotonic() + timeout
    while owner(name) is not None:
        if time.monotonic() > deadline:
            raise ClusterBusy(f"cluster {name!r}: {describe(info)} did not finish its teardown within {timeout:.0f} s",
                              hint=f"kill it (kill -9 {pid}), then run `gpucluster down {name}` again")
        time.sleep(poll)
    return info
