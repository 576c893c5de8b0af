"""Spec checks for the `ssh` backend (existing machines: no instance or price data)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec


def validate_spec(spec: ClusterSpec) -> list[str]:
    from gpucluster.infra.ssh.provider import validate_spec as check

    return check(spec)
