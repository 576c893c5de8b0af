"""`--dry-run` of `run` and `up`: what the cloud's real Pulumi program declares under Pulumi's mocks."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from gpucluster.errors import UsageError, not_allowed
from gpucluster.spec import ClusterSpec

if TYPE_CHECKING:
    from gpucluster.states import JsonObject
    from rich.console import Console

    from gpucluster.states import JsonMapping
    from gpucluster.watch.launch import JobSpec, Launcher


def print_dry_run(out: Console, launcher: Launcher | None, spec: ClusterSpec, job: JobSpec | None,
                  as_json: bool = False, shape: dict | None = None) -> int:
    """`--dry-run`: what the cloud's real Pulumi program declares under Pulumi's mock runtime,
    and what each node would run. Creates nothing, needs no credentials. The cloud's dry run
    (`infra/<cloud>/dryrun.py`) returns a dict; with a "text" entry it renders itself."""
    from gpucluster.infra.registry import plugin, provisioning

    chosen = plugin(spec.cloud)
    if chosen.ops.dry_run is None:
        raise UsageError(not_allowed("--dry-run cloud", spec.cloud, " or ".join(provisioning())))
    # each backend's own: a Pulumi program under mocks (aws, gcp), the manifests its launcher would create (kubernetes)
    d: JsonObject = dict(chosen.ops.dry_run(spec, job, launcher))
    if shape:  # the machine and GPUs planned (`--gpu`'s pick included): instance_type, gpu
        d = {**shape, **d}
    # what each node would run, where the backend says (aws: at the mocks' private IPs): the text's alone
    commands = d.pop("node_commands", None)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
        return 0
    if "text" in d:
        click.echo(d["text"])
        return 0
    _print_declared(out, d)
    _print_commands(out, commands if isinstance(commands, list) else [])
    out.print("nothing was created (dry run)")
    return 0


def _print_declared(out: Console, d: JsonMapping) -> None:
    """What the program declares: the resources, instances, security group, node role, AMI, user data, tags."""
    out.print(f"[bold]dry run[/bold]: {d['resource_count']} resources would be declared ({d['note']})")
    for typ, n in d["resources"].items():
        out.print(f"  {n:>3} × {typ}", highlight=False)
    inst = d.get("instances") or {}
    if inst:
        out.print(f"instances: {inst['count']} × {inst['type']}, root {inst['root']}, IMDSv2 {inst['imds']}, "
                  f"shutdown={inst['shutdown']}, spot={inst['spot']}", highlight=False)
        if inst.get("launch"):
            out.print(f"launch: {inst['launch']}", highlight=False)
    _print_access(out, d)
    out.print(f"AMI filter: {json.dumps(d.get('ami_filter'))}", highlight=False)
    ud = d.get("user_data") or {}
    if ud:
        out.print(f"user data: runcmd {ud['runcmd']}; files {ud['files']}; host key: {ud['host_key']}", highlight=False)
    out.print(f"tags: {json.dumps(d.get('tags'))}", highlight=False)


def _print_access(out: Console, d: JsonMapping) -> None:
    """The security group's rules and what the node role grants."""
    for r in d.get("security_group_rules", []):
        out.print(f"security group {r['direction']}: {r['protocol']} ports {r['ports']} "
                  f"{'from' if r['direction'] == 'ingress' else 'to'} {r['peer']}  ({r['description']})", highlight=False)
    for a in d.get("object_access") or []:
        out.print(f"node role grants: {', '.join(a['actions'])} on {', '.join(a['resources'])}"
                  + (f" if {json.dumps(a['condition'])}" if a.get("condition") else ""), highlight=False)


def _print_commands(out: Console, commands: list[object]) -> None:
    """What each node would run (at the mocks' private IPs)."""
    if commands:
        out.print("per-node commands (private IPs are the mocks'):")
        for rank, cmd in enumerate(commands):
            out.print(f"  node {rank}: {cmd}", highlight=False, soft_wrap=True, markup=False)
