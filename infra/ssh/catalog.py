"""Spec checks for the `ssh` backend (existing machines: no instance or price data)."""

from __future__ import annotations

from typing import Any


def validate_spec(spec: Any) -> list[str]:
    from gpucluster.infra.ssh.provider import validate_spec as check

    return check(spec)
