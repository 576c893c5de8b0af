"""What providers and launchers report while a run happens: one protocol, declared once.

A provider reports the resources it asks a cloud for (`ProvisionEvents`); a launcher reports those
too (the ssh launcher's per-node working folders) and, on top, each node's process
(`on_spawn`), its output lines and metric records, the phase the job is in, and transient status
(`progress`, e.g. waiting for nodes): `RunEvents`. The lifecycle's sink writes them to the ledger
and shows them; nothing finds an event method by probing: every method here is always there
(`NullEvents` drops them all, and a test's recorder subclasses it).

Phases are the `Phase` enum, str-valued, so the ledger, `show` and `--json` keep their strings.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpucluster.states import JsonObject  # states imports this module at run time


class Phase(str, enum.Enum):
    """The phases of a run, in the order they happen (some are skipped: check, stage, setup, outputs).

    What `enum.StrEnum` is on 3.11+, written out so Python 3.10 (which lacks it) imports this:
    `str()` and f-strings give the value."""

    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    PREPARE = "prepare"
    PROVISION = "provision"
    READY = "ready"
    CHECK = "check"  # the health check of every node (gpucluster/watch/health.py), before the job
    STAGE = "stage"
    SETUP = "setup"
    RENDEZVOUS = "rendezvous"
    TRAIN = "train"
    OUTPUTS = "outputs"
    TEARDOWN = "teardown"


class ProvisionEvents(Protocol):
    """What a provider reports: each resource requested (before the request), created (after it)
    and deleted, and messages for the user."""

    def resource_requested(self, kind: str, name: str, **detail: object) -> None: ...

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: object) -> None: ...

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None: ...

    def message(self, text: str) -> None: ...


class RunEvents(ProvisionEvents, Protocol):
    """What a launcher reports: resource rows (as a provider does), each node's process, its lines
    and metric records, the run's phase, and transient status."""

    def on_spawn(self, node_rank: int, kind: str, ident: str) -> None: ...

    def on_line(self, node_rank: int, line: str) -> None: ...

    def on_metric(self, node_rank: int | None, record: JsonObject) -> None: ...

    def on_phase(self, phase: Phase) -> None: ...

    def progress(self, text: str) -> None: ...

    def accrued_cost(self) -> float | None:
        """What the run has cost so far, in USD (the report's computation); None where not priced."""
        ...


class NullEvents:
    """Drops every event (providers used standalone; a test's recorder subclasses it and keeps
    what it looks at)."""

    def resource_requested(self, kind: str, name: str, **detail: object) -> None:
        pass

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: object) -> None:
        pass

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def on_spawn(self, node_rank: int, kind: str, ident: str) -> None:
        pass

    def on_line(self, node_rank: int, line: str) -> None:
        pass

    def on_metric(self, node_rank: int | None, record: JsonObject) -> None:
        pass

    def on_phase(self, phase: Phase) -> None:
        pass

    def progress(self, text: str) -> None:
        pass

    def accrued_cost(self) -> float | None:
        return None
