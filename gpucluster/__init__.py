"""gpucluster: GPU clusters for distributed PyTorch training, with honest costs.

The core package is cloud-agnostic and light: importing it never imports torch, boto3,
Pulumi or the Google/Kubernetes clients. Those live behind lazy imports in the backends.
`gpucluster.run(...)`, `gpucluster.runs()`, ...: the Python API (docs/python.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The Python API (docs/python.md), imported on first use so `import gpucluster` stays light: the
# functions live in gpucluster.api (api/), a composition root like the CLI, which calls them too.
API = ("Cluster", "down", "estimate", "logs", "run", "runs", "show", "up")
__all__ = ["__version__", *API]

if TYPE_CHECKING:
    from gpucluster.api import Cluster, down, estimate, logs, run, runs, show, up  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in API:
        import gpucluster.api

        return getattr(gpucluster.api, name)
    raise AttributeError(f"module 'gpucluster' has no attribute {name!r}")
