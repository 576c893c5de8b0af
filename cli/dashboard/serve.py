"""Serving the dashboard: a socket bound to 127.0.0.1 (a port that cannot be had is one line and
exit 2), the URL with its token on the first line of output, uvicorn until Ctrl-C, and the
`dashboard.json` note in the home that lets a run's notification link to its page."""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

HOST = "127.0.0.1"  # loopback only, whatever is asked


def bind(port: int | None) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (None: a free one the kernel picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, not one in use
        sock.bind((HOST, port or 0))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        other = "choose another with --port N (1024 to 65535), or leave --port out for a random free one"
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise UsageError(f"--port {port} is not allowed: this user may not listen on it (ports below 1024 "
                             f"need privileges); {other}") from None
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"--port {port} is in use on {HOST}: {other}") from None
        raise UsageError(f"--port {port}: cannot listen on {HOST} ({exc.strerror or exc}); {other}") from None
    return sock


def note_path() -> Path:
    from gpucluster.home import home_dir

    return home_dir() / "dashboard.json"


def write_note(base: str) -> None:
    """Where this dashboard serves, for `gpucluster.lifecycle.notify`'s `link` (removed when it stops)."""
    path = note_path()
    tmp = path.with_name(f".dashboard.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": base, "pid": os.getpid()}, fh)
    os.replace(tmp, path)


def remove_note() -> None:
    try:
        path = note_path()
        with open(path) as fh:
            if json.load(fh).get("pid") == os.getpid():
                path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def serve(*, port: int | None, browser: bool, allow_actions: bool) -> int:
    from gpucluster.errors import require

    for module in ("starlette", "uvicorn", "jinja2"):
        require(module, "dashboard")
    import uvicorn

    from gpucluster.cli.dashboard.app import build
    from gpucluster.ledger.store import Ledger

    sock = bind(port)  # a port it cannot have: one line, before anything else
    try:
        Ledger.open_default().close()  # a damaged or newer ledger: its one-line error now, not on the first page
    except BaseException:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    token = secrets.token_urlsafe(18)
    base = f"http://{HOST}:{bound}"
    url = f"{base}/?token={token}"
    print(url, flush=True)  # the first line: scripts and tests read it
    print(f"serving the ledger {'with actions (down)' if allow_actions else 'read-only'} on {HOST}:{bound}; "
          "Ctrl-C stops it", file=sys.stderr, flush=True)
    write_note(base)
    if browser:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(build(token, allow_actions=allow_actions), log_level="warning", lifespan="off",
                            access_log=False, timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        remove_note()
        sock.close()
    return 0
