"""The Python API (docs/python.md): what the `gpucluster` commands call, by keyword, typed.

    import gpucluster
    record = gpucluster.run(cloud="local", nodes=2, workload="digits", epochs=1)
    print(record.status, record.teardown, record.cost)

A composition root like `cli/`: it looks backends up in the registry (`infra/registry.py`); the
core it calls never does. Importing it is light (no torch, boto3, Pulumi or Kubernetes clients);
each function imports what it needs when called. Nothing here prints unless asked, nor exits:
bad input raises the `UsageError` the CLI prints (gpucluster.errors)."""

from gpucluster.api.clusters import Cluster, estimate, up
from gpucluster.api.records import down, logs, runs, show
from gpucluster.api.jobs import run

__all__ = ["Cluster", "down", "estimate", "logs", "run", "runs", "show", "up"]
