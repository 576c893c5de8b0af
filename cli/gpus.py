"""`gpucluster gpus`: the GPUs `--gpu` takes (gpucluster/catalog/listing.py), as a table or JSON."""

from __future__ import annotations

import json

import click

from gpucluster.cli.cost import _boundary


@click.command("gpus")
@click.option("--gpu", help="Only this GPU (any case, e.g. h100, nvidia-l4).")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON (prices as strings).")
@_boundary
def gpus(gpu: str | None, as_json: bool) -> None:
    """List the GPUs `--gpu` takes: memory, clouds and machines, cheapest $/GPU-hour and where.

    \b
    Examples:
      gpucluster gpus
      gpucluster gpus --gpu H100 --json
    """
    from gpucluster.catalog.listing import gpu_listing
    from gpucluster.catalog.prices import load_catalog
    from gpucluster.infra.registry import plugins

    catalog = load_catalog()
    listing = gpu_listing(plugins(), catalog, gpu)
    if as_json:
        click.echo(json.dumps({"gpus": listing, "currency": "USD"}, indent=1))
        return
    from rich.table import Table

    from gpucluster.cli.common import console

    table = Table(title="GPUs (--gpu TYPE:COUNT; COUNT: GPUs per node)")
    for col in ("gpu", "memory", "clouds: machines (GPUs per node)", "cheapest on-demand $/GPU-h", "cheapest spot $/GPU-h"):
        table.add_column(col)

    def cheapest(entry: dict, market: str) -> str:
        c = entry["cheapest"].get(market)
        return "-" if c is None else (f"${c['per_gpu_hour']} {c['cloud']} {c['region']} {c['machine']} "
                                      f"(read {c['date']})")

    for e in listing:
        clouds = "; ".join(f"{cloud}: " + ", ".join(f"{s['machine']} ({s['gpus']}{'' if s['on_demand'] else ', spot'})"
                                                     for s in shapes) for cloud, shapes in e["clouds"].items())
        table.add_row(e["gpu"], f"{e['nominal_gb']} GB", clouds or "-", cheapest(e, "on-demand"), cheapest(e, "spot"))
    con = console()
    con.print(table)
    con.print("Prices are the catalog's (`gpucluster prices` lists every row with its source; `gpucluster prices "
              "refresh` fetches current ones). Spot prices are point in time.")
