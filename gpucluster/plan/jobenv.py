"""The job's own environment: `--env K=V`, `--env-file FILE` and `--secret NAME` (task file: `env`,
`env_file`, `secrets`). Every rank, and every --setup command, gets them.

- `--env` and `--env-file` values are plain settings: the plan names them, `--dry-run` shows them.
- `--secret NAME` takes the value of NAME from this machine's environment when the job starts (it
  is never typed on a command line). The job carries only the name (`JobSpec.secrets`); the value
  is read by the launcher (`secret_values`) and handed to the nodes' processes only:
  local: the process environment; ssh/aws: one JSON line on the ssh connection's stdin, read by the
  node supervisor (`reaper.py --env-stdin`) into its child's environment; gcp: a Kubernetes Secret
  the run creates and deletes, referenced by the pods. So a value never reaches the ledger, the
  plan, `show`, `--json`, a process's argv, Pulumi state or config, or a file on a node.
  It is in the environment of the job's processes (/proc/PID/environ), which only the same user
  (and root) can read -- as for any environment variable.

Env files: one `KEY=VALUE` a line; blank lines and lines starting with `#` are skipped; `export `
before the key is allowed; a value in matching single or double quotes is taken without them (no
escapes, no `$VAR` expansion).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Iterable, Mapping

from gpucluster.errors import LaunchError, UsageError

if TYPE_CHECKING:
    from gpucluster.watch.launch import JobSpec

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# set by gpucluster or torchrun on every rank: a job's own value would break the run
RESERVED = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"})
RESERVED_PREFIXES = ("GPUCLUSTER_", "TORCHELASTIC_")
MAX_VALUE_BYTES = 100_000  # Linux refuses one environment string over 128 KiB (MAX_ARG_STRLEN)
MAX_ENV_FILE_BYTES = 1 << 20


def check_name(what: str, name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise UsageError(f"{what} {name!r} is not allowed: a variable name (letters, digits and '_', not starting "
                         "with a digit)")
    if name in RESERVED or name.startswith(RESERVED_PREFIXES):
        raise UsageError(f"{what} {name!r} is not allowed: gpucluster or torchrun sets it on every rank "
                         "(GPUCLUSTER_*, TORCHELASTIC_*, RANK, WORLD_SIZE, MASTER_ADDR, CUDA_VISIBLE_DEVICES ...)")
    return name


def _check_value(what: str, name: str, value: str) -> str:
    if "\0" in value:
        raise UsageError(f"{what} {name}: the value holds a NUL byte, which no environment can carry")
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise UsageError(f"{what} {name}: the value is {len(value.encode())} bytes; at most {MAX_VALUE_BYTES} "
                         "(put large data in a --data folder)")
    return value


def parse_env(values: Iterable[str]) -> dict[str, str]:
    """Repeatable `--env KEY=VALUE` -> {KEY: VALUE} (a later one wins)."""
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r} is not allowed: KEY=VALUE (for a secret from this machine's "
                             "environment use --secret NAME)")
        out[check_name("--env", key)] = _check_value("--env", key, value)
    return out


def read_env_file(path: str) -> dict[str, str]:
    """An env file's settings; UsageError (exit 2) naming the file and line."""
    from gpucluster.userfile import read_bounded

    full = os.path.expanduser(path)
    try:
        text = read_bounded(full, "--env-file", MAX_ENV_FILE_BYTES, hint="a file of KEY=VALUE lines").decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"--env-file {path!r} does not exist; give a file of KEY=VALUE lines") from None
    except IsADirectoryError:
        raise UsageError(f"--env-file {path!r} is a folder; give a file of KEY=VALUE lines") from None
    except UnicodeDecodeError:
        raise UsageError(f"--env-file {path!r} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"--env-file {path!r} cannot be read: {exc.strerror}") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        where = f"--env-file {path!r}, line {number}"
        if not sep:
            # not quoted back: a pasted token on a line of its own would be shown (issue 45 item 13)
            raise UsageError(f"{where} is not KEY=VALUE (a line of {len(raw.strip())} characters without '='; "
                             "not shown here, it may hold a secret)")
        try:
            check_name("variable", key)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc.message}") from None
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = _check_value(where, key, value)
    return out


def parse_secrets(names: Iterable[str], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Repeatable `--secret NAME`: each a variable set in this machine's environment (checked now;
    read again when the job starts). Never `NAME=VALUE`: a value would be on the command line."""
    environ = os.environ if environ is None else environ
    out: list[str] = []
    for name in names or ():
        if "=" in name:
            raise UsageError(f"--secret {name.partition('=')[0]}=... is not allowed: give only the NAME of a "
                             "variable set in this machine's environment (export it first); a value typed here "
                             "would be in your shell history and the process list")
        check_name("--secret", name)
        if name not in environ:
            raise UsageError(f"--secret {name!r}: {name} is not set in this machine's environment; export it "
                             "first (its value is read from there, never from the command line)")
        _check_value("--secret", name, environ[name])
        if name not in out:
            out.append(name)
    return tuple(out)


def job_env(env: Iterable[str], env_files: Iterable[str], secrets: Iterable[str]
            ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(plain env pairs, secret names) of a job: the env files in order, then --env (a later value
    wins); a name both plain and secret is refused."""
    plain: dict[str, str] = {}
    for path in env_files or ():
        plain.update(read_env_file(path))
    plain.update(parse_env(env))
    names = parse_secrets(secrets)
    both = sorted(set(plain) & set(names))
    if both:
        raise UsageError(f"--secret {both[0]!r} is also given a value with --env/--env-file; give it one way")
    return tuple(sorted(plain.items())), names


def secret_values(job: JobSpec) -> dict[str, str]:
    """The values of the job's secrets, read from this machine's environment now (when a launcher
    starts the job); LaunchError naming (never showing) one that is no longer set."""
    out: dict[str, str] = {}
    for name in job.secrets:
        if name not in os.environ:
            raise LaunchError(f"secret {name} is no longer set in this machine's environment; export it and run again")
        out[name] = os.environ[name]
    return out


def env_line(env: Mapping[str, str]) -> bytes:
    """`env` as one JSON line for a node's stdin, after its keys line (`reaper.py --env-stdin` reads it
    into its child's environment); nothing to send: no bytes."""
    if not env:
        return b""
    import json

    return json.dumps(dict(env)).encode() + b"\n"


def describe(env: tuple[tuple[str, str], ...], secrets: tuple[str, ...]) -> list[str]:
    """The plan's lines: names only (plain values are for --dry-run)."""
    lines = []
    if env:
        lines.append(f"env: {', '.join(k for k, _ in env)}")
    if secrets:
        lines.append(f"secrets: {', '.join(secrets)} (values from this machine's environment, never shown or stored)")
    return lines
