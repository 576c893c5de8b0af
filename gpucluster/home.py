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
        fresh = not path.exists()
        ensure_writable_dir(path, "GPUCLUSTER_HOME" if env else "gpucluster data directory")
        make_private(path, fresh)
    return path


# What marks a folder as a gpucluster home (an existing folder is tightened only when it holds one:
# GPUCLUSTER_HOME=/tmp or a project folder must never lose its other users' access).
HOME_MARKS = ("ledger.sqlite3", "installation-id")
_told: set[str] = set()


def make_private(path: Path, fresh: bool) -> None:
    """The home readable by its owner only (0700), whatever the umask: every run's command line,
    environment names, job output and cluster names are in it, and a home made 0755 under the usual
    umask let every user of a shared machine read them (issue 45 item 12). A new home is made so; an
    existing one that is ours, marked as a home and open to others is tightened once, with a note
    on stderr. Its files are then out of other users' reach whatever their own modes (no search
    permission on the folder); the ledger's files are 0600 as well (Ledger)."""
    import stat
    import sys

    try:
        st = path.stat()
        if not stat.S_IMODE(st.st_mode) & 0o077 or st.st_uid != os.getuid():
            return
        if not fresh and not any((path / m).exists() for m in HOME_MARKS):
            return
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError:
        return  # not ours to change (a read-only mount, another owner): the writable check said what matters
    if not fresh and str(path) not in _told:
        _told.add(str(path))
        print(f"note: gpucluster home {str(path)!r} was readable by other users (mode "
              f"{stat.S_IMODE(st.st_mode):04o}); it is now 0700 (owner only)", file=sys.stderr)


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

    from gpucluster.userfile import read_bounded

    path = home_dir(create=False) / CONFIG_FILE
    try:
        text = read_bounded(path, "settings file", 1 << 16, hint="a JSON object; fix or remove it",
                            error=ConfigError).decode("utf-8")
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


def private_file(path: Path) -> tuple[int, int] | None:
    """The ledger file 0600 before SQLite opens it: SQLite makes its -wal and -shm files with the
    database file's permissions (SQLite os_unix.c, findCreateFileMode), and would make the file
    itself 0644 under the usual umask. An existing ledger open to others is tightened (ours only).
    The file's (device, inode), or None when there is none.

    An existing file is never opened here, only stat'ed and chmod'ed by path: closing any descriptor
    of a database file drops every POSIX lock this process holds on it, those of its other open
    SQLite connections included (https://www.sqlite.org/howtocorrupt.html, section 2.2), and a
    second Ledger in the same process then lost a committed run row."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600))
    except FileExistsError:
        try:
            st = os.stat(path)
            if st.st_mode & 0o077 and st.st_uid == os.getuid():
                os.chmod(path, st.st_mode & 0o600)
        except OSError:
            pass
    except OSError:
        pass  # read-only or not ours: SQLite's own open says what is wrong
    return file_identity(path)


def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def ledger_moved(path: Path, opened: tuple[int, int] | None, what: str = "run") -> str | None:
    """Why the run's record is not where the ledger says it is, or None (issue 45 item 11): the
    file was deleted or replaced while the run wrote to it. SQLite keeps writing to the open file
    (an unlinked inode), so every write "succeeds" and the record is then lost with the file.
    `opened`: the file's (device, inode) when the ledger was opened (Ledger.identity)."""
    if opened is None:
        return None
    now = file_identity(path)
    if now == opened:
        return None
    how = "deleted" if now is None else "replaced by another file"
    if what == "run":
        return (f"the ledger {str(path)!r} was {how} during the run: this run's record went with the old file "
                "(what it created was still torn down and checked; see the report above)")
    return f"the ledger {str(path)!r} was {how} during the {what}: its records went with the old file"
