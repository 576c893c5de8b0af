"""Turn the AWS stack's outputs (`infra.aws.GpuCluster.outputs()`) into a `Cluster`, head first.

No Pulumi import: the Automation API driver hands over plain values (`OutputValue.value`), and
so can anyone reading `pulumi stack output --json --show-secrets`.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpucluster.errors import ProvisionError

from gpucluster.domain import Cluster, Node

LIST_KEYS = ("instance_ids", "private_ips", "public_ips")
# stacks made before the fleet exported the host keys they generated; a fleet's nodes make their own,
# read from the serial console (`hostkeys.pin`, in `cluster_with_host_keys`)
OLD_KEYS = "host_public_keys"
SECRET_KEYS = ("ssh_private_key",)


def cluster_from_outputs(outputs: Mapping[str, Any]) -> Cluster:
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
        raise ProvisionError("an AWS node has no public IP yet; the launcher cannot reach it")
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


def cluster_with_host_keys(outputs: Mapping[str, Any]) -> Cluster:
    """`cluster_from_outputs`, each node's host key pinned from its serial console (or the keys
    cached when first read): what `up`, `attach` and `probe` connect with. A node whose console shows
    no key in time fails it, naming the node (`hostkeys.pin`)."""
    from . import hostkeys

    return hostkeys.pin(cluster_from_outputs(outputs))


def console_tail(cluster: Cluster, node: Node, *, lines: int = 12, client: Any = None) -> str | None:
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
