"""The Pulumi Automation API driver: the only module that touches `pulumi.automation`.

One stack per cluster (stack name = cluster name) in the project "gpucluster", run with an
*inline* program (`gpucluster.infra.program.run(spec)`, the same program `pulumi up` runs from
the repository root). State lives in a local file backend under the gpucluster home
(`<home>/pulumi/state`, a file:// URL), so no Pulumi Cloud account is needed; a user's own
`PULUMI_BACKEND_URL` is respected. Secrets (the SSH key, the kubeconfig) are encrypted with the
passphrase provider; the passphrase is generated once and kept in `<home>/pulumi/passphrase`
with mode 0600 (a looser mode is refused).

Robustness rules, each tested with a recording fake of `PulumiCommand`:

- `up` streams engine events to `ProvisionEvents` (requested before, created after), and when it
  fails halfway (say `InsufficientInstanceCapacity`) or is interrupted (Ctrl-C), it destroys what
  was created before raising; a capacity error names the zone and suggests the next ones.
- `destroy` (used by `down`): a stale Pulumi lock is cancelled only when its owner process is gone
  and no other live gpucluster process owns the cluster (owner pid file under
  `<home>/pulumi/locks`); `refresh --clear-pending-creates` drops creates that never finished
  (the tag scan finds anything they made); `destroy --continue-on-error` goes past a resource
  that fails to delete; a stack that does not exist is already down.

`pulumi.automation` is imported inside functions only: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from gpucluster.errors import ClusterBusy, ConfigError, GpuclusterError, MissingDependency, ProvisionError, require  # noqa: F401 (ClusterBusy re-exported)

from gpucluster.owner import owner as lock_owner  # noqa: F401 - re-exported: who owns a cluster
from gpucluster.owner import owner_lock

from gpucluster.domain import NullEvents, ProvisionEvents
from gpucluster.infra.registry import all_backends, backend

PROJECT = "gpucluster"
# pulumi.automation refuses inline programs for refresh/destroy below 3.181 (`--client` support);
# `refresh --clear-pending-creates` and `destroy --continue-on-error` are older than that.
MIN_PULUMI_VERSION = "3.181.0"
INSTALL_URL = "https://www.pulumi.com/docs/install/"
INSTALL_HINT = f"install it with `curl -fsSL https://get.pulumi.com | sh` (or see {INSTALL_URL})"

CREATE_OPS = ("create", "create-replacement", "replace")
DELETE_OPS = ("delete", "delete-replaced", "discard")

_LOCK_OWNER = re.compile(r"created by (?P<who>\S+) \(pid (?P<pid>\d+)\)")


class CapacityError(ProvisionError):
    """The cloud had no capacity for the request in a zone; what was created has been destroyed."""

    def __init__(self, message: str, *, zone: str | None, suggested_zones: list[str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.zone = zone
        self.suggested_zones = suggested_zones


# -- where state lives --------------------------------------------------------------------------
def pulumi_dir() -> Path:
    from gpucluster.home import home_dir

    path = home_dir() / "pulumi"
    path.mkdir(parents=True, exist_ok=True)
    return path


def own_backend() -> bool:
    return not os.environ.get("PULUMI_BACKEND_URL")


def backend_url() -> str:
    """The user's PULUMI_BACKEND_URL when set, else a file backend under the gpucluster home."""
    if not own_backend():
        return os.environ["PULUMI_BACKEND_URL"]
    state = pulumi_dir() / "state"
    state.mkdir(parents=True, exist_ok=True)
    return state.resolve().as_uri()


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
    env = {"PULUMI_BACKEND_URL": backend_url(), "PULUMI_SKIP_UPDATE_CHECK": "true"}
    if not (os.environ.get("PULUMI_CONFIG_PASSPHRASE") or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")):
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(passphrase_file())
    return env


def work_dir(name: str) -> Path:
    path = pulumi_dir() / "work" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the CLI --------------------------------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, ...]:
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(text).strip())
    return tuple(int(x) for x in m.groups()) if m else ()


def check_cli_version(version: Any) -> str:
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


def load_cli(pulumi_command: Any = None) -> Any:
    """A checked `PulumiCommand` (or the one given, e.g. a test fake)."""
    if pulumi_command is None:
        require("pulumi.automation", "aws")

        if shutil.which("pulumi") is None:
            raise MissingDependency(
                f"the Pulumi CLI (`pulumi`) is not on PATH; gpucluster needs version {MIN_PULUMI_VERSION} "
                f"or newer to create cloud clusters: {INSTALL_HINT}"
            )
        try:
            pulumi_command = detached_command_class()(skip_version_check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise MissingDependency(f"the Pulumi CLI could not be run ({exc}): {INSTALL_HINT}") from None
    check_cli_version(getattr(pulumi_command, "version", None))
    return pulumi_command


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


@contextlib.contextmanager
def _teardown_shield() -> Iterator[None]:
    """While cleaning up after a failure, Ctrl-C/SIGTERM do not stop the cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])


# -- engine events -> ProvisionEvents --------------------------------------------------------------
def resource_kind(type_token: str) -> str | None:
    """The ledger kind of a Pulumi type token, from the backend that declares it (`pulumi_kinds`)."""
    for b in all_backends():
        kind = b.pulumi_kinds.get(type_token)
        if kind:
            return kind
    return None


def _urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _detail(kind: str, inputs: Mapping[str, Any], spec: Any) -> dict[str, Any]:
    """What the cost code needs about a billable resource, from the backend whose kind it is."""
    for b in all_backends():
        if kind in b.pulumi_kinds.values():
            return b.resource_detail(kind, inputs or {}, spec)
    return {}


class EventBridge:
    """`on_event` callback: resource pre/outputs events -> requested/created/deleted + messages.

    Runs on pulumi.automation's event thread: it never raises (errors are kept in `.errors`)."""

    def __init__(self, events: ProvisionEvents, spec: Any = None, *, record: bool = True):
        self.events, self.spec, self.record = events, spec, record
        self.diagnostics: list[str] = []
        self.failed: list[str] = []
        self.errors: list[BaseException] = []
        self.requested: list[tuple[str, str]] = []

    def __call__(self, event: Any) -> None:
        try:
            self._handle(event)
        except Exception as exc:  # noqa: BLE001 - must not kill the event thread
            self.errors.append(exc)

    def _handle(self, ev: Any) -> None:
        if ev.resource_pre_event is not None and self.record:
            md = ev.resource_pre_event.metadata
            kind = resource_kind(md.type)
            if kind and not ev.resource_pre_event.planning and md.op in CREATE_OPS:
                name = _urn_name(md.urn)
                inputs = (md.new.inputs if md.new else None) or {}
                self.events.resource_requested(kind, name, type=md.type, **_detail(kind, inputs, self.spec))
                self.requested.append((kind, name))
        if ev.res_outputs_event is not None and self.record:
            md = ev.res_outputs_event.metadata
            kind = resource_kind(md.type)
            if kind and md.op in CREATE_OPS:
                self.events.resource_created(kind, _urn_name(md.urn), (md.new.id if md.new else None) or None)
            elif kind and md.op in DELETE_OPS:
                self.events.resource_deleted(kind, _urn_name(md.urn), (md.old.id if md.old else None) or None)
        if ev.res_op_failed_event is not None:
            md = ev.res_op_failed_event.metadata
            self.failed.append(f"{md.op} {_urn_name(md.urn)} ({md.type})")
        if ev.diagnostic_event is not None and ev.diagnostic_event.severity in ("error", "warning"):
            text = (ev.diagnostic_event.message or "").strip()
            if text and ev.diagnostic_event.severity == "error":
                self.diagnostics.append(text)
                self.events.message(text)
            elif text:
                self.events.message(f"warning: {text}")


# -- error text -> what to tell the user ----------------------------------------------------------
def _command_text(exc: BaseException) -> str:
    result = getattr(exc, "command_result", None) or getattr(exc, "result", None)
    if result is not None:
        return f"{getattr(result, 'stderr', '')}\n{getattr(result, 'stdout', '')}"
    return str(exc)


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.lower().startswith("error") or "error:" in ln.lower()]
    return (errs or lines or ["(no output)"])[-1][:400]


def capacity_error(spec: Any, text: str, zone_lister: Callable[[str, str | None], list[str]] | None = None,
                   cleanup: str = "everything this attempt created was destroyed") -> CapacityError | None:
    """A CapacityError naming the zone and the next zones to try, if `text` is a capacity failure
    (one of the spec's backend's `capacity_markers`; the zones from its `capacity_zones`)."""
    b = backend(spec.cloud)
    marker = next((m for m in b.capacity_markers if m.lower() in text.lower()), None)
    if marker is None:
        return None
    zone, suggested, what = b.capacity_zones(spec, text, zone_lister)
    suggested = [z for z in dict.fromkeys(suggested) if z != zone]
    where = zone or "the requested zone"
    msg = f"no capacity for {what} in {where} right now ({marker}); {cleanup}"
    if suggested:
        hint = f"try the next zone: --zone {suggested[0]}" + (
            f" (other candidates: {', '.join(suggested[1:5])})" if len(suggested) > 1 else "")
    else:
        hint = "try another zone with --zone, another region with --region, or --spot/on-demand the other way"
    return CapacityError(msg, zone=zone, suggested_zones=suggested, hint=hint)


# -- the driver ------------------------------------------------------------------------------------
@dataclass
class UpResult:
    outputs: dict[str, Any]  # plain values, secrets included
    secret_keys: set[str] = field(default_factory=set)


def default_program_runner(spec: Any) -> None:
    from gpucluster.infra import program

    program.run(spec)


def _supported(method: Callable, option: str) -> bool:
    try:
        return option in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class PulumiDriver:
    """up / destroy / outputs / list over Pulumi stacks, one per cluster.

    `pulumi_command`: a `pulumi.automation.PulumiCommand` (default: the `pulumi` on PATH, checked
    to be at least MIN_PULUMI_VERSION); tests pass a recording fake. `program_runner(spec)`
    declares the resources (default `gpucluster.infra.program.run`)."""

    def __init__(self, *, pulumi_command: Any = None, program_runner: Callable[[Any], Any] | None = None,
                 zone_lister: Callable[[str, str | None], list[str]] | None = None):
        self._command = pulumi_command
        self.program_runner = program_runner or default_program_runner
        self.zone_lister = zone_lister

    @property
    def cli(self) -> Any:
        self._command = load_cli(self._command)
        return self._command

    # -- stacks ------------------------------------------------------------------------------------
    def _options(self, name: str) -> Any:
        from pulumi.automation import LocalWorkspaceOptions, ProjectSettings

        return LocalWorkspaceOptions(
            work_dir=str(work_dir(name)),
            env_vars=workspace_env(),
            secrets_provider="passphrase" if not backend_url().startswith("https://") else None,
            project_settings=ProjectSettings(name=PROJECT, runtime="python"),
            pulumi_command=self.cli,
        )

    def stack(self, name: str, program: Callable[[], Any] | None = None, *, create: bool | str) -> Any | None:
        """The cluster's stack, or None when it does not exist. create: False (select only), True
        (select or create), "new" (create; it is known not to exist)."""
        require("pulumi.automation", "aws")
        from pulumi import automation as auto

        program = program or (lambda: None)  # refresh/destroy/outputs do not run the program
        try:
            if create == "new":
                return auto.create_stack(stack_name=name, project_name=PROJECT, program=program,
                                         opts=self._options(name))
            if create:
                return auto.create_or_select_stack(stack_name=name, project_name=PROJECT, program=program,
                                                   opts=self._options(name))
            return auto.select_stack(stack_name=name, project_name=PROJECT, program=program,
                                     opts=self._options(name))
        except auto.StackNotFoundError:
            return None
        except auto.CommandError as exc:
            raise ProvisionError(f"Pulumi could not open stack {name!r}: {_last_error_line(_command_text(exc))}") from None

    def _with_lock_recovery(self, stack: Any, events: ProvisionEvents, op: Callable[[], Any]) -> Any:
        """Run `op`; on a lock left by a dead process, `pulumi cancel` it and run `op` once more."""
        from pulumi import automation as auto

        try:
            return op()
        except auto.ConcurrentUpdateError as exc:
            text = _command_text(exc)
            stale, who = stale_pulumi_lock(text)
            if not stale:
                raise ClusterBusy(
                    f"stack {stack.name!r} is locked by {who}; wait for it, or if you are sure nothing runs, "
                    f"remove the lock with `pulumi cancel --yes -s {stack.name}`") from None
            events.message(f"removing a stale Pulumi lock on {stack.name} left by {who} (process gone)")
            stack.cancel()
            return op()

    # -- operations --------------------------------------------------------------------------------
    def up(self, spec: Any, events: ProvisionEvents | None = None) -> UpResult:
        """Create or update the cluster for `spec`; on failure or Ctrl-C destroy what was made, raise."""
        from pulumi import automation as auto

        events = events or NullEvents()
        runner = self.program_runner
        with owner_lock(spec.name, "up", run_id=spec.run_id):
            self._save_meta(spec)
            program = lambda: runner(spec)  # noqa: E731
            stack = self.stack(spec.name, program, create=False)
            existing = stack is not None and bool(stack.outputs())
            if stack is None:
                stack = self.stack(spec.name, program, create="new")
            bridge = EventBridge(events, spec)
            try:
                res = self._with_lock_recovery(
                    stack, events, lambda: stack.up(on_event=bridge, color="never", on_output=lambda line: None))
            except (KeyboardInterrupt, auto.CommandError) as exc:
                if existing:
                    # a cluster that was up before this call is not destroyed because an update failed
                    events.message(f"updating the existing cluster {spec.name} stopped; it was left as it is")
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    raise ProvisionError(
                        f"updating the existing cluster {spec.name!r} failed: "
                        f"{_last_error_line(_command_text(exc))}; it was left running",
                        hint=f"remove it with `gpucluster down {spec.name}`") from None
                with _teardown_shield():
                    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                    events.message(f"creating {spec.name} {why}: destroying what was created")
                    cleanup_errors = self._cleanup_after_failed_up(stack, events)
                if isinstance(exc, KeyboardInterrupt):
                    raise
                text = "\n".join([_command_text(exc), *bridge.diagnostics])
                raise self._up_error(spec, text, cleanup_errors) from None
        outputs = {k: v.value for k, v in res.outputs.items()}
        return UpResult(outputs, {k for k, v in res.outputs.items() if v.secret})

    def _cleanup_after_failed_up(self, stack: Any, events: ProvisionEvents) -> list[str]:
        try:
            return self._destroy_stack(stack, events)
        except GpuclusterError as exc:
            events.message(f"cleanup failed: {exc.message}")
            return [exc.message]

    def _up_error(self, spec: Any, text: str, cleanup_errors: list[str]) -> ProvisionError:
        cleanup = "what was created has been destroyed"
        if cleanup_errors:
            cleanup = (f"the cleanup did not finish ({cleanup_errors[0]}): run `gpucluster down {spec.name}` "
                       f"and `gpucluster gc --cloud {spec.cloud}`")
        cap = capacity_error(spec, text, self.zone_lister, cleanup=cleanup)
        if cap is not None:
            return cap
        precise = backend(spec.cloud).classify_failure(spec, text)  # gcp: a quota error
        if precise is not None:
            precise.message = f"creating cluster {spec.name!r} failed: {precise.message}; {cleanup}"
            precise.args = (precise.message,)
            return precise
        return ProvisionError(f"creating cluster {spec.name!r} failed: {_last_error_line(text)}; {cleanup}")

    def destroy(self, name: str, events: ProvisionEvents | None = None) -> bool:
        """Destroy the cluster's stack. False when there was no stack (already down).

        Raises ProvisionError when the destroy itself failed (the caller runs the leftover scan)."""
        events = events or NullEvents()
        with owner_lock(name, "down"):
            stack = self.stack(name, create=False)
            if stack is None:
                return False
            errors = self._destroy_stack(stack, events)
            if errors:
                raise ProvisionError(f"destroying {name!r} did not finish: {'; '.join(errors)}",
                                     hint=f"retry with `gpucluster down {name}`; `gpucluster gc` deletes by tag")
            return True

    def _destroy_stack(self, stack: Any, events: ProvisionEvents) -> list[str]:
        from pulumi import automation as auto

        errors: list[str] = []
        refresh_opts = {"color": "never"}
        if _supported(stack.refresh, "clear_pending_creates"):
            refresh_opts["clear_pending_creates"] = True
        try:
            self._with_lock_recovery(stack, events, lambda: stack.refresh(
                on_event=EventBridge(events, record=False), **refresh_opts))
        except auto.CommandError as exc:  # destroy may still work: go on
            events.message(f"refresh of {stack.name} failed, destroying anyway: "
                           f"{_last_error_line(_command_text(exc))}")
        destroy_opts = {"color": "never"}
        if _supported(stack.destroy, "continue_on_error"):
            destroy_opts["continue_on_error"] = True
        bridge = EventBridge(events)
        try:
            self._with_lock_recovery(stack, events, lambda: stack.destroy(on_event=bridge, **destroy_opts))
        except auto.CommandError as exc:
            errors.append(_last_error_line("\n".join([_command_text(exc), *bridge.diagnostics])))
            return errors
        with contextlib.suppress(auto.CommandError):
            stack.workspace.remove_stack(stack.name)
        return errors

    def outputs(self, name: str) -> dict[str, Any] | None:
        stack = self.stack(name, create=False)
        if stack is None:
            return None
        return {k: v.value for k, v in stack.outputs().items()}

    def list_stacks(self) -> dict[str, int | None]:
        """Stacks of the project in the backend -> resource count (None when unknown)."""
        from pulumi import automation as auto

        ws = auto.LocalWorkspace(**self._options("_list").__dict__)
        return {s.name.rsplit("/", 1)[-1]: s.resource_count for s in ws.list_stacks()}

    # -- what `up` was asked for, for `down`/`status`/leftovers in a later process ----------------
    @staticmethod
    def _save_meta(spec: Any) -> None:
        path = work_dir(spec.name) / "cluster.json"
        data = {"spec": spec.to_dict(), "saved_at": time.time(), "backend": backend_url()}
        path.write_text(json.dumps(data, indent=2, default=str))

    @staticmethod
    def read_meta(name: str) -> dict[str, Any] | None:
        from gpucluster.home import home_dir

        path = home_dir() / "pulumi" / "work" / name / "cluster.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
