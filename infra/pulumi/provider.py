"""`PulumiProvider`: the Provider contract for the cloud backends (aws, gcp) on top of
`infra.pulumi.engine` (Pulumi) and `infra.leftovers` (the tag scan).

- `up(spec, events)`: `pulumi up` of the cluster's stack; the outputs become a `Cluster`
  (nodes head first, pinned host keys, the SSH key and kubeconfig as secrets).
- `down(name, events)`: robust destroy of our own stack (one another owner made is refused unless
  `--any-owner`); then the tag scan; whatever the scan still finds for this cluster *that is ours*
  is deleted by tag and checked again, while another owner's resources under the same name are
  said and left alone. Raises `TeardownIncomplete` naming what is left (and the command to
  finish) when something of ours survives both, or when the destroy failed.
- `leftovers(name, run_id) -> Check`: the tag scan, in the region/project the cluster was created
  in (as recorded), with every check that could not run; what is not ours (`Ownership`: another
  owner's, a standalone stack's) is in `Check.not_ours`, never in the verdict.
- `preflight(spec)`: also refuses a name another owner's cluster holds there (exit 2); what a destroy
  left of our own under the name with a project-wide id (gcp: the pods' service account) and no
  stack to update it is removed by `up` before Pulumi runs (`_remove_orphans`).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Callable

from gpucluster.errors import (GpuclusterError, MissingDependency, ProvisionError, TeardownIncomplete, UsageError,
                               not_allowed)
from gpucluster.infra.pulumi.engine import ClusterBusy, PulumiDriver
from gpucluster.infra.pulumi.events import CapacityError
from gpucluster.infra.contract import Plugin
from gpucluster.infra.pulumi.cloud import pulumi_cloud
from gpucluster.domain import Check, Cluster, Leftover, NullEvents, Provider, ProvisionEvents
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.ownership import Ownership
    from gpucluster.spec import ClusterSpec

GLOBAL = "global"  # a leftover's region when its name is unique account- or project-wide (not per region)


class _Poll(Enum):
    """Where the wait for the terminated nodes stands after one poll."""

    AGAIN = "again"  # look again at once (the nodes were just told to terminate)
    WAIT = "wait"  # look again after poll_seconds
    DONE = "done"  # stop waiting: the destroy follows


class _Tracking:
    """ProvisionEvents proxy remembering what was requested and not yet reported deleted, so a
    teardown verified by the tag scan can confirm the rest gone (creates that failed, pending
    creates that `refresh --clear-pending-creates` dropped)."""

    def __init__(self, events: ProvisionEvents, open_: dict[tuple[str, str], str | None],
                 extra: JsonObject | None = None):
        self.events, self.open = events, open_
        self.extra = dict(extra or {})  # e.g. {"attempt": 2, "zone": "us-east-1b"}: kept with each request

    def resource_requested(self, kind: str, name: str, **detail: object) -> None:
        self.open[(kind, name)] = None
        self.events.resource_requested(kind, name, **{**self.extra, **detail})

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: object) -> None:
        self.open[(kind, name)] = cloud_id
        self.events.resource_created(kind, name, cloud_id, **detail)

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        self.open.pop((kind, name), None)
        self.events.resource_deleted(kind, name, cloud_id)

    def message(self, text: str) -> None:
        self.events.message(text)

    def confirm_rest_gone(self) -> None:
        for (kind, name), cloud_id in list(self.open.items()):
            self.resource_deleted(kind, name, cloud_id)


class PulumiProvider(Provider):
    """Provider for `aws` and `gcp`. `driver`, `find` and `delete` are injectable for tests."""

    def __init__(self, plugin: Plugin, *, driver: PulumiDriver | None = None,
                 find: Callable[..., Check | list[Leftover]] | None = None,
                 delete: Callable[[list[Leftover]], list[str]] | None = None,
                 scan_options: JsonObject | None = None, capacity_attempts: int | None = None,
                 credentials: Callable[[str | None], list[JsonObject]] | None = None,
                 cloud_checks: Callable[[ClusterSpec], None] | None = None, ownership: Ownership | None = None,
                 terminate: Callable[[list[Leftover]], list[str]] | None = None):
        self.plugin = plugin
        self._ownership = ownership  # gpucluster.ownership.Ownership: what is ours to delete (default: this home's)
        self.provisioner = pulumi_cloud(plugin)  # the engine's part of the backend (infra/pulumi/cloud.py)
        self.cloud = plugin.name
        # the backend's checks of a spec against the cloud (aws: quota, AMI, a launch dry run); a
        # test's stand-in account passes its own
        self._cloud_checks = cloud_checks if cloud_checks is not None else self.provisioner.preflight
        self.driver = driver or PulumiDriver()
        self.driver.provisioner = self.provisioner  # the driver drives this backend's stacks
        self._find = find
        self._delete = delete
        self._terminate = terminate  # `_terminate_nodes_first`: none by default where `delete` is a test's
        # the credential checks, (region) -> checks: the backend's own (`PulumiCloud.credentials`), else its
        # doctor checks; a test's stand-in account passes its own
        self._credentials = credentials or self._backend_credentials
        self.scan_options = dict(scan_options or {})
        self._scopes: dict[str, JsonObject] = {}  # where each cluster's leftovers are scanned
        self._looked: set[str] = set()  # clusters whose stack outputs were read for where they are
        self._open: dict[str, dict[tuple[str, str], str | None]] = {}
        self._prechecked: dict[str, Check] = {}  # the preflight's scan of a name, for `up` to act on
        # attempts on capacity errors, each in the next zone offering the type: the cloud's
        # backend says how many (`capacity_attempts`; 1 = no retry)
        if capacity_attempts is None:
            capacity_attempts = self.provisioner.capacity_attempts
        self.capacity_attempts = max(1, int(capacity_attempts))
        # how long `down` waits for resources the cloud is already deleting (GKE STOPPING: minutes)
        self.await_seconds = float(self.scan_options.pop("await_seconds", 1800))
        self.poll_seconds = float(self.scan_options.pop("poll_seconds", 15))
        self._clock, self._sleep = self.scan_options.pop("clock", None), self.scan_options.pop("sleep", None)

    def preflight(self, spec: ClusterSpec | None = None) -> str | None:
        """Fail fast, before a ledger row or a question: the Pulumi CLI (present, new enough), the
        state directory with its passphrase, then (given the spec) the backend's own checks against
        the cloud (aws: `infra/aws/preflight.py`). Returns the state's URL as checked (an s3:// one
        with the bucket's region `check_state_region` found), for the ledger row."""
        from gpucluster.infra.pulumi.cli import backend_url, passphrase_file
        from gpucluster.infra.pulumi.state import check_secrets, check_state_region

        backend_url()
        check_secrets()  # shared state: a passphrase the team shares (environment) or a KMS key
        check_state_region()  # an s3:// state without ?region=: its bucket's region, or the fix
        self.driver.cli  # noqa: B018 - loads and checks the CLI
        passphrase_file()
        if spec is not None and self._cloud_checks is not None:
            # the backend's checks start with its credentials, in the spec's region (aws: STS there):
            # asked once, and not again for a default region
            self._cloud_checks(spec)
        else:
            self.check_credentials(spec.region if spec is not None else None)
        if spec is not None:
            self.check_name_free(spec)
        return backend_url()

    # -- whose resources -------------------------------------------------------------------------
    @property
    def ownership(self) -> Ownership:
        if self._ownership is None:
            from gpucluster.ownership import Ownership

            self._ownership = Ownership.here()
        return self._ownership

    def set_ownership(self, ownership: Ownership) -> None:
        self._ownership = ownership

    def set_project(self, project: str) -> None:
        self.scan_options["project"] = project

    def scoped(self, *, ownership: Ownership | None = None, project: str | None = None) -> "PulumiProvider":
        """This provider with `down`'s scope (`LaunchOptions.ownership`, `project`), as its backend's `make` gives
        it: whose resources its delete and scan may count (None: this home's owner) and the account they are in."""
        if ownership is not None:
            self.set_ownership(ownership)
        if project:
            self.set_project(project)
        return self

    def check_name_free(self, spec: ClusterSpec) -> None:
        """A name another owner's cluster (or a standalone stack) already holds in this account's
        region, or this project's zone, is refused before anything is recorded: exit 2, naming that
        owner as its tags record it. A scan that cannot run refuses nothing (the run's own checks say
        why soon enough); resources of ours under the name are `up`'s to update, or to remove first
        when no stack holds them (`_remove_orphans`)."""
        from gpucluster.ownership import describe_owner

        self._remember(spec.name, spec.to_dict())
        try:
            check = self.leftovers(spec.name)
        except GpuclusterError:
            return
        self._prechecked[spec.name] = check
        where = {spec.region, spec.zone} - {None}
        # "global": a name that is unique in the whole account or project, whatever the zone (the
        # pods' Google service account, one ID per cluster name): held there, it is held everywhere
        held = sorted((lo for lo in check.not_ours if lo.region in where or lo.region == GLOBAL),
                      key=lambda lo: lo.region == GLOBAL)
        if held:
            lo = held[0]
            whose = f"standalone stack {lo.stack}" if lo.stack else describe_owner(lo)
            project = self.provisioner.scan_scope(spec.to_dict()).project
            place = lo.region if lo.region != GLOBAL else f"project {project}" if project else "the account"
            raise UsageError(f"cluster name {spec.name!r} is already held in {place} by another owner ({whose}; "
                             f"{len(held)} resource(s), e.g. {lo.kind} {lo.id}): choose another --name, or leave "
                             "--name out for your own default name")

    def _backend_credentials(self, region: str | None = None) -> list[JsonObject]:
        own = self.provisioner.credentials
        return own(region) if own is not None else self.plugin.ops.doctor(None, None, False)

    def check_credentials(self, region: str | None = None) -> None:
        """The cloud's credentials (aws: STS GetCallerIdentity in `region`; gcp: application-default
        credentials), before anything is recorded: a command without them could create nothing,
        and its teardown could not be verified (exit 3). Only the credential checks decide here
        (quota and the like are `gpucluster doctor`'s)."""
        for c in self._credentials(region):
            if c.get("ok") is False and "credentials" in str(c.get("check", "")):
                fix = c.get("fix") or f"see `gpucluster doctor --cloud {self.cloud}`"
                raise UsageError(f"{c['check']}: {c['detail']}; nothing was started: {fix}")

    # -- Provider ------------------------------------------------------------------------------
    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        if spec.cloud != self.cloud:
            raise UsageError(f"the {self.cloud} provider cannot create a {spec.cloud!r} cluster")
        self._remember(spec.name, spec.to_dict())
        tried: list[str] = []
        attempt = 1
        self._remove_orphans(spec.name, events)
        while True:
            extra = {"attempt": attempt, "zone": spec.zone} if self.capacity_attempts > 1 else {}
            tracked = _Tracking(events, self._open.setdefault(spec.name, {}), extra)
            try:
                result = self.driver.up(spec, tracked)
            except (GpuclusterError, KeyboardInterrupt) as exc:
                # the driver destroyed what it made; what the scan no longer finds is confirmed gone
                gone = False
                try:
                    if self.leftovers(spec.name).verified:
                        tracked.confirm_rest_gone()
                        gone = True
                except Exception:  # noqa: BLE001 - the check is best effort here; `down` checks again
                    pass
                pinned = self.provisioner.zone_pinned(spec) if self.provisioner.zone_pinned is not None else None
                if isinstance(exc, CapacityError) and pinned:  # no other zone: say so, and what would move it
                    exc.message = f"{exc.message}; no other zone was tried: {pinned.split(':', 1)[0]}"
                    exc.args = (exc.message,)
                    exc.hint = pinned.split(": ", 1)[-1]
                    exc.suggested_zones = []
                    raise
                if not isinstance(exc, CapacityError) or not gone or attempt >= self.capacity_attempts:
                    raise
                tried.append(exc.zone or spec.zone or "?")
                nxt = [z for z in exc.suggested_zones if z not in tried]
                if not nxt:
                    raise
                events.message(f"attempt {attempt} of {self.capacity_attempts}: {exc.message}; "
                               f"retrying in {nxt[0]}")
                spec = spec.replace(zone=nxt[0])
                attempt += 1
                continue
            cluster = self.provisioner.cluster_from_outputs(result.outputs)
            if self.provisioner.after_up is not None:  # the stack is up: an error here is the caller's to tear down
                self.provisioner.after_up(spec, cluster, events)
            return cluster

    def _remove_orphans(self, name: str, events: ProvisionEvents) -> None:
        """Before the create: what a destroy left of an earlier cluster of ours under this name whose
        own name is unique in the whole project (region GLOBAL: the pods' Google service account,
        `gpuc-<name>`) is removed first, with a line saying so, as `gpucluster down NAME` would remove
        it: the program would create it again under the same id, which IAM refuses (409
        ALREADY_EXISTS, projects.serviceAccounts.create) and the program does not adopt. Only when no
        cluster of ours holds the name (no regional leftover) and no Pulumi stack of that name exists
        (a stack's own resources are its update's). A removal that fails stops here, before Pulumi runs,
        naming what is left and the command that removes it. Acts on the preflight's scan
        (`check_name_free`): without one (a recovery attempt, whose previous teardown was verified
        before it could start) nothing is scanned here."""
        check = self._prechecked.pop(name, None)
        if check is None:
            return
        orphans = [lo for lo in check.leftovers if lo.region == GLOBAL and not lo.deleting]
        if not orphans or any(lo.region != GLOBAL for lo in check.leftovers):
            return
        try:
            if self.driver.outputs(name) is not None:
                return
        except Exception:  # noqa: BLE001 - no Pulumi CLI, a locked stack: `up` itself says so
            return
        for lo in orphans:
            events.message(f"{lo.kind} {lo.id} ({lo.detail}) is left from an earlier cluster {name} that is gone (no "
                           f"cluster, no Pulumi stack): removing it first, as `gpucluster down {name}` would; its "
                           "name is unique in the project, so creating it again would be refused")
        errors = self._delete_fn()(orphans)
        if errors:
            raise ProvisionError(f"cannot remove what an earlier cluster {name!r} left ({errors[0]}); nothing was "
                                 "created", hint=f"remove it with `gpucluster down {name}`, then try again")

    def down(self, name: str, events: ProvisionEvents | None = None) -> None:
        """Destroy, then delete by tag whatever the scan still finds. Raises `TeardownIncomplete`
        when anything was found and survived, *or* when `pulumi destroy` itself failed: a failed
        destroy is always reported, and what it was deleting is never marked gone on the strength of
        a tag scan alone (the scan covers listed resource types only)."""
        events = _Tracking(events or NullEvents(), self._open.setdefault(name, {}))
        self._remember_region(name)
        self._refuse_foreign_stack(name)
        self._terminate_nodes_first(name, events)
        destroy_error = self._destroy(name, events)
        check = self._delete_by_tag(name, events)
        if (destroy_error is not None and not isinstance(destroy_error, MissingDependency) and not check.leftovers
                and not check.unchecked):
            destroy_error = self._destroy_again(name, events, destroy_error)
        self._refuse_incomplete(name, check, destroy_error)
        # Pulumi deleted every resource of the stack: those are confirmed gone. Whether anything
        # else is left (or could not be checked) is the caller's independent check.
        events.confirm_rest_gone()

    def _destroy(self, name: str, events: ProvisionEvents) -> GpuclusterError | None:
        """`pulumi destroy` of the stack: None when it worked (or there was none), else why it failed
        (no Pulumi CLI here: the tag scan still works). A busy cluster is the caller's error."""
        try:
            if self.driver.destroy(name, events):
                from gpucluster.infra.pulumi.cli import backend_url

                events.message(f"Pulumi destroyed stack {name} (state {backend_url()})")
        except ClusterBusy:
            raise  # someone is using it: no scan from under them
        except MissingDependency as exc:  # no Pulumi CLI here: the tag scan still works
            events.message(f"cannot run Pulumi ({exc.message.split(';')[0]}); deleting by tag instead")
            return exc
        except ProvisionError as exc:
            events.message(f"{exc.message}; deleting what is left by tag")
            return exc
        return None

    def _delete_by_tag(self, name: str, events: ProvisionEvents) -> Check:
        """The tag scan after the destroy; what it still finds of ours is deleted by tag and checked again."""
        check = self._await_deleting(name, self.leftovers(name), events)
        for line in _not_ours_lines(check):
            events.message(f"left alone: {line}")
        if check.leftovers:
            events.message(f"{len(check.leftovers)} resource(s) tagged gpucluster-cluster={name} still exist: "
                           "deleting by tag")
            errors = self._delete_fn()([lo for lo in check.leftovers if not lo.deleting])
            for err in errors:
                events.message(f"could not delete {err}")
            check = self._await_deleting(name, self.leftovers(name), events)
        return check

    def _refuse_incomplete(self, name: str, check: Check, destroy_error: GpuclusterError | None) -> None:
        """`TeardownIncomplete` when something survived (still being deleted, or not) or the destroy failed."""
        hint = f"run `gpucluster down {name}` again, or `gpucluster gc --cloud {self.cloud}`"
        left = check.leftovers
        if left and all(lo.deleting for lo in left):
            shown = ", ".join(f"{lo.kind} {lo.id} ({lo.detail})" for lo in left[:6])
            raise TeardownIncomplete(
                f"cluster {name!r}: {shown} still being deleted after {self.await_seconds:.0f} s",
                hint=f"the cloud is still deleting it; check again with `gpucluster down {name}`")
        if left:
            shown = ", ".join(f"{lo.kind} {lo.id}" for lo in left[:6]) + (" ..." if len(left) > 6 else "")
            raise TeardownIncomplete(
                f"cluster {name!r} is not fully gone: {shown} still exist"
                + (f" ({destroy_error.message})" if destroy_error else ""), hint=hint)
        if destroy_error is not None:
            found = ("the tag check found nothing, but it could not run everywhere"
                     if check.unchecked else "the tag check found nothing")
            raise TeardownIncomplete(
                f"destroying cluster {name!r} failed ({destroy_error.message.split(';')[0]}); {found}, so what "
                "Pulumi was deleting stays 'not confirmed gone'", hint=hint)

    def _terminate_nodes_first(self, name: str, events: ProvisionEvents) -> None:
        """Before `pulumi destroy`: terminate the cluster's machines of ours (the backend's
        `terminate_kinds`) and wait, bounded by `await_seconds` with a line each poll, until the tag
        scan no longer finds them. An AWS instant fleet's delete does not wait for its nodes
        (terraform-provider-aws ec2_fleet.go, resourceFleetDelete), and EC2 refuses to delete their
        placement group, security group and subnet while they shut down (a minute or two). Under the
        owner lock (ClusterBusy before any scan); a scan or terminate that fails, or a wait that runs
        out, leaves the rest to the destroy and the checks after it."""
        import time as _time

        from gpucluster.lifecycle.owner import owner_lock

        kinds, terminate = self.provisioner.terminate_kinds, self._terminate_fn()
        clock, sleep = self._clock or _time.monotonic, self._sleep or _time.sleep
        if not kinds or terminate is None:
            return
        with owner_lock(name, "down"):
            start, first = clock(), True
            while True:
                try:
                    left = [lo for lo in self.leftovers(name).leftovers if lo.kind in kinds]
                except GpuclusterError:
                    return
                step = self._terminate_poll(name, events, left, first, terminate, clock, start)
                if step is _Poll.DONE:
                    return
                if step is _Poll.WAIT:
                    sleep(self.poll_seconds)
                first = False

    def _terminate_poll(self, name: str, events: ProvisionEvents, left: list[Leftover], first: bool,
                        terminate: Callable[[list[Leftover]], list[str]], clock: Callable[[], float],
                        start: float) -> _Poll:
        """One poll of `_terminate_nodes_first`: on the first, terminate what is live (AGAIN: look at once;
        DONE when a terminate failed); then DONE once nothing is left or the wait ran out, else WAIT."""
        live = [lo for lo in left if not lo.deleting]
        if first and live:
            events.message(f"terminating {len(live)} node(s) of {name} and waiting for them before the stack "
                           "is destroyed: the placement group and security group cannot be deleted while "
                           "they shut down")
            errors = terminate(live)
            for err in errors:
                events.message(f"could not terminate {err}")
            # nothing to wait for after a failure: the destroy and the checks after it say what is left
            return _Poll.DONE if errors else _Poll.AGAIN
        if not left or clock() - start >= self.await_seconds:
            if left or not first:
                events.message(f"{len(left)} node(s) of {name} still not terminated after "
                               f"{self.await_seconds:.0f} s; destroying anyway" if left else
                               f"the node(s) of {name} terminated after {clock() - start:.0f} s")
            return _Poll.DONE
        states = ", ".join(f"{lo.id} {lo.detail.split(' cluster=')[0]}" for lo in left[:3])
        events.message(f"waiting for {len(left)} node(s) to terminate ({states}), "
                       f"{clock() - start:.0f} s of at most {self.await_seconds:.0f} s")
        return _Poll.WAIT

    def _destroy_again(self, name: str, events: ProvisionEvents, first: GpuclusterError) -> GpuclusterError | None:
        """The destroy failed, the delete by tag then left nothing the check (run everywhere) finds:
        destroy once more, so the stack's own record confirms it. None when that worked."""
        events.message("the tag check finds nothing left: destroying the stack again to confirm it")
        try:
            self.driver.destroy(name, events)
        except ClusterBusy:
            raise
        except GpuclusterError as exc:
            events.message(f"the second destroy failed too: {exc.message}")
            return first
        return None

    def _await_deleting(self, name: str, check: Check, events: ProvisionEvents) -> Check:
        """While every leftover is one the cloud is already deleting, poll (bounded by `await_seconds`,
        with a progress message each poll) until they are gone; the last check is returned."""
        import time as _time

        clock, sleep = self._clock or _time.monotonic, self._sleep or _time.sleep
        start = clock()
        while check.leftovers and all(lo.deleting for lo in check.leftovers) and clock() - start < self.await_seconds:
            left = check.leftovers
            events.message(f"waiting for {len(left)} resource(s) the cloud is deleting "
                           f"({', '.join(f'{lo.kind} {lo.detail}' for lo in left[:3])}), "
                           f"{clock() - start:.0f} s of at most {self.await_seconds:.0f} s")
            sleep(self.poll_seconds)
            check = self.leftovers(name)
        return check

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        """What the tag scan finds under `name`: ours in `leftovers` (the verdict), the rest (another
        owner's, a standalone stack's) in `not_ours`, never touched."""
        self._remember_region(name)
        opts = dict(self.scan_options)
        for key, value in self._scopes.get(name, {}).items():
            opts.setdefault(key, value)
        opts.setdefault("owner", self.ownership.scan_owner)
        check = Check.of(self._find_fn()(self.cloud, name=name, run_id=run_id, **opts))
        ours, rest = self.ownership.split(check.leftovers)
        return Check(tuple(ours), check.unchecked, check.not_ours + tuple(rest))

    def _refuse_foreign_stack(self, name: str) -> None:
        """A stack another owner made (its outputs carry the owner marks, `infra.program.run`), found
        in a shared state, is not destroyed from here without `--any-owner`."""
        if self.ownership.any_owner:
            return
        try:
            marks = dict((self.driver.outputs(name) or {}).get("gpucluster_marks") or {})
        except Exception:  # noqa: BLE001 - no stack, no CLI, a lock: destroy reports those itself
            return
        owner = marks.get("gpucluster-owner")
        if owner and owner != self.ownership.owner:
            from gpucluster.ownership import STACK_TAG

            who = f"{marks.get('gpucluster-user', '?')}@{marks.get('gpucluster-host', '?')}"
            what = f"standalone stack {marks[STACK_TAG]}" if marks.get(STACK_TAG) else f"stack {name}"
            raise UsageError(f"{what} was made by another owner ({owner}, {who}); nothing was deleted (to destroy "
                             f"it anyway: gpucluster down {name} --any-owner)")

    def attach(self, name: str) -> Cluster | None:
        """From the stack's outputs, secrets included (the SSH key, the kubeconfig): `exec`, `ssh`."""
        outputs = self.driver.outputs(name)
        return None if outputs is None else self.provisioner.cluster_from_outputs(outputs)

    # -- helpers -----------------------------------------------------------------------------------
    def _remember(self, name: str, spec: JsonObject | None) -> None:
        scope = self.provisioner.scan_scope(spec)
        if scope.regions or scope.project:
            self._scopes[name] = {"regions": list(scope.regions)} if scope.regions else {"project": scope.project}

    def _remember_region(self, name: str) -> None:
        if name not in self._scopes:
            self._remember(name, (self.driver.read_meta(name) or {}).get("spec"))
        if name not in self._scopes and name not in self._looked:  # made elsewhere (a shared state): where
            self._looked.add(name)                                   # its stack's outputs say it is
            try:
                outputs = self.driver.outputs(name) or {}
            except Exception:  # noqa: BLE001 - no CLI or no stack: the scan looks in the default place
                outputs = {}
            if outputs.get("region") or outputs.get("project"):
                self._remember(name, {"region": outputs.get("region"), "project": outputs.get("project"),
                                      "zone": outputs.get("zone")})

    def _find_fn(self):
        if self._find is None:
            from gpucluster.infra.leftovers import find_leftovers, scope_of

            def find(cloud: str, name: str | None = None, run_id: str | None = None, **opts: object) -> Check:
                return find_leftovers(self.provisioner, name, run_id, scope=scope_of(opts))

            self._find = find
        return self._find

    def _terminate_fn(self) -> Callable[[list[Leftover]], list[str]] | None:
        if self._terminate is None and self._delete is None and self.provisioner.terminate is not None:
            from gpucluster.infra.leftovers import scope_of

            stop = self.provisioner.terminate
            self._terminate = lambda nodes: stop(nodes, scope_of(self.scan_options))
        return self._terminate

    def _delete_fn(self):
        if self._delete is None:
            from gpucluster.infra.leftovers import delete_leftovers, scope_of

            scope = scope_of(self.scan_options)
            self._delete = lambda left: delete_leftovers(self.provisioner, left, scope)
        return self._delete


def _not_ours_lines(check: Check) -> list[str]:
    from gpucluster.ownership import not_ours_line

    return [not_ours_line(lo) for lo in check.not_ours]
