"""The `aws` backend: EC2 g5 instances (Deep Learning AMI, NVIDIA driver ready) made by Pulumi,
reached with the `ssh` launcher using the cluster's own key and pinned host keys.

Contract: `gpucluster.infra.contract`. `TRAITS` here (plain values); `plugin.PLUGIN` holds its
parts. Modules: catalog (instance types, regions, spec checks), component (the Pulumi component),
outputs (stack outputs -> Cluster, console tail), engine (Pulumi events, capacity), leftovers (the
tag scan), prices, s3 (object storage), dryrun and mock_runtime (--dry-run), sdk (the names of
boto3's untyped objects)."""

from __future__ import annotations

from gpucluster.infra.contract import Capability, Traits

TRAITS = Traits(
    name="aws",
    max_nodes=64,
    flags=("region", "zone", "instance_type", "spot", "disk_gb", "tags", "keep",
           "state",  # where the Pulumi state lives
           "max_lifetime",  # the nodes' self-shutdown timer
           "ssh_cidr",  # who may reach the nodes over ssh
           "remote_python",
           "ready_timeout",  # waiting for ssh and the DLAMI's first boot
           "data", "setup", "resume"),  # staged and run over ssh
    flags_refused_why="aws nodes are created and reached by gpucluster itself",
    capabilities=frozenset({Capability.PROVISIONS, Capability.PRICED, Capability.OBJECT_STORE}),
)
