"""The `gcp` backend: a GKE cluster with a V100 node pool (GKE installs the driver) made by
Pulumi; jobs run as a Kubernetes Indexed Job + headless Service (or a Kubeflow PyTorchJob).

Contract: `gpucluster.infra.contract`. `TRAITS` here (plain values); `plugin.PLUGIN` holds its
parts. Modules: catalog (zones, machine types, spec checks), component (the Pulumi component),
access (project and credentials), gke (GKE's `Platform` for the shared Kubernetes launcher,
`infra.kubernetes`), idle (the idle stop), engine (Pulumi events, capacity), leftovers (the tag
scan), prices, gcs (object storage), dryrun (--dry-run)."""

from __future__ import annotations

from gpucluster.infra.contract import Capability, Traits

TRAITS = Traits(
    name="gcp",
    max_nodes=64,
    flags=("region", "zone", "instance_type", "spot", "disk_gb", "tags", "keep",
           "state",  # where the Pulumi state lives
           "project",  # a GCP project
           "start_deadline",  # GKE pods' scheduling deadline
           "setup",  # run in each pod before torchrun (the entry script's setup wrapper)
           "data", "resume"),  # staged into each pod through the exec API (infra.kubernetes.stage)
    flags_refused_why="gcp runs on GKE pods reached through the Kubernetes API",
    capabilities=frozenset({Capability.PROVISIONS, Capability.PRICED, Capability.OBJECT_STORE}),
)
