"""`gpucluster up`: create a cluster and leave it running, through the run lifecycle's bookkeeping."""

from __future__ import annotations

import json

import click

from gpucluster.cli import common
from gpucluster.errors import GpuclusterError, UsageError, not_allowed
from gpucluster.infra.registry import NAMES, plugin, provisioning


class _UpUI:
    """What the lifecycle reports while `up` provisions: only its messages are shown."""

    def __init__(self, out):
        self.out = out

    def phase(self, name: str) -> None:
        pass

    def line(self, node_rank: int, text: str) -> None:
        pass

    def metric(self, node_rank: int, record: dict) -> None:
        pass

    def message(self, text: str) -> None:
        self.out.print(f"[yellow]{text}[/yellow]")


@click.command()
@click.option("--cloud", default="aws", show_default=True, metavar="|".join(provisioning()),
              help="Where the cluster is created.")
@click.option("--nodes", "-n", default="2", show_default=True)
@click.option("--gpus-per-node", default=None)
@click.option("--name", default=None, help="Cluster name [default: gpucluster-CLOUD].")
@click.option("--region", default=None)
@click.option("--zone", default=None)
@click.option("--instance-type", "--machine-type", "instance_type", default=None)
@click.option("--spot", is_flag=True)
@click.option("--disk-gb", default="100", show_default=True)
@click.option("--max-lifetime", default="240", show_default=True,
              help="Minutes after which the nodes power themselves off, even if this machine is gone.")
@click.option("--ssh-cidr", default=None, help="Who may SSH to the nodes (e.g. 203.0.113.7/32).")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Cloud option, as in the stack file (repeatable), e.g. --option efa=true.")
@click.option("--dry-run", is_flag=True, help="Show what would be declared (the real Pulumi program under "
              "Pulumi's mocks) and the estimate; create nothing, need no credentials.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating billable resources.")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as JSON (secrets left out).")
@click.option("--project", default=None, help="gcp: the project [default: stack config, GOOGLE_PROJECT... env, "
              "gcloud config, then the ADC project].")
def up(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime, ssh_cidr, tags,
       options, dry_run, yes, as_json, project):
    """Create a cluster and leave it running (remove it with `gpucluster down NAME`).

    \b
    Example:
      gpucluster up --cloud aws --nodes 2 --instance-type g5.xlarge --ssh-cidr 203.0.113.7/32
    """
    from gpucluster.cli.args import build_spec, check_cloud_flags, resolve_spec
    from gpucluster.spec import new_run_id, resolve, validate

    clouds = provisioning()
    if cloud not in clouds:
        others = [n for n in NAMES if n not in clouds]
        raise UsageError(not_allowed("cloud", cloud, clouds)
                         + (f"; {' and '.join(others)} clusters need no `up`: use `gpucluster run`"
                            if cloud in NAMES else ""))
    check_cloud_flags(cloud)  # e.g. --ssh-cidr with gcp: GKE would ignore it
    run_id = new_run_id()
    spec = build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime,
                      ssh_cidr, tags, (), run_id, options)
    chosen = plugin(cloud)  # the one look-up of this command
    validate(spec, chosen)
    spec = resolve(spec, chosen)  # the location actually used, defaults included: stored and checked later
    spec = chosen.with_project(spec, project, required=not dry_run)
    provider = common.provider_for(cloud)
    spec, warnings = resolve_spec(spec, dry_run=dry_run)
    out = common.console(stderr=as_json)
    common.print_notes(out, warnings)
    if dry_run:
        from gpucluster.cli.dryrun import print_dry_run

        hourly = common.hourly(spec)
        out.print(f"[bold]plan[/bold]: create {spec.nodes} node(s) on {cloud} as cluster {spec.name}, "
                  + (f"about {common.money(hourly)}/hour" if hourly is not None else "no price known here"))
        return print_dry_run(out, provider, None, spec, None, as_json)
    ledger = common.ledger()
    ledger.check()  # read-only or damaged: said before anything is asked or created
    provider.preflight()  # a missing Pulumi CLI is reported before anything is asked or recorded
    hourly = common.hourly(spec)
    rate = f"about {common.money(hourly)}/hour" if hourly is not None else "billed by the hour (no price known here)"
    out.print(f"[bold]plan[/bold]: create {spec.nodes} node(s) on {cloud} as cluster {spec.name}, "
              f"{rate} until `gpucluster down {spec.name}`")
    common.confirm("Create the cluster (it bills until you run `gpucluster down`)?", yes)

    snapshot = None
    try:
        from gpucluster import cost

        snapshot = cost.price_snapshot(spec)
    except (ImportError, GpuclusterError, AttributeError):
        pass
    from gpucluster.lifecycle import provision_only

    cluster = provision_only(spec, ledger=ledger, provider=provider, ui=_UpUI(out), prices=snapshot)
    nodes_out = [{"rank": n.rank, "host": n.host, "private_ip": n.private_ip, "user": n.user,
                  "instance_id": n.instance_id, "gpus": n.gpus} for n in cluster.nodes]
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "cluster": cluster.name, "cloud": cloud, "region": cluster.region,
                               "zone": cluster.zone, "nodes": nodes_out, "outputs": cluster.outputs,
                               "hourly_usd": None if hourly is None else str(hourly)}, indent=2, default=str))
        return 0
    from rich.table import Table

    t = Table(title=f"cluster {cluster.name} ({cloud} {cluster.zone or cluster.region or ''})", show_edge=False,
              title_justify="left")
    for col in ("rank", "host", "private ip", "id", "gpus"):
        t.add_column(col)
    for n in nodes_out:
        t.add_row(str(n["rank"]), n["host"] or "-", n["private_ip"] or "-", n["instance_id"] or "-", str(n["gpus"]))
    out.print(t)
    out.print(f"hourly cost: {rate} while it runs; remove it with: gpucluster down {cluster.name}")
    return 0
