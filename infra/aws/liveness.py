"""Which recorded instances of a kept cluster no longer bill, and since when (`Operations.gone_at`).

Kept clusters outlive their run: their nodes power themselves off at the dead-man deadline (and
terminate: instance_initiated_shutdown_behavior = terminate), spot nodes may be reclaimed, and a
user may terminate them by hand. `gpucluster status` asks EC2 about the open `instance` rows of
such a cluster and closes the rows of instances that are gone, at the end EC2 reports, so their
cost stops there instead of accruing up to now.

EC2 facts used (EC2 User Guide, "Amazon EC2 instance state changes": an instance is not billed in
`shutting-down` or `terminated`; a stopped one still pays for its volumes; EC2 API reference, DescribeInstances and its
`StateTransitionReason`, e.g. "User initiated (2026-11-22 07:00:00 GMT)"): a terminated instance
stays visible for about an hour, then `DescribeInstances` answers `InvalidInstanceID.NotFound`.
When EC2 gives no time, the end is the dead-man deadline at the latest (the node's lifetime counted
from its creation, plus `BOOT_SLACK_S` for the boot that arms it), else the moment it was seen gone.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import Iterable, Sequence

from gpucluster.states import JsonMapping, JsonObject

from .sdk import AwsSession, Ec2Client

GONE_STATES = ("shutting-down", "terminated")  # a stopped instance keeps its root volume, which bills
BOOT_SLACK_S = 15 * 60  # from "created" to the dead-man switch armed by the first boot's cloud-init
_WHEN = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def _reason_time(reason: str | None) -> float | None:
    m = _WHEN.search(reason or "")
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))) if m else None


def _bound(row: JsonMapping, lifetime_min: int | None, now: float) -> float:
    start = row.get("created_at") or row.get("requested_at") or now
    if lifetime_min:
        return min(now, float(start) + lifetime_min * 60 + BOOT_SLACK_S)
    return now


def _split_rows(rows: Sequence[JsonMapping]) -> tuple[dict[str, dict[str, JsonMapping]], list[JsonMapping]]:
    """({region: {instance id: its instance row}}, the fleet rows): the open rows EC2 can be asked about."""
    by_region: dict[str, dict[str, JsonMapping]] = {}
    fleets: list[JsonMapping] = []
    for row in rows:
        if row.get("kind") == "instance" and row.get("cloud_id") and row.get("region"):
            by_region.setdefault(str(row["region"]), {})[str(row["cloud_id"])] = row
        elif row.get("kind") == "fleet" and row.get("cloud_id") and row.get("region"):
            fleets.append(row)
    return by_region, fleets


def _fleet_gone(row: JsonMapping, lifetime_min: int | None, session: AwsSession,
                now: float) -> tuple[float, str] | None:
    """A fleet row stands for its N instances: it stops billing once every one of them is gone. An
    instant fleet lists its instances in DescribeFleets (DescribeFleetInstances "does not support
    fleets of type instant": EC2 API reference); each is then asked about as an instance row is."""
    ec2 = session.client("ec2", region_name=str(row["region"]))
    listed = ec2.describe_fleets(FleetIds=[str(row["cloud_id"])]).get("Fleets", [])
    ids = [i for f in listed for s in f.get("Instances") or [] for i in s.get("InstanceIds") or []]
    members = [{**row, "id": k, "kind": "instance", "cloud_id": iid} for k, iid in enumerate(ids)]
    ended = gone_at(members, lifetime_min, session=session, now=now) if members else {}
    if not listed or not ids:
        # unknown to EC2, or listing no instance (none launched, or the terminated ones dropped
        # from the list, as moto does): nothing of it bills; when it stopped is not said
        why = "fleet no longer known to EC2" if not listed else "the fleet lists no instance any more"
        return _bound(row, lifetime_min, now), f"{why}: ended by the dead-man deadline at the latest"
    if len(ended) == len(ids):
        end = max(when for when, _ in ended.values())
        return end, f"all {len(ids)} instances of the fleet gone: " + "; ".join(why for _, why in ended.values())
    return None


def _describe_each(ec2: Ec2Client, ids: Iterable[str]) -> dict[str, JsonObject]:
    """{instance id: DescribeInstances' record} for the ids EC2 still knows, asked one by one: a single
    unknown id fails a whole DescribeInstances call."""
    from botocore.exceptions import ClientError

    seen: dict[str, JsonObject] = {}
    for iid in ids:
        try:
            for res in ec2.describe_instances(InstanceIds=[iid]).get("Reservations", []):
                for inst in res.get("Instances", []):
                    seen[inst["InstanceId"]] = inst
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                raise
    return seen


def _instance_gone(row: JsonMapping, inst: JsonMapping | None, lifetime_min: int | None,
                   now: float) -> tuple[float, str] | None:
    """When the instance of `row` stopped billing and how that is known; None while it still bills."""
    if inst is None:
        return _bound(row, lifetime_min, now), ("no longer known to EC2 (terminated over an hour ago): ended by the "
                                                "dead-man deadline at the latest")
    state = inst.get("State", {}).get("Name")
    if state not in GONE_STATES:
        return None
    when = _reason_time(inst.get("StateTransitionReason"))
    why = (inst.get("StateReason") or {}).get("Message") or state
    if when is not None:
        return min(when, now), f"{state} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC ({why})"
    return _bound(row, lifetime_min, now), f"{state} ({why}); time not given by EC2"


def gone_at(rows: Sequence[JsonMapping], lifetime_min: int | None = None, *, session: AwsSession = None,
            now: float | None = None) -> dict[int, tuple[float, str]]:
    """{row id: (when it stopped billing, how that is known)} for the `instance` rows whose EC2
    instance is shutting down, terminated or no longer known, and the `fleet` rows all of whose
    instances are. Raises the client's error
    when EC2 cannot be asked (status then says so and leaves the rows open)."""
    if session is None:
        import boto3

        session = boto3.session.Session()
    now = time.time() if now is None else now
    by_region, fleets = _split_rows(rows)
    out: dict[int, tuple[float, str]] = {}
    for row in fleets:
        fleet_end = _fleet_gone(row, lifetime_min, session, now)
        if fleet_end is not None:
            out[int(row["id"])] = fleet_end
    for region, wanted in by_region.items():
        seen = _describe_each(session.client("ec2", region_name=region), wanted)
        for iid, row in wanted.items():
            end = _instance_gone(row, seen.get(iid), lifetime_min, now)
            if end is not None:
                out[int(row["id"])] = end
    return out
