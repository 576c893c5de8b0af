"""Helpers the commands share: the ledger, the provider of a cluster, questions and money."""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import Any

import click

from gpucluster.errors import GpuclusterError, UsageError

from gpucluster.cli.console import make_console as console  # noqa: F401 - re-exported for the commands


def provider_for(cloud: str) -> Any:
    """The provider that can create, tear down or describe a cluster of `cloud` (tests replace this)."""
    from gpucluster.infra.contract import LaunchOptions
    from gpucluster.infra.registry import plugin

    return plugin(cloud).transport.provider_only(LaunchOptions())


def ledger():
    from gpucluster.ledger import Ledger

    return Ledger.open_default()


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: confirm with --yes when not on a terminal")
    if not click.confirm(question, default=False):
        raise click.exceptions.Abort()


def hourly(spec: Any) -> Decimal | None:
    """Estimated $/hour of a spec, when the cost module can price it."""
    try:
        from gpucluster import cost
    except ImportError:
        return None
    try:
        return cost.estimate(spec, 1).hourly
    except (GpuclusterError, AttributeError, KeyError, ValueError):
        return None


def money(value: Decimal | None) -> str:
    from gpucluster.cost import money as dollars

    return "-" if value is None else dollars(value)


def print_notes(out: Any, notes: list[str]) -> None:
    """The spec's warnings and the values found at run time ("detected ...")."""
    for w in notes:
        out.print(f"[yellow]note:[/yellow] {w}" if "detected" in w else f"[yellow]warning:[/yellow] {w}")
