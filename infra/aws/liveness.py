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
from typing import Any, Mapping, Sequence

GONE_STATES = ("shutting-down", "terminated")  # a stopped instance keeps its root volume, which bills
BOOT_SLACK_S = 15 * 60  # from "created" to the dead-man switch armed by the first boot's cloud-init
_WHEN = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def _reason_time(reason: str | None) -> float | None:
    m = _WHEN.search(reason or "")
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))) if m else None


def _bound(row: Mapping[str, Any], lifetime_min: int | None, now: float) -> float:
    start = row.get("created_at") or row.get("requested_at") or now
    if lifetime_min:
        return min(now, float(start) + lifetime_min * 60 + BOOT_SLACK_S)
    return now


def gone_at(rows: Sequence[Mapping[str, Any]], lifetime_min: int | None = None, *, session: Any = None,
            now: float | None = None) -> dict[int, tuple[float, str]]:
    """{row id: (when it stopped billing, how that is known)} for the `instance` rows whose EC2
    instance is shutting down, terminated or no longer known, and the `fleet` rows all of whose
    instances are. Raises the client's error
    when EC2 cannot be asked (status then says so and leaves the rows open)."""
    from botocore.exceptions import ClientError

    if session is None:
        import boto3

        session = boto3.session.Session()
    now = time.time() if now is None else now
    by_region: dict[str, dict[str, Mapping[str, Any]]] = {}
    fleets: list[Mapping[str, Any]] = []
    for row in rows:
        if row.get("kind") == "instance" and row.get("cloud_id") and row.get("region"):
            by_region.setdefault(str(row["region"]), {})[str(row["cloud_id"])] = row
        elif row.get("kind") == "fleet" and row.get("cloud_id") and row.get("region"):
            fleets.append(row)
    out: dict[int, tuple[float, str]] = {}
    # a fleet row stands for its N instances: it stops billing once every one of them is gone. An
    # instant fleet lists its instances in DescribeFleets (DescribeFleetInstances "does not support
    # fleets of type instant": EC2 API reference); each is then asked about as an instance row is.
    for row in fleets:
        ec2 = session.client("ec2", region_name=str(row["region"]))
        listed = ec2.describe_fleets(FleetIds=[str(row["cloud_id"])]).get("Fleets", [])
        ids = [i for f in listed for s in f.get("Instances") or [] for i in s.get("InstanceIds") or []]
        members = [{**row, "id": k, "kind": "instance", "cloud_id": iid} for k, iid in enumerate(ids)]
        ended = gone_at(members, lifetime_min, session=session, now=now) if members else {}
        if not listed or not ids:
            # unknown to EC2, or listing no instance (none launched, or the terminated ones dropped
            # from the list, as moto does): nothing of it bills; when it stopped is not said
            why = "fleet no longer known to EC2" if not listed else "the fleet lists no instance any more"
            out[int(row["id"])] = (_bound(row, lifetime_min, now), f"{why}: ended by the dead-man deadline at the latest")
        elif len(ended) == len(ids):
            end = max(when for when, _ in ended.values())
            out[int(row["id"])] = (end, f"all {len(ids)} instances of the fleet gone: "
                                        + "; ".join(why for _, why in ended.values()))
    for region, wanted in by_region.items():
        ec2 = session.client("ec2", region_name=region)
        seen: dict[str, dict[str, Any]] = {}
        for iid in wanted:  # one by one: a single unknown id fails a whole DescribeInstances call
            try:
                for res in ec2.describe_instances(InstanceIds=[iid]).get("Reservations", []):
                    for inst in res.get("Instances", []):
                        seen[inst["InstanceId"]] = inst
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                    raise
        for iid, row in wanted.items():
            inst = seen.get(iid)
            if inst is None:
                out[int(row["id"])] = (_bound(row, lifetime_min, now), "no longer known to EC2 (terminated over "
                                                                       "an hour ago): ended by the dead-man deadline "
                                                                       "at the latest")
                continue
            state = inst.get("State", {}).get("Name")
            if state not in GONE_STATES:
                continue
            when = _reason_time(inst.get("StateTransitionReason"))
            why = (inst.get("StateReason") or {}).get("Message") or state
            if when is not None:
                out[int(row["id"])] = (min(when, now), f"{state} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))}"
                                                       f" UTC ({why})")
            else:
                out[int(row["id"])] = (_bound(row, lifetime_min, now), f"{state} ({why}); time not given by EC2")
    return out
