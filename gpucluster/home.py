"""Where gpucluster keeps its state: the ledger, run logs, Pulumi state, user price catalog."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpucluster.errors import ConfigError


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


def check_writable_dir(path: Path | str, what: str) -> Path:
    """Check that `path` is, or can be created as, a writable directory -- creating nothing.

    The nearest existing ancestor must be a directory where a probe directory can be made (and is
    removed at once): this is what the later mkdir + writes need, for root too (a read-only file
    system, a regular file in the way).
    """
    path = Path(path).expanduser()
    probe_in = path
    while not probe_in.exists():
        if probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        why = "is a file" if probe_in == path else f"{str(probe_in)!r} is a file, not a directory"
        raise ConfigError(f"{what} {str(path)!r} cannot be created: {why}; give a directory you can write")
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe_in, prefix=".gpucluster-write-test-"))
    except OSError as exc:
        where = "" if probe_in == path else f" (in {str(probe_in)!r})"
        raise ConfigError(f"{what} {str(path)!r} is not writable{where}: {exc.strerror or exc}; "
                          "give a directory you can write") from None
    return path


def runs_dir(run_id: str) -> Path:
    path = home_dir() / "runs" / run_id
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. $GPUCLUSTER_HOME/runs is a file
        raise ConfigError(f"run folder {str(path)!r} cannot be created ({exc.strerror or exc}); "
                          f"{str(path.parent)!r} must be a folder you can write") from None
    return path


CONFIG_FILE = "config.json"
SETTINGS = ("state", "secrets_provider")  # where team state lives (infra.pulumi.state)


def setting(key: str) -> str | None:
    """A setting of `$GPUCLUSTER_HOME/config.json` (a JSON object; keys: SETTINGS), or None. A file
    that is not such an object, or an unknown key, is a ConfigError naming it (exit 2)."""
    import json

    path = home_dir(create=False) / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"settings file {str(path)!r} cannot be read ({exc}); fix or remove it") from None
    try:
        data = json.loads(text or "{}")
    except ValueError as exc:
        raise ConfigError(f"settings file {str(path)!r} is not JSON ({exc}); write an object such as "
                          '{"state": "s3://bucket/prefix"}') from None
    if not isinstance(data, dict):
        raise ConfigError(f"settings file {str(path)!r} must hold a JSON object, e.g. {{\"state\": \"s3://bucket\"}}")
    unknown = sorted(set(data) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"settings file {str(path)!r}: key {unknown[0]!r} is not allowed; allowed: {', '.join(SETTINGS)}")
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"settings file {str(path)!r}: {key} must be a string, not {type(value).__name__}")
    return value or None
