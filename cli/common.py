"""Helpers the commands share: the ledger, the provider of a cluster, questions and money."""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Callable

import click

from gpucluster.errors import GpuclusterError, UsageError

from gpucluster.cli.console import make_console as console  # noqa: F401 - re-exported for the commands

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec
    from gpucluster.domain import Provider
    from gpucluster.ledger.store import Ledger
    from gpucluster.ownership import Ownership
    from rich.console import Console


def provider_for(cloud: str, *, ownership: Ownership | None = None, project: str | None = None) -> Provider:
    """The provider that can create, tear down or describe a cluster of `cloud`; with `down`'s scope (whose
    resources it may count and delete, the account they are in) where given (tests replace this)."""
    from gpucluster.infra.contract import LaunchOptions
    from gpucluster.infra.registry import plugin

    # building its launcher too costs nothing
    return plugin(cloud).transport.make(LaunchOptions(ownership=ownership, project=project or None))[0]


def ledger():
    from gpucluster.ledger.store import Ledger

    return Ledger.open_default()


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: confirm with --yes when not on a terminal")
    if not click.confirm(question, default=False):
        raise click.exceptions.Abort()


def hourly(spec: ClusterSpec) -> Decimal | None:
    """Estimated $/hour of a spec; None when no price is known for it (a one-line error from the
    catalog: an unknown type or region). A bug in the cost code is not hidden as "no price known"."""
    from gpucluster.costing import cost
    from gpucluster.infra.registry import plugin

    try:
        return cost.estimate(spec, 1, backend=plugin(spec.cloud)).hourly  # an unknown cloud: no price known
    except GpuclusterError:
        return None


def money(value: Decimal | None) -> str:
    from gpucluster.costing.cost import money as dollars

    return "-" if value is None else dollars(value)


def print_notes(out: Console, notes: list[str]) -> None:
    """The spec's warnings and the values found at run time ("detected ...")."""
    for w in notes:
        out.print(f"[yellow]note:[/yellow] {w}" if "detected" in w else f"[yellow]warning:[/yellow] {w}")



def preflight(check: Callable[[], object], yes: bool) -> None:
    """`check()` (a provider's preflight); when it finds no usable Pulumi CLI, offer once to install the pinned
    minimum version into the gpucluster home, then check again. Called only on the way to a real
    `run`/`up`/`down` (never on --help or --dry-run). GPUCLUSTER_INSTALL_PULUMI=yes or --yes installs
    without asking; =no, a "no", or no terminal without either leaves the missing-CLI error as it was."""
    from gpucluster.infra.pulumi import cli as pulumi_cli

    try:
        check()
        return
    except pulumi_cli.PulumiCliMissing as exc:
        missing = exc
    choice = pulumi_cli.install_choice()
    if choice is False:
        raise missing
    root = pulumi_cli.managed_root()
    if not (yes or choice):
        if not sys.stdin.isatty():
            raise missing
        click.echo(f"gpucluster: {missing.message.split(': install it')[0]}", err=True)
        if not click.confirm(f"Install the Pulumi CLI {pulumi_cli.MIN_PULUMI_VERSION} into {root} now?", default=True):
            raise missing
    click.echo(f"installing the Pulumi CLI {pulumi_cli.MIN_PULUMI_VERSION} into {root} (get.pulumi.com) ...", err=True)
    cmd = pulumi_cli.install_cli()
    click.echo(f"Pulumi CLI {cmd.version} ready: {pulumi_cli.cli_source(cmd)}", err=True)
    check()


def ledger_kept_true(ledger: Ledger, code: int, what: str = "run", then: str = "") -> int:
    """The exit code once the ledger is checked to still be the file this command wrote to (issue
    45 item 11): a ledger deleted or replaced meanwhile took the record with it, said last on
    stderr and exit 3 (an interrupt's 130 says more and stays). `what`: whose record it was;
    `then`: what the user does about it."""
    from gpucluster.errors import ExitCode
    from gpucluster.home import ledger_moved

    moved = ledger_moved(ledger.path, ledger.identity, what)
    if not moved:
        return code
    click.echo(f"gpucluster: error: {moved}{'; ' + then if then else ''}", err=True)
    return code if code == int(ExitCode.INTERRUPTED) else max(int(code), int(ExitCode.LEFTOVERS))
