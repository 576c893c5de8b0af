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

The Pulumi CLI and its state: `infra.pulumi.cli`; engine events and error text: `infra.pulumi.events`.
`pulumi.automation` is imported inside functions only: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Literal, TypeVar, overload

from gpucluster.domain import NullEvents, ProvisionEvents
from gpucluster.errors import ClusterBusy, GpuclusterError, ProvisionError, require  # noqa: F401 (ClusterBusy re-exported)
from gpucluster.infra.pulumi.cli import (PROJECT, backend_url, load_cli, stale_pulumi_lock, work_dir,
                                         workspace_env)
from gpucluster.infra.pulumi.state import secrets_provider
from gpucluster.infra.pulumi.cli import INSTALL_URL, MIN_PULUMI_VERSION, passphrase_file  # noqa: F401 - re-exported: doctor
from gpucluster.infra.pulumi.events import EventBridge, capacity_error, command_text, last_error_line
from gpucluster.infra.pulumi.cloud import PulumiCloud
from gpucluster.lifecycle.owner import owner as lock_owner  # noqa: F401 - re-exported: who owns a cluster
from gpucluster.lifecycle.owner import owner_lock
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from pulumi.automation import LocalWorkspaceOptions, PulumiCommand, Stack
    from pulumi.automation import UpResult as StackUpResult

T = TypeVar("T")


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


# -- the driver ------------------------------------------------------------------------------------
@dataclass
class UpResult:
    outputs: JsonObject  # plain values, secrets included
    secret_keys: set[str] = field(default_factory=set)


def default_program_runner(spec: ClusterSpec) -> None:
    from gpucluster.infra import program

    program.run(spec)


def _supported(method: Callable[..., object], option: str) -> bool:
    try:
        return option in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class PulumiDriver:
    """up / destroy / outputs / list over Pulumi stacks, one per cluster.

    `pulumi_command`: a `pulumi.automation.PulumiCommand` (default: the `pulumi` on PATH, checked
    to be at least MIN_PULUMI_VERSION); tests pass a recording fake. `program_runner(spec)`
    declares the resources (default `gpucluster.infra.program.run`)."""

    def __init__(self, *, pulumi_command: PulumiCommand | None = None,
                 program_runner: Callable[[ClusterSpec], object] | None = None,
                 zone_lister: Callable[[str, str | None], list[str]] | None = None,
                 provisioner: PulumiCloud | None = None):
        self._command = pulumi_command
        # the backend whose stacks this drives (engine events, capacity, failures); PulumiProvider sets it
        self.provisioner = provisioner
        self.program_runner = program_runner or default_program_runner
        self.zone_lister = zone_lister
        self.sleep: Callable[[float], None] = time.sleep  # between relaunches; tests pass a scaled clock's

    def _provisioner(self) -> PulumiCloud:
        if self.provisioner is None:
            raise RuntimeError("PulumiDriver has no provisioner: pass provisioner= (PulumiProvider does)")
        return self.provisioner

    @property
    def cli(self) -> PulumiCommand:
        self._command = load_cli(self._command)
        return self._command

    # -- stacks ------------------------------------------------------------------------------------
    def _options(self, name: str) -> LocalWorkspaceOptions:
        from pulumi.automation import LocalWorkspaceOptions, ProjectSettings

        return LocalWorkspaceOptions(
            work_dir=str(work_dir(name)),
            env_vars=workspace_env(),
            secrets_provider=secrets_provider(),  # passphrase, or a KMS key for a shared state
            project_settings=ProjectSettings(name=PROJECT, runtime="python"),
            pulumi_command=self.cli,
        )

    @overload
    def stack(self, name: str, program: Callable[[], None] | None = None, *, create: Literal["new"]) -> Stack: ...
    @overload
    def stack(self, name: str, program: Callable[[], None] | None = None, *, create: bool) -> Stack | None: ...

    def stack(self, name: str, program: Callable[[], None] | None = None, *, create: bool | str) -> Stack | None:
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
            raise ProvisionError(f"Pulumi could not open stack {name!r}: {last_error_line(command_text(exc))}") from None

    def _with_lock_recovery(self, stack: Stack, events: ProvisionEvents, op: Callable[[], T]) -> T:
        """Run `op`; on a lock left by a dead process, `pulumi cancel` it and run `op` once more."""
        from pulumi import automation as auto

        try:
            return op()
        except auto.ConcurrentUpdateError as exc:
            text = command_text(exc)
            stale, who = stale_pulumi_lock(text)
            if not stale:
                raise ClusterBusy(
                    f"stack {stack.name!r} is locked by {who}; wait for it, or if you are sure nothing runs, "
                    f"remove the lock with `pulumi cancel --yes -s {stack.name}`") from None
            events.message(f"removing a stale Pulumi lock on {stack.name} left by {who} (process gone)")
            stack.cancel()
            return op()

    # -- operations --------------------------------------------------------------------------------
    def up(self, spec: ClusterSpec, events: ProvisionEvents | None = None) -> UpResult:
        """Create or update the cluster for `spec`; on failure or Ctrl-C destroy what was made, raise."""
        from pulumi import automation as auto

        events = events or NullEvents()
        runner = self.program_runner
        with owner_lock(spec.name, "up", run_id=spec.run_id):
            self._save_meta(spec)
            def program() -> None:
                runner(spec)

            stack = self.stack(spec.name, program, create=False)
            existing = stack is not None and bool(stack.outputs())
            if stack is None:
                stack = self.stack(spec.name, program, create="new")
            if existing:
                # The state may name what is gone (a cluster deleted outside Pulumi, a failed destroy):
                # a refresh drops it, so the update recreates it rather than trusting the old state
                # (Pulumi docs, "pulumi refresh": the state is brought in line with what exists).
                self._refresh_before_up(stack, events)
            bridge = EventBridge(events, self._provisioner(), spec)
            try:
                res = self._up_relaunching(stack, spec, events, bridge)
            except (KeyboardInterrupt, auto.CommandError) as exc:
                if existing:
                    # a cluster that was up before this call is not destroyed because an update failed
                    events.message(f"updating the existing cluster {spec.name} stopped; it was left as it is")
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    raise ProvisionError(
                        f"updating the existing cluster {spec.name!r} failed: "
                        f"{last_error_line(command_text(exc))}; it was left running",
                        hint=f"remove it with `gpucluster down {spec.name}`") from None
                with _teardown_shield():
                    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                    events.message(f"creating {spec.name} {why}: destroying what was created")
                    cleanup_errors = self._cleanup_after_failed_up(stack, events)
                if isinstance(exc, KeyboardInterrupt):
                    raise
                text = "\n".join([command_text(exc), *bridge.diagnostics])
                raise self._up_error(spec, text, cleanup_errors) from None
        outputs = {k: v.value for k, v in res.outputs.items()}
        return UpResult(outputs, {k for k, v in res.outputs.items() if v.secret})

    def _up_relaunching(self, stack: Stack, spec: ClusterSpec, events: ProvisionEvents,
                        bridge: EventBridge) -> StackUpResult:
        """`pulumi up`; a launch the backend calls transient (`PulumiCloud.relaunch`) is replaced alone
        (`--replace` of the resources of that type this update created) after each of its
        `relaunch_delays`, the rest of the stack kept; a type of None: the same `up` again (what
        failed was never created: gcp's bucket binding of an account IAM does not show yet). The
        last failure is raised as it came."""
        from pulumi import automation as auto

        prov = self._provisioner()
        delays = list(prov.relaunch_delays)
        replace: list[str] = []
        while True:
            extra: JsonObject = {"replace": replace} if replace else {}
            try:
                return self._with_lock_recovery(stack, events, lambda: stack.up(
                    on_event=bridge, color="never", on_output=lambda line: None, **extra))
            except auto.CommandError as exc:
                text = "\n".join([command_text(exc), *bridge.diagnostics])
                found = prov.relaunch(spec, text) if prov.relaunch is not None else None
                urns = sorted({urn for typ, urn in bridge.created if found is not None and typ == found[0]})
                if found is None or (found[0] is not None and not urns) or not delays:
                    raise
                wait = delays.pop(0)
                done = len(prov.relaunch_delays) - len(delays)
                again = "launching it again" if found[0] is not None else "running the update again"
                events.message(f"{found[1]}: {again} in {wait:.0f} s (retry {done} of {len(prov.relaunch_delays)})")
                self.sleep(wait)
                replace = urns
                bridge.diagnostics.clear()

    def _refresh_before_up(self, stack: Stack, events: ProvisionEvents) -> None:
        from pulumi import automation as auto

        try:
            self._with_lock_recovery(stack, events, lambda: stack.refresh(
                on_event=EventBridge(events, self._provisioner(), record=False), color="never"))
        except auto.CommandError as exc:  # the update says what is wrong, if anything is
            events.message(f"refresh of {stack.name} before the update failed: {last_error_line(command_text(exc))}")

    def _cleanup_after_failed_up(self, stack: Stack, events: ProvisionEvents) -> list[str]:
        try:
            return self._destroy_stack(stack, events)
        except GpuclusterError as exc:
            events.message(f"cleanup failed: {exc.message}")
            return [exc.message]

    def _up_error(self, spec: ClusterSpec, text: str, cleanup_errors: list[str]) -> GpuclusterError:
        cleanup = "what was created has been destroyed"
        if cleanup_errors:
            cleanup = (f"the cleanup did not finish ({cleanup_errors[0]}): run `gpucluster down {spec.name}` "
                       f"and `gpucluster gc --cloud {spec.cloud}`")
        cap = capacity_error(self._provisioner(), spec, text, self.zone_lister, cleanup=cleanup)
        if cap is not None:
            return cap
        precise = self._provisioner().classify_failure(spec, text)  # gcp: a quota error
        if precise is not None:
            precise.message = f"creating cluster {spec.name!r} failed: {precise.message}; {cleanup}"
            precise.args = (precise.message,)
            return precise
        return ProvisionError(f"creating cluster {spec.name!r} failed: {last_error_line(text)}; {cleanup}")

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

    def _destroy_stack(self, stack: Stack, events: ProvisionEvents) -> list[str]:
        from pulumi import automation as auto

        errors: list[str] = []
        refresh_opts: JsonObject = {"color": "never"}
        if _supported(stack.refresh, "clear_pending_creates"):
            refresh_opts["clear_pending_creates"] = True
        try:
            self._with_lock_recovery(stack, events, lambda: stack.refresh(
                on_event=EventBridge(events, self._provisioner(), record=False), **refresh_opts))
        except auto.CommandError as exc:  # destroy may still work: go on
            events.message(f"refresh of {stack.name} failed, destroying anyway: "
                           f"{last_error_line(command_text(exc))}")
        destroy_opts: JsonObject = {"color": "never"}
        if _supported(stack.destroy, "continue_on_error"):
            destroy_opts["continue_on_error"] = True
        bridge = EventBridge(events, self._provisioner())
        try:
            self._with_lock_recovery(stack, events, lambda: stack.destroy(on_event=bridge, **destroy_opts))
        except auto.CommandError as exc:
            errors.append(last_error_line("\n".join([command_text(exc), *bridge.diagnostics])))
            return errors
        with contextlib.suppress(auto.CommandError):
            stack.workspace.remove_stack(stack.name)
        return errors

    def outputs(self, name: str) -> JsonObject | None:
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
    def _save_meta(spec: ClusterSpec) -> None:
        path = work_dir(spec.name) / "cluster.json"
        data = {"spec": spec.to_dict(), "saved_at": time.time(), "backend": backend_url()}
        path.write_text(json.dumps(data, indent=2, default=str))

    @staticmethod
    def read_meta(name: str) -> JsonObject | None:
        from gpucluster.home import home_dir

        path = home_dir() / "pulumi" / "work" / name / "cluster.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
