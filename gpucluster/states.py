"""The values a run's state columns take, as enums (issue 39 item 3): a run's status, a phase's
status, the teardown verdict and a node's output verdict. The phases themselves are
`gpucluster.events.Phase` (re-exported here). And where a run's outputs go (`OutputDest`: a local
folder, `s3://` or `gs://`), classified once instead of by looking for "://" in a string.

Each is a `str` too, with exactly the string the ledger stores and `--json` prints, so SQLite rows,
JSON output and comparisons with stored strings stay what they were: `RunStatus.SUCCEEDED ==
"succeeded"`, `json.dumps(RunStatus.SUCCEEDED) == '"succeeded"'`, and `str()` and f-strings give the
value (what `enum.StrEnum` does on 3.11+, written out for Python 3.10). Records read from the ledger
(`gpucluster.ledger.records`) hold the members; code past them compares with the members.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, TypeVar

from gpucluster.events import Phase

__all__ = ["DestKind", "JsonMapping", "JsonObject", "OutputDest", "OutputVerdict", "Phase", "PhaseStatus", "RunStatus", "StrEnum", "TeardownVerdict",
           "parse"]

# Any: a JSON object as its writer made it (a ledger JSON column, a metric record, a price snapshot,
# a stack's outputs): readers look keys up; its shape is the writer's, not a type of this package
JsonObject = dict[str, Any]
# the same, read only (a reader that must not change what it was given)
JsonMapping = Mapping[str, Any]


class StrEnum(str, enum.Enum):
    """A str-valued enum whose `str()` and format are its value."""

    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class RunStatus(StrEnum):
    """A run's status (the `runs.status` column)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # at its --max-cost (gpucluster/costing/guards.py)


class PhaseStatus(StrEnum):
    """How a phase ended (the `phases.status` column; NULL while it runs)."""

    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class TeardownVerdict(StrEnum):
    """What the independent check after teardown found (the `runs.teardown` column; NULL when
    nothing was checked). `gpucluster.domain.Check.verdict` gives the first three."""

    VERIFIED = "verified"  # every check ran and found nothing
    LEFTOVERS = "leftovers"  # something was found still existing
    NOT_VERIFIED = "not verified"  # nothing found, but at least one check could not run
    KEPT = "kept"  # the cluster was left up on purpose (`up`, `run --keep`)


class OutputVerdict(StrEnum):
    """How a node's output folder came back (the `outputs.verdict` column)."""

    COMPLETE = "complete"
    PARTIAL = "partial"
    FAILED = "failed"


E = TypeVar("E", bound=StrEnum)


def parse(kind: type[E], value: str | None) -> E | None:
    """`value` as a member of `kind` (None stays None); a value the enum lacks raises ValueError."""
    return None if value is None else kind(value)


class DestKind(StrEnum):
    """What `--output` names: a folder on this machine, or a bucket the nodes upload to."""

    LOCAL = "local"  # each node's folder is copied back here before teardown
    S3 = "s3"  # s3://BUCKET[/PREFIX] (aws)
    GS = "gs"  # gs://BUCKET[/PREFIX] (gcp)


@dataclass(frozen=True)
class OutputDest:
    """Where a run's outputs go (`JobSpec.output`): `where` is the folder's path or the URL, as given."""

    kind: DestKind
    where: str

    @classmethod
    def of(cls, value: "str | os.PathLike[str]") -> "OutputDest":
        """`value` classified by its scheme: none is a local folder, s3:// and gs:// are buckets;
        any other scheme raises ValueError."""
        text = os.fspath(value)
        if "://" not in text:
            return cls(DestKind.LOCAL, text)
        scheme = text.split("://", 1)[0].lower()
        if scheme not in (DestKind.S3, DestKind.GS):
            raise ValueError(f"not an output destination: {text!r} (a folder, s3:// or gs://)")
        return cls(DestKind(scheme), text)

    @property
    def remote(self) -> bool:
        """The nodes upload to object storage; nothing comes back to this machine."""
        return self.kind is not DestKind.LOCAL

    def __str__(self) -> str:
        return self.where
