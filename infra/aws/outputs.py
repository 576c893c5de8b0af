"""Turn the AWS stack's outputs (`infra.aws.GpuCluster.outputs()`) into a `Cluster`, head first.

No Pulumi import: the Automation API driver hands over plain values (`OutputValue.value`), and
so can anyone reading `pulumi stack output --json --show-secrets`.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Mapping

from gpucluster.errors import ProvisionError

from gpucluster.domain import Cluster, Node
from gpucluster.states import JsonMapping, JsonObject

from .sdk import Ec2Client

LIST_KEYS = ("instance_ids", "private_ips", "public_ips")
# stacks made before the fleet exported the host keys they generated; a fleet's nodes make their own,
# read from the serial console (`hostkeys.pin`, in `cluster_with_host_keys`)
OLD_KEYS = "host_public_keys"
SECRET_KEYS = ("ssh_private_key",)


def cluster_from_outputs(outputs: JsonMapping) -> Cluster:
    """A `Cluster` from the exported outputs; ProvisionError when they are incomplete."""
    missing = [k for k in (*LIST_KEYS, "cluster_name", "ssh_user") if outputs.get(k) is None]
    if missing:
        raise ProvisionError(f"the AWS stack outputs lack {', '.join(missing)}; was `pulumi up` complete?")
    lists = {k: list(outputs[k]) for k in LIST_KEYS}
    if outputs.get(OLD_KEYS) is not None:
        lists[OLD_KEYS] = list(outputs[OLD_KEYS])
    lengths = {k: len(v) for k, v in lists.items()}
    if len(set(lengths.values())) != 1 or not lists["instance_ids"]:
        raise ProvisionError(f"the AWS stack outputs disagree on the node count: {lengths}")
    if any(not ip for ip in lists["public_ips"]):
        raise ProvisionError("an AWS node has no public IP yet; the launcher cannot reach it")  # see wait_running
    gpus = int(outputs.get("gpus_per_node") or 0)
    user = str(outputs["ssh_user"])
    nodes = tuple(
        Node(
            rank=rank,
            host=public,
            private_ip=private,
            user=user,
            instance_id=instance_id,
            gpus=gpus,
            host_keys=(lists[OLD_KEYS][rank],) if OLD_KEYS in lists else (),
        )
        for rank, (instance_id, private, public) in enumerate(
            zip(lists["instance_ids"], lists["private_ips"], lists["public_ips"])
        )
    )
    return Cluster(
        name=str(outputs["cluster_name"]),
        cloud="aws",
        nodes=nodes,
        region=outputs.get("region"),
        zone=outputs.get("availability_zone"),
        instance_type=outputs.get("instance_type"),
        gpus_per_node=gpus,
        ssh_private_key=outputs.get("ssh_private_key") or None,
        outputs={k: v for k, v in outputs.items() if k not in SECRET_KEYS},
    )


def cluster_with_host_keys(outputs: JsonMapping) -> Cluster:
    """`cluster_from_outputs`, each node's host key pinned from its serial console (or the keys
    cached when first read): what `up`, `attach` and `probe` connect with. A node whose console shows
    no key in time fails it, naming the node (`hostkeys.pin`). A node without a public IP in the
    outputs is waited for until it is `running` (`wait_running`)."""
    from . import hostkeys

    return hostkeys.pin(cluster_from_outputs(wait_running(outputs)))


RUNNING_WAIT_S = 600.0  # how long a node may stay `pending` (EC2 takes seconds to minutes)
RUNNING_POLL_S = 5.0


class _Round(Enum):
    """What one DescribeInstances of `wait_running` found."""

    GONE = "gone"  # a node is shutting down, stopped or terminated: fail
    RUNNING = "running"  # every node running with a public IPv4: done
    PENDING = "pending"  # some node not yet: wait, or fail at the deadline


_GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")


def _describe(client: Ec2Client, ids: list[str]) -> tuple[dict[str, JsonObject], dict[str, str]]:
    """({instance id: DescribeInstances' record}, {instance id: its state name, "unknown" when not listed})."""
    found = {i["InstanceId"]: i for r in client.describe_instances(InstanceIds=ids).get("Reservations", [])
             for i in r.get("Instances", [])}
    return found, {i: (found.get(i) or {}).get("State", {}).get("Name", "unknown") for i in ids}


def _round(found: Mapping[str, JsonObject], states: Mapping[str, str]) -> _Round:
    if any(s in _GONE_STATES for s in states.values()):
        return _Round.GONE
    if all(s == "running" and found[i].get("PublicIpAddress") for i, s in states.items()):
        return _Round.RUNNING
    return _Round.PENDING


def _gone_error(states: Mapping[str, str]) -> ProvisionError:
    bad = [f"{i} is {s}" for i, s in states.items() if s in _GONE_STATES]
    return ProvisionError(f"AWS node {bad[0]} before it was reached" + (f" ({len(bad) - 1} more)" if len(bad) > 1 else ""))


def _with_addresses(outputs: JsonMapping, ids: list[str], found: Mapping[str, JsonObject]) -> JsonMapping:
    return {**outputs, "public_ips": [found[i]["PublicIpAddress"] for i in ids],
            "private_ips": [found[i].get("PrivateIpAddress") or p
                            for i, p in zip(ids, outputs.get("private_ips") or [""] * len(ids))]}


def _pending_error(found: Mapping[str, JsonObject], states: Mapping[str, str], limit: float) -> ProvisionError:
    waiting = [f"{i} ({s})" for i, s in states.items() if s != "running" or not found[i].get("PublicIpAddress")]
    return ProvisionError(f"AWS node(s) {', '.join(waiting)} not running with a public IP after {limit:.0f} s")


def wait_running(outputs: JsonMapping, *, client: Ec2Client = None, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None, timeout: float | None = None) -> JsonMapping:
    """The outputs with every node's addresses, once every node is `running`. The program reads each
    node (`aws.ec2.get_instance`) right after the instant fleet returns, while EC2 may still report
    it `pending`, and a pending instance has no public IPv4 yet (EC2 User Guide, "Instance
    lifecycle"; the address is assigned as the instance starts). So when a public IP is missing, ask
    EC2 (DescribeInstances) until each node is `running`, bounded by RUNNING_WAIT_S, and take the
    addresses it reports then. A node that is shutting down or gone, or still pending at the
    deadline, fails `up` naming it (ProvisionError); the outputs unchanged when nothing is missing."""
    import time

    ids = [str(i) for i in outputs.get("instance_ids") or []]
    publics = list(outputs.get("public_ips") or [])
    if not ids or len(publics) != len(ids) or all(publics):
        return outputs
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=outputs.get("region"))
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    limit = RUNNING_WAIT_S if timeout is None else timeout
    start = clock()
    while True:
        found, states = _describe(client, ids)
        verdict = _round(found, states)
        if verdict is _Round.GONE:
            raise _gone_error(states)
        if verdict is _Round.RUNNING:
            return _with_addresses(outputs, ids, found)
        if clock() - start >= limit:
            raise _pending_error(found, states, limit)
        sleep(RUNNING_POLL_S)


def console_tail(cluster: Cluster, node: Node, *, lines: int = 12, client: Ec2Client = None) -> str | None:
    """The last lines of an instance's console (EC2 GetConsoleOutput, `Latest=True`): what the
    user most wants when a node never gets ready (cloud-init errors, driver messages). The API
    returns the text base64-encoded (EC2 API reference, GetConsoleOutput). None without an id."""
    import base64
    import binascii

    if not node.instance_id:
        return None
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=cluster.region)
    resp = client.get_console_output(InstanceId=node.instance_id, Latest=True)
    raw = resp.get("Output") or ""
    try:
        text = base64.b64decode(raw, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        text = raw
    tail = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
    if not tail:
        return f"console output of {node.instance_id}: empty so far"
    return f"console output of {node.instance_id} (last {len(tail)} lines): " + " | ".join(tail)
