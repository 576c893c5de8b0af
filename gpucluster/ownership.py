"""Who made a resource: the installation id of a `$GPUCLUSTER_HOME`, and what is ours to delete.

Teams share cloud accounts and work from several machines, so "tagged managed-by=gpucluster" does
not mean "mine". Each home gets a stable installation id at first use (`installation_id()`: 16 hex
digits in `$GPUCLUSTER_HOME/installation-id`, made atomically so that concurrent first commands
agree on one). Every cloud resource a run creates carries it with the user and host that made it
and the run id (`owner_marks()`: the reserved tags `gpucluster-owner`, `gpucluster-user`,
`gpucluster-host`, values that are also valid GCP label values). A stack made with `pulumi up -s
STACK` directly carries `gpucluster-stack` as well (`stack_marks()`).

`Ownership` sorts what a tag scan found into what this home may delete and what it must leave
alone: ours (our owner id; or no owner tag but a run id in our ledger: made before owner tags),
not ours (another owner, or no owner and a run we never made), and standalone stacks (never
deleted unless named with `--stack`). `--any-owner` (an admin who means it) makes every owner's
resources deletable, standalone stacks still excepted.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from gpucluster.errors import ConfigError
from gpucluster.spec import MARK_KEYS

if TYPE_CHECKING:
    from gpucluster.domain import Leftover

OWNER_TAG, USER_TAG, HOST_TAG, STACK_TAG = MARK_KEYS  # reserved (spec.RESERVED_TAG_PREFIX)
ID_FILE = "installation-id"
_ID_RE = re.compile(r"^[0-9a-f]{16}$")
_RUN_TIME_RE = re.compile(r"^r(\d{8})-(\d{6})-")
SHORT = 4  # hex digits of the owner id in default cluster names (gpucluster-aws-3f9c)


def label_value(text: str, limit: int = 63) -> str:
    """`text` as a GCP label value (lowercase letters, digits, '_' and '-', at most 63 characters),
    also used as the AWS tag value so that both clouds carry the same marks."""
    return re.sub(r"[^a-z0-9_-]", "_", str(text).lower())[:limit]


def _read_id(path: Path) -> str | None:
    from gpucluster.userfile import read_bounded

    try:
        text = read_bounded(path, "installation id file", 4096, hint="a file of 16 hex digits; fix or move it aside",
                            error=ConfigError).decode("ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"installation id file {str(path)!r} cannot be read ({exc}); fix or move it aside") from None
    if not text:
        return ""
    if not _ID_RE.match(text):
        raise ConfigError(f"installation id file {str(path)!r} holds {text[:40]!r}, not 16 hex digits; restore it "
                          "from a backup (a new id makes this home's clusters look like another owner's)")
    return text


def existing_id() -> str | None:
    """This home's owner id when it has one already; nothing is created (dry runs)."""
    from gpucluster.home import home_dir

    try:
        return _read_id(home_dir(create=False) / ID_FILE) or None
    except ConfigError:
        return None


def installation_id(home: Path | None = None) -> str:
    """This home's owner id, made at first use. Concurrent first uses agree: the id is written to a
    private file and hard-linked into place (link(2) fails when the name exists), so exactly one
    writer wins and every other reads the winner's id."""
    from gpucluster.home import home_dir

    home = home or home_dir()
    path = home / ID_FILE
    found = _read_id(path)
    if found:
        return found
    if found is None:
        tmp = home / f".{ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            tmp.write_text(secrets.token_hex(8) + "\n", encoding="ascii")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: its id is the id
            except OSError:  # a file system without hard links: exclusive create instead
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    with os.fdopen(fd, "w", encoding="ascii") as fh:
                        fh.write(tmp.read_text(encoding="ascii"))
                except FileExistsError:
                    pass
        except OSError as exc:
            raise ConfigError(f"installation id file {str(path)!r} cannot be written ({exc.strerror or exc}); "
                              "GPUCLUSTER_HOME must be a folder you can write") from None
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
    for _ in range(50):  # an exclusive create that has not written its line yet: wait a moment
        found = _read_id(path)
        if found:
            return found
        time.sleep(0.02)
    raise ConfigError(f"installation id file {str(path)!r} is empty; remove it (a new id is made) or restore it")


def short_id(owner: str) -> str:
    return owner[:SHORT]


def default_name(cloud: str, owner: str) -> str:
    """The cluster name when none is given: per cloud and per owner, so two people's default runs
    in one account never share a name."""
    return f"gpucluster-{cloud}-{short_id(owner)}"


def user_and_host() -> tuple[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a container's bare uid)
        user = f"uid{os.getuid()}"
    return label_value(user) or "unknown", label_value(socket.gethostname()) or "unknown"


def owner_marks(owner: str | None = None) -> tuple[tuple[str, str], ...]:
    """The reserved tags naming this home's owner, user and host (for `ClusterSpec.marks`)."""
    user, host = user_and_host()
    return ((OWNER_TAG, owner or installation_id()), (USER_TAG, user), (HOST_TAG, host))


def stack_marks(project: str, stack: str) -> tuple[tuple[str, str], ...]:
    """The marks of a stack made with `pulumi up -s STACK` directly: the owner marks plus the stack."""
    return owner_marks() + ((STACK_TAG, stack_value(project, stack)),)


def stack_value(project: str, stack: str) -> str:
    return label_value(f"{project}/{stack}")


def run_started(run_id: str | None) -> float | None:
    """When a run started, from its id (rYYYYmmdd-HHMMSS-xxxxxx, UTC); None for other ids."""
    m = _RUN_TIME_RE.match(run_id or "")
    if not m:
        return None
    import calendar

    try:
        return float(calendar.timegm(time.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S")))
    except ValueError:
        return None


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch)) if epoch else "an unknown time"


def describe_owner(lo: Leftover) -> str:
    """"owner 3f9c21aa07b1e5d2, alice@laptop, since 2026-11-25 10:02 UTC" from a Leftover's marks."""
    who = f"owner {lo.owner}" if lo.owner else "owner unknown (no gpucluster-owner tag)"
    made_by = f", {lo.made_by}" if lo.made_by else ""
    return f"{who}{made_by}, since {when(lo.since)}"


def not_ours_line(lo: Leftover) -> str:
    if lo.stack:
        return (f"{lo.kind} {lo.id}: standalone stack {lo.stack} (made with `pulumi up`; remove it with "
                f"`pulumi destroy`, or name it: --stack), {describe_owner(lo)}")
    return f"{lo.kind} {lo.id}: not ours ({describe_owner(lo)})"


OURS, NOT_OURS, STACK = "ours", "not ours", "stack"


@dataclass(frozen=True)
class Ownership:
    """Which found resources this home may delete. `owner`: this home's id; `runs`: the run ids in
    its ledger (resources made before owner tags carry only those); `any_owner`: every owner's
    (`--any-owner`); `stacks`: standalone stacks named with `--stack` (their marks' values)."""

    owner: str
    runs: frozenset[str] = field(default_factory=frozenset)
    any_owner: bool = False
    stacks: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def here(cls, runs: Iterable[str] = (), *, any_owner: bool = False, stacks: Iterable[str] = ()) -> "Ownership":
        return cls(installation_id(), frozenset(runs), any_owner,
                   frozenset(label_value(s) for s in stacks))

    @property
    def scan_owner(self) -> str | None:
        """The owner whose global resources (IAM roles, ...) a scan lists; None: every owner's."""
        return None if self.any_owner or self.stacks else self.owner

    def whose(self, lo: Leftover) -> str:
        if lo.stack:
            named = lo.stack in self.stacks or any(lo.stack.endswith("_" + s) for s in self.stacks)
            return OURS if named else STACK
        if self.any_owner:
            return OURS
        if lo.owner:
            return OURS if lo.owner == self.owner else NOT_OURS
        return OURS if lo.run_id and lo.run_id in self.runs else NOT_OURS

    def split(self, found: Iterable[Leftover]) -> tuple[list[Leftover], list[Leftover]]:
        """(ours to delete, the rest: not ours or standalone stacks, left alone)."""
        ours: list[Leftover] = []
        rest: list[Leftover] = []
        for lo in found:
            (ours if self.whose(lo) == OURS else rest).append(lo)
        return ours, rest


def owners_of(found: Iterable[Leftover]) -> list[str]:
    """Each owner among `found`, once, as a person reads it: "3f9c21aa07b1e5d2 (alice@laptop)"."""
    seen: dict[str, str] = {}
    for lo in found:
        key = lo.owner or "unknown"
        seen.setdefault(key, f"{key} ({lo.made_by})" if lo.made_by else key)
    return [seen[k] for k in sorted(seen)]


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, what: str = "--older-than") -> float:
    """'0s', '90m', '12h', '7d' -> seconds; UsageError (exit 2) naming the value."""
    from gpucluster.errors import UsageError

    m = _DURATION_RE.match(str(text or ""))
    if not m:
        raise UsageError(f"{what} {text!r} is not allowed: a number and a unit s, m, h or d, e.g. 12h or 7d")
    return float(m.group(1)) * _UNIT[m.group(2)]


def age(since: float | None, now: float | None = None) -> str:
    """'3h 12m', '2d 4h', '45s': how long ago `since` was; '?' when unknown."""
    if since is None:
        return "?"
    secs = max(0, int((time.time() if now is None else now) - since))
    for unit, size, small, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} {(secs % size) // small_size}{small}"
    return f"{secs // 60}m" if secs >= 60 else f"{secs}s"
