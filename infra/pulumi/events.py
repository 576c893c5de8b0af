"""Pulumi engine events and errors, read for the ledger and for the user.

`EventBridge` turns engine events into `ProvisionEvents` (requested before, created after,
deleted), with each resource's ledger kind and cost detail from its backend (`pulumi_kinds`,
`resource_detail`). `capacity_error` turns a failed `up`'s text into a `CapacityError` naming the
zone and the next ones to try (the backend's `capacity_markers`, `capacity_zones`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pulumi.automation import DiagnosticEvent, EngineEvent, ResOutputsEvent, ResourcePreEvent

    from gpucluster.spec import ClusterSpec

from gpucluster.domain import ProvisionEvents
from gpucluster.errors import ProvisionError
from gpucluster.infra.pulumi.cloud import PulumiCloud

CREATE_OPS = ("create", "create-replacement", "replace")
DELETE_OPS = ("delete", "delete-replaced", "discard")


class CapacityError(ProvisionError):
    """The cloud had no capacity for the request in a zone; what was created has been destroyed."""

    cause = "capacity"

    def __init__(self, message: str, *, zone: str | None, suggested_zones: list[str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.zone = zone
        self.suggested_zones = suggested_zones


# -- engine events -> ProvisionEvents --------------------------------------------------------------
def _urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


class EventBridge:
    """`on_event` callback: resource pre/outputs events -> requested/created/deleted + messages.

    Runs on pulumi.automation's event thread: it never raises (errors are kept in `.errors`)."""

    def __init__(self, events: ProvisionEvents, provisioner: PulumiCloud, spec: ClusterSpec | None = None, *,
                 record: bool = True):
        """`provisioner`: the backend whose program runs (its `pulumi_kinds` and `resource_detail`)."""
        self.events, self.spec, self.record = events, spec, record
        self.kinds, self.detail = provisioner.pulumi_kinds, provisioner.resource_detail
        self.diagnostics: list[str] = []
        self.failed: list[str] = []
        self.errors: list[BaseException] = []
        self.requested: list[tuple[str, str]] = []
        self.created: list[tuple[str, str]] = []  # (type token, URN) of each resource this operation created

    def __call__(self, event: EngineEvent) -> None:
        try:
            self._handle(event)
        except Exception as exc:  # noqa: BLE001 - must not kill the event thread
            self.errors.append(exc)

    def _handle(self, ev: EngineEvent) -> None:
        if ev.resource_pre_event is not None and self.record:
            self._on_pre(ev.resource_pre_event)
        if ev.res_outputs_event is not None:
            self._on_outputs(ev.res_outputs_event)
        if ev.res_op_failed_event is not None:
            md = ev.res_op_failed_event.metadata
            self.failed.append(f"{md.op} {_urn_name(md.urn)} ({md.type})")
        if ev.diagnostic_event is not None and ev.diagnostic_event.severity in ("error", "warning"):
            self._on_diagnostic(ev.diagnostic_event)

    def _on_pre(self, pre: ResourcePreEvent) -> None:
        """A resource about to be created: requested, with its ledger kind and cost detail."""
        md = pre.metadata
        kind = self.kinds.get(md.type)
        if kind and not pre.planning and md.op in CREATE_OPS:
            name = _urn_name(md.urn)
            inputs = (md.new.inputs if md.new else None) or {}
            # a bridge without a spec (destroy's, refresh's) creates nothing: no detail to read from it
            detail = self.detail(kind, inputs or {}, self.spec) if self.spec is not None else {}
            self.events.resource_requested(kind, name, type=md.type, **detail)
            self.requested.append((kind, name))

    def _on_outputs(self, out: ResOutputsEvent) -> None:
        """A resource created or deleted: kept in `created`, and recorded as created / deleted."""
        md = out.metadata
        if md.op in CREATE_OPS:
            self.created.append((md.type, md.urn))
        if not self.record:
            return
        kind = self.kinds.get(md.type)
        if kind and md.op in CREATE_OPS:
            self.events.resource_created(kind, _urn_name(md.urn), (md.new.id if md.new else None) or None)
        elif kind and md.op in DELETE_OPS:
            self.events.resource_deleted(kind, _urn_name(md.urn), (md.old.id if md.old else None) or None)

    def _on_diagnostic(self, diag: DiagnosticEvent) -> None:
        text = (diag.message or "").strip()
        if text and diag.severity == "error":
            self.diagnostics.append(text)
            self.events.message(text)
        elif text:
            self.events.message(f"warning: {text}")


# -- error text -> what to tell the user ----------------------------------------------------------
def command_text(exc: BaseException) -> str:
    result = getattr(exc, "command_result", None) or getattr(exc, "result", None)
    if result is not None:
        return f"{getattr(result, 'stderr', '')}\n{getattr(result, 'stdout', '')}"
    return str(exc)


SUMMARY_LINES = ("error: update failed", "update failed", "error: preview failed", "error: destroy failed",
                 "error: refresh failed")


def last_error_line(text: str) -> str:
    """The last error line, skipping the stack's own summary (`error: update failed`), which the
    Pulumi CLI prints after the resource's diagnostic that says why."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.lower().startswith("error") or "error:" in ln.lower()]
    causes = [ln for ln in errs if ln.lower() not in SUMMARY_LINES]
    return (causes or errs or lines or ["(no output)"])[-1][:400]


def capacity_error(provisioner: PulumiCloud, spec: ClusterSpec, text: str, zone_lister: Callable[[str, str | None], list[str]] | None = None,
                   cleanup: str = "everything this attempt created was destroyed") -> CapacityError | None:
    """A CapacityError naming the zone and the next zones to try, if `text` is a capacity failure
    (one of the spec's backend's `capacity_markers`; the zones from its `capacity_zones`)."""
    marker = next((m for m in provisioner.capacity_markers if m.lower() in text.lower()), None)
    if marker is None:
        return None
    suggested: list[str]
    if provisioner.capacity_zones is None:
        zone, suggested, what = spec.zone, [], "the request"
    else:
        zone, suggested, what = provisioner.capacity_zones(spec, text, zone_lister)
    suggested = [z for z in dict.fromkeys(suggested) if z != zone]
    where = zone or "the requested zone"
    msg = f"no capacity for {what} in {where} right now ({marker}); {cleanup}"
    if suggested:
        hint = f"try the next zone: --zone {suggested[0]}" + (
            f" (other candidates: {', '.join(suggested[1:5])})" if len(suggested) > 1 else "")
    else:
        hint = "try another zone with --zone, another region with --region, or --spot/on-demand the other way"
    return CapacityError(msg, zone=zone, suggested_zones=suggested, hint=hint)
