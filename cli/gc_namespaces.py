"""`gpucluster gc --cloud kubernetes --namespace NS`: the objects labelled managed-by=gpucluster in the namespaces
named, in an existing cluster other people use. This home's (their gpucluster-owner label is its installation id)
are listed, deleted after asking, and read back; other owners' are listed as "not ours" and left alone."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

import click

from gpucluster.cli import common
from gpucluster.errors import ExitCode
from gpucluster.domain import Leftover
from gpucluster.states import TeardownVerdict

if TYPE_CHECKING:
    from rich.console import Console


# the kubernetes backend's sweep: (context, namespace, owner, delete) -> (ours, not ours, errors)
Sweeper = Callable[[str | None, str, str, bool], tuple[list[Leftover], list[Leftover], list[str]]]
Found = dict[str, tuple[list[Leftover], list[Leftover]]]  # namespace -> (ours, not ours)


def sweep_namespaces(cloud: str, context: str | None, namespaces: tuple[str, ...], *, yes: bool, as_json: bool) -> int:
    from gpucluster.infra.registry import plugin
    from gpucluster.ownership import installation_id

    chosen = plugin(cloud)
    sweep = chosen.ops.sweep
    assert sweep is not None
    owner = installation_id()
    out = common.console(stderr=as_json)
    found = _listed(out, sweep, context, namespaces, owner)
    mine = [lo for ours, _ in found.values() for lo in ours]
    errors: list[str] = []
    if mine:
        errors = _deleted(out, sweep, context, namespaces, owner, found, mine, yes)
    left = [lo for ours, _ in found.values() for lo in ours]
    not_ours = [lo for _, theirs in found.values() for lo in theirs]
    _print_verdict(out, namespaces, errors, left, mine, not_ours)
    if as_json:
        click.echo(json.dumps({"verdict": TeardownVerdict.LEFTOVERS if left else TeardownVerdict.VERIFIED,
                               "found": [lo.to_dict() for lo in mine], "left": [lo.to_dict() for lo in left],
                               "errors": errors, "not_ours": [lo.to_dict() for lo in not_ours]}, indent=2))
    return int(ExitCode.LEFTOVERS if left else ExitCode.OK)


def _listed(out: Console, sweep: Sweeper, context: str | None, namespaces: tuple[str, ...], owner: str) -> Found:
    """Each namespace's objects, ours and not ours (those are said and left alone)."""
    from gpucluster.ownership import not_ours_line

    found: Found = {}
    for ns in namespaces:
        ours, theirs, _ = sweep(context, ns, owner, False)
        found[ns] = (ours, theirs)
        for lo in theirs:
            out.print(f"  left alone: {not_ours_line(lo)}", highlight=False)
    return found


def _deleted(out: Console, sweep: Sweeper, context: str | None, namespaces: tuple[str, ...], owner: str,
             found: Found, mine: list[Leftover], yes: bool) -> list[str]:
    """Ours listed, deleted after asking and read back (`found` updated); the errors of deleting."""
    errors: list[str] = []
    for lo in mine:
        out.print(f"  {lo.kind:<16} {lo.id:<50} run {lo.run_id or '?'}", highlight=False)
    common.confirm(f"Delete these {len(mine)} object(s) of this home's runs?", yes)
    for ns in namespaces:
        if found[ns][0]:
            ours, theirs, errs = sweep(context, ns, owner, True)  # deleted, then read back
            found[ns] = (ours, theirs)
            errors += errs
    return errors


def _print_verdict(out: Console, namespaces: tuple[str, ...], errors: list[str], left: list[Leftover],
                   mine: list[Leftover], not_ours: list[Leftover]) -> None:
    where = f"namespace(s) {', '.join(namespaces)}"
    for err in errors:
        out.print(f"[red]could not delete {err}[/red]")
    if left:
        for lo in left:
            out.print(f"[red]  still exists: {lo.kind} {lo.id}[/red]", highlight=False)
        out.print(f"[bold red]gc: LEFTOVERS ({where}): {len(left)} object(s) of ours still exist[/bold red]")
    else:
        gone = f"deleted {len(mine)} object(s); " if mine else ""
        alone = f"; {len(not_ours)} not ours left alone" if not_ours else ""
        out.print(f"[green]gc: verified ({where}): {gone}nothing labelled managed-by=gpucluster that is ours is "
                  f"left{alone}[/green]")
