"""The Pulumi CLI and where its state lives, for `infra.pulumi.engine`'s driver.

State is a local file backend under the gpucluster home (`<home>/pulumi/state`, a file:// URL), so
no Pulumi Cloud account is needed; a user's own `PULUMI_BACKEND_URL` is respected. Secrets are
encrypted with the passphrase provider; the passphrase is generated once and kept in
`<home>/pulumi/passphrase` with mode 0600 (a looser mode is refused). The CLI is the `pulumi` on
PATH when it is at least `MIN_PULUMI_VERSION`, else the copy gpucluster installed in
`<home>/pulumi/cli/<version>` (`install_cli`: `PulumiCommand.install`, which runs get.pulumi.com's
install script; the CLI layer asks first, see `install_choice`); it runs in its own session
(`detached_command_class`) so that a Ctrl-C reaches gpucluster first. `stale_pulumi_lock` tells a lock left by a dead process from a
live one. `pulumi.automation` is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.errors import ConfigError, MissingDependency, require
from gpucluster.infra.pulumi.state import _folder, pulumi_dir  # noqa: F401 - pulumi_dir: part of this module's API

if TYPE_CHECKING:
    from pulumi.automation import PulumiCommand


PROJECT = "gpucluster"
# pulumi.automation refuses inline programs for refresh/destroy below 3.181 (`--client` support);
# `refresh --clear-pending-creates` and `destroy --continue-on-error` are older than that.
MIN_PULUMI_VERSION = "3.181.0"
INSTALL_URL = "https://www.pulumi.com/docs/install/"
INSTALL_HINT = f"install it with `curl -fsSL https://get.pulumi.com | sh` (or see {INSTALL_URL})"
# The setting that answers "install the Pulumi CLI?" for every command (else --yes, else a question).
INSTALL_SETTING = "GPUCLUSTER_INSTALL_PULUMI"
_YES, _NO = ("yes", "true", "1"), ("no", "false", "0")

_LOCK_OWNER = re.compile(r"created by (?P<who>\S+) \(pid (?P<pid>\d+)\)")



# -- where state lives --------------------------------------------------------------------------
def own_backend() -> bool:
    """Whether the state is the home's own file backend (not a state others may share)."""
    from gpucluster.infra.pulumi.state import shared

    return not shared()


def backend_url() -> str:
    """The state chosen (--state, GPUCLUSTER_STATE, config.json, PULUMI_BACKEND_URL: `infra.pulumi.state`),
    else a file backend under the gpucluster home."""
    from gpucluster.infra.pulumi.state import state_url

    return state_url()


def passphrase_file() -> Path:
    """The passphrase file, created once (random, mode 0600); refused when others can read it."""
    path = pulumi_dir() / "passphrase"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
        return path
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"the Pulumi passphrase file {str(path)!r} has mode {mode:04o}: others can read it; "
            f"fix it with: chmod 600 '{path}'"
        )
    if path.stat().st_size == 0:
        raise ConfigError(f"the Pulumi passphrase file {str(path)!r} is empty; restore it from a backup "
                          "(stacks encrypted with it cannot be read without it)")
    return path


def workspace_env() -> dict[str, str]:
    """The CLI's environment: the state, and the home's passphrase file unless the user gives one
    (a shared state needs the team's: `infra.pulumi.state.check_secrets`)."""
    env = {"PULUMI_BACKEND_URL": backend_url(), "PULUMI_SKIP_UPDATE_CHECK": "true"}
    if not (os.environ.get("PULUMI_CONFIG_PASSPHRASE") or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")) \
            and own_backend():
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(passphrase_file())
    return env


def work_dir(name: str) -> Path:
    return _folder(pulumi_dir() / "work" / name)


# -- the CLI --------------------------------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, ...]:
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(text).strip())
    return tuple(int(x) for x in m.groups()) if m else ()


def check_cli_version(version: object) -> str:
    """The version as text, or MissingDependency when it is unknown or older than the minimum."""
    text = str(version) if version is not None else ""
    found = _version_tuple(text)
    if not found:
        raise MissingDependency(
            f"could not read the Pulumi CLI version ({text or 'none'}); gpucluster needs {MIN_PULUMI_VERSION} "
            f"or newer: {INSTALL_HINT}"
        )
    if found < _version_tuple(MIN_PULUMI_VERSION):
        raise MissingDependency(
            f"the Pulumi CLI is version {text}, older than the {MIN_PULUMI_VERSION} gpucluster needs; "
            f"upgrade it with `curl -fsSL https://get.pulumi.com | sh` (or see {INSTALL_URL})"
        )
    return text


class PulumiCliMissing(MissingDependency):
    """No usable Pulumi CLI: none on PATH or in the gpucluster home, or only older ones. The CLI
    layer may offer `install_cli` (a copy in the gpucluster home) before giving up."""


def managed_root(version: str = MIN_PULUMI_VERSION) -> Path:
    """Where gpucluster installs the Pulumi CLI: `<home>/pulumi/cli/<version>` (binary in bin/)."""
    return pulumi_dir() / "cli" / version


def install_choice() -> bool | None:
    """The INSTALL_SETTING: True (install without asking), False (never), None (ask, or --yes)."""
    value = os.environ.get(INSTALL_SETTING, "").strip().lower()
    if not value:
        return None
    if value in _YES or value in _NO:
        return value in _YES
    raise ConfigError(f"{INSTALL_SETTING}={value!r} is not allowed; use yes or no")


def _open(root: str | None) -> tuple[PulumiCommand | None, str]:
    """A `PulumiCommand` for the CLI under `root` (None: PATH) and its version, or (None, why)."""
    try:
        cmd = detached_command_class()(root=root, skip_version_check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        return None, f"could not be run ({exc})"
    try:
        check_cli_version(cmd.version)
    except MissingDependency:
        return None, f"is version {cmd.version}, older than {MIN_PULUMI_VERSION}"
    return cmd, ""


def load_cli(pulumi_command: PulumiCommand | None = None) -> PulumiCommand:
    """A checked `PulumiCommand` (or the one given, e.g. a test fake): the `pulumi` on PATH when
    new enough (a user's own CLI wins), else gpucluster's copy in `managed_root()`, else
    PulumiCliMissing. Nothing is installed here."""
    if pulumi_command is None:
        require("pulumi.automation", "aws")
        problems = []
        on_path = shutil.which("pulumi")
        if on_path:
            pulumi_command, why = _open(None)
            if pulumi_command is None:
                problems.append(f"the `pulumi` on PATH ({on_path}) {why}")
        else:
            problems.append("the Pulumi CLI (`pulumi`) is not on PATH")
        root = managed_root()
        if pulumi_command is None and (root / "bin" / "pulumi").exists():
            pulumi_command, why = _open(str(root))
            if pulumi_command is None:
                problems.append(f"the copy in {root} {why}")
        if pulumi_command is None:
            raise PulumiCliMissing(
                f"{'; '.join(problems)}; gpucluster needs version {MIN_PULUMI_VERSION} or newer to create cloud "
                f"clusters: {INSTALL_HINT}, or let gpucluster install it into {root} (answer yes when asked, "
                f"pass --yes, or set {INSTALL_SETTING}=yes)"
            )
    check_cli_version(getattr(pulumi_command, "version", None))
    return pulumi_command


def cli_source(pulumi_command: PulumiCommand) -> str:
    """Where a loaded CLI came from, for `doctor`: PATH (with its path) or gpucluster's copy."""
    command = str(getattr(pulumi_command, "command", ""))
    if os.path.isabs(command):
        where = Path(command).parent.parent
        return f"installed by gpucluster in {where}" if where == managed_root() else f"from {command}"
    return f"on PATH ({shutil.which(command) or command})"


def install_cli(version: str = MIN_PULUMI_VERSION) -> PulumiCommand:
    """Install the Pulumi CLI `version` into `managed_root(version)` with the Automation API's own
    `PulumiCommand.install` (it downloads https://get.pulumi.com/install.sh and runs it with
    `--install-root ROOT --version VERSION --no-edit-path`); a failure is a MissingDependency."""
    require("pulumi.automation", "aws")
    from pulumi.automation import PulumiCommand
    from semver import VersionInfo

    root = managed_root(version)
    try:
        PulumiCommand.install(root=str(root), version=VersionInfo.parse(version))
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        detail = getattr(exc, "output", b"") or b""
        detail = detail.decode(errors="replace").strip().splitlines()[-1:] if isinstance(detail, bytes) else []
        raise MissingDependency(
            f"installing the Pulumi CLI {version} into {root} failed ({exc}{'; ' + detail[0] if detail else ''}): "
            f"{INSTALL_HINT}") from None
    return load_cli(None)


def detached_command_class() -> type:
    """`PulumiCommand` whose CLI runs in its own session: a Ctrl-C at the terminal reaches only
    gpucluster, which forwards it (SIGINT: Pulumi cancels gracefully) unless it is in a teardown,
    where Ctrl-C is ignored so that `destroy` finishes. Upstream's `run` otherwise unchanged.

    Why a copy of upstream's `PulumiCommand.run` (pulumi 3.272) and not the public API: `run` starts
    the CLI with `subprocess.Popen` and offers no way to pass `start_new_session` (no Popen options,
    no process-group setting), and it blocks in `Thread.join` with no way to forward a Ctrl-C: the
    interrupt would leave Pulumi running on without being asked to cancel. A wrapper `command` (a
    `setsid` script) would detach it but still not forward SIGINT. Only public names are used
    (`PulumiCommand`, `CommandResult`, `errors.create_command_error`); the private `_cmd` is not."""
    from pulumi.automation import CommandResult, PulumiCommand
    from pulumi.automation.errors import create_command_error

    class DetachedPulumiCommand(PulumiCommand):
        def run(self, args, cwd, additional_env, on_output=None, on_error=None):
            sep = args.index("--") if "--" in args else len(args)
            if "--non-interactive" not in args[:sep]:
                args.insert(0, "--non-interactive")
            env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
            if os.path.isabs(self.command):
                env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
            chunks: dict[str, list[str]] = {"out": [], "err": []}

            def consume(stream, callback, key):
                for line in iter(stream.readline, ""):
                    line = line.rstrip()
                    if callback:
                        callback(line)
                    chunks[key].append(line)
                stream.close()

            interrupted: BaseException | None = None
            with subprocess.Popen([self.command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                  env=env, encoding="utf-8", start_new_session=True) as proc:
                readers = [threading.Thread(target=consume, args=(proc.stdout, on_output, "out"), daemon=True),
                           threading.Thread(target=consume, args=(proc.stderr, on_error, "err"), daemon=True)]
                for t in readers:
                    t.start()
                while True:
                    try:
                        for t in readers:
                            t.join()
                        proc.wait()
                        break
                    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM turned into one by the lifecycle
                        interrupted = exc
                        with contextlib.suppress(ProcessLookupError):
                            proc.send_signal(signal.SIGINT)
            if interrupted is not None:
                raise interrupted
            result = CommandResult(stdout="\n".join(chunks["out"]), stderr="\n".join(chunks["err"]),
                                   code=proc.returncode)
            if result.code != 0:
                raise create_command_error(result)
            return result

    return DetachedPulumiCommand


def stale_pulumi_lock(text: str) -> tuple[bool, str]:
    """(stale, who) for a "stack is currently locked" error: stale only when every lock names a
    process on this host that no longer runs."""
    import psutil

    owners = list(_LOCK_OWNER.finditer(text))
    if not owners:
        return False, "an unknown process"
    here = socket.gethostname()
    for m in owners:
        who, pid = m.group("who"), int(m.group("pid"))
        host = who.rsplit("@", 1)[-1]
        if host != here:
            return False, f"{who} (pid {pid}) on another machine"
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "pulumi" in " ".join(proc.cmdline()).lower():
                return False, f"{who} (pid {pid}), still running"
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return True, ", ".join(f"pid {m.group('pid')}" for m in owners)
