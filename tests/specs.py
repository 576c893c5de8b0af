"""`validate`/`resolve` of a spec by the backend its `cloud` names: what a command does at its
composition root (one registry look-up, the plugin passed to `gpucluster.spec`), for tests."""

from __future__ import annotations

from gpucluster import spec as _spec
from gpucluster.infra.registry import plugin


def validate(spec: _spec.ClusterSpec) -> list[str]:
    """As a command does: the spec in its one representation (`normalize`), then checked."""
    chosen = plugin(spec.cloud)
    return _spec.validate(_spec.normalize(spec, chosen), chosen)


def normalize(spec: _spec.ClusterSpec) -> _spec.ClusterSpec:
    return _spec.normalize(spec, plugin(spec.cloud))


def resolve(spec: _spec.ClusterSpec) -> _spec.ClusterSpec:
    return _spec.resolve(spec, plugin(spec.cloud))
