"""`gpucluster doctor`: what cloud runs need, each check with a fix. The checks every cloud shares
(state directory, ssh client, Pulumi CLI and plugins) are here; each backend adds its own
(`Operations.doctor`: credentials, quotas)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from gpucluster.errors import ExitCode, GpuclusterError, UsageError
from gpucluster.infra.registry import provisioning

if TYPE_CHECKING:
    from gpucluster.states import JsonObject


def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    """ok: True passed, False failed (with a fix), None skipped/informational."""
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def check_ssh() -> JsonObject:
    import shutil
    import subprocess

    path = shutil.which("ssh")
    if not path:
        return _check("ssh client", False, "`ssh` is not on PATH (AWS and ssh clusters launch over OpenSSH)",
                      "install OpenSSH: `sudo apt-get install openssh-client` / `brew install openssh`")
    try:
        version = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=10).stderr.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = path
    return _check("ssh client", True, version or path)


def pulumi_plugins() -> list[str]:
    """The Pulumi plugins the backends' programs need."""
    from gpucluster.infra.pulumi.cloud import plugins_needed
    from gpucluster.infra.registry import plugins

    return plugins_needed(plugins().values())


def check_pulumi(pulumi_command: Any = None) -> list[JsonObject]:
    from gpucluster.infra.pulumi import engine as automation

    try:
        cmd = automation.load_cli(pulumi_command)
    except GpuclusterError as exc:
        return [_check("pulumi CLI", False, exc.message.split(":")[0],
                       f"`curl -fsSL https://get.pulumi.com | sh` (needs {automation.MIN_PULUMI_VERSION}+; "
                       f"{automation.INSTALL_URL}), or `gpucluster up`/`run` installs it into the gpucluster home "
                       "when you agree")]
    from gpucluster.infra.pulumi.cli import cli_source

    checks = [_check("pulumi CLI", True, f"version {cmd.version}, {cli_source(cmd)} "
                                          f"(needs {automation.MIN_PULUMI_VERSION}+)")]
    try:
        res = cmd.run(["plugin", "ls", "--json"], os.getcwd(), {"PULUMI_SKIP_UPDATE_CHECK": "true"})
        names = sorted({p.get("name") for p in json.loads(res.stdout or "[]")})
        missing = [p for p in pulumi_plugins() if p not in names]
        detail = f"installed: {', '.join(names) or 'none'}"
        if missing:
            detail += f"; not yet: {', '.join(missing)} (installed automatically by the first `up`)"
        checks.append(_check("pulumi plugins", None if missing else True, detail))
    except Exception as exc:  # noqa: BLE001 - informational
        checks.append(_check("pulumi plugins", None, f"could not list plugins ({exc})"))
    return checks


def check_home() -> JsonObject:
    from gpucluster.infra.pulumi import engine as automation

    try:
        path = automation.passphrase_file()
    except GpuclusterError as exc:
        return _check("state directory", False, exc.message, exc.message.rsplit("fix it with: ", 1)[-1])
    return _check("state directory", True, f"{path.parent} (Pulumi passphrase file mode 0600)")


@click.command()
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(provisioning()),
              help="Check only this cloud (repeatable) [default: both].")
@click.option("--region", default=None, help="Region for the quota check [default: aws: us-east-1, as `run`; "
              "gcp: us-central1].")
@click.option("--project", default=None, help="gcp: the project to check [default: the usual resolution order].")
@click.option("--nodes", "-n", default=None, help="The nodes a run would ask for, checked against the quotas [default: 2].")
@click.option("--instance-type", default=None, help="The type a run would launch [default: aws g5.xlarge, gcp n1-standard-4].")
@click.option("--gpu", default=None, metavar="TYPE[:COUNT]", help="The GPU a run would ask for (as `run --gpu`): "
              "each cloud checks the machine it would pick, with that machine's quota (aws: P or G/VT; gcp: the GPU's "
              "metric).")
@click.option("--spot", is_flag=True, help="Check the spot quotas (aws L-3819A6DF, gcp the preemptible ones) instead of on-demand.")
@click.option("--json", "as_json", is_flag=True, help="The checks as JSON.")
def doctor(clouds, region, project, nodes, instance_type, gpu, spot, as_json):
    """Check what cloud runs need: credentials, Pulumi CLI and plugins, APIs and GPU quotas, ssh client.

    \b
    Example:
      gpucluster doctor --cloud aws --region us-west-2
    """
    from gpucluster.spec import parse_int
    from gpucluster.infra.registry import plugin

    from gpucluster.lifecycle.prepare import check_place

    wanted = [c for c in provisioning() if not clouds or c in clouds]
    region = next(iter(check_place({c: plugin(c) for c in wanted}, regions=(region,) if region is not None else (),
                                   project=project, instance_type=instance_type)), None)  # as `run` refuses them
    from gpucluster.infra.pulumi.cli import pulumi_dir

    pulumi_dir()  # the home, or a file where its Pulumi folder belongs: one line, exit 2, as `run` says it
    n_nodes = None if nodes is None else parse_int("nodes", nodes, low=1, high=64)
    checks = [check_home(), check_ssh(), *check_pulumi()]
    for c in wanted:
        itype = instance_type
        if gpu is not None:
            itype, note = _machine_for(plugin(c), c, gpu, instance_type, region if len(wanted) == 1 else None, spot,
                                       strict=len(wanted) == 1)
            if itype is None:
                checks.append(_check(f"{c} --gpu {gpu}", None, note))
                continue
        # --region names one cloud's region: with several clouds each uses it only if it says so
        checks += plugin(c).ops.doctor(region, project, len(wanted) == 1, nodes=n_nodes, instance_type=itype,
                                       spot=spot)
    if as_json:
        click.echo(json.dumps(checks, indent=2))
    else:
        for row in checks:
            mark = {True: "ok  ", False: "FAIL", None: "note"}[row["ok"]]
            click.echo(f"{mark}  {row['check']}: {row['detail']}")
            if row["fix"]:
                click.echo(f"      fix: {row['fix']}")
    return int(ExitCode.FAILURE if any(row["ok"] is False for row in checks) else ExitCode.OK)


def _machine_for(backend, cloud, gpu, instance_type, region, spot, *, strict):
    """(the machine `run --gpu` would pick on `cloud`, None) or (None, why not) where the cloud lacks the GPU;
    with one cloud asked (`strict`) a refusal is the command's (one line, exit 2), as `run` says it."""
    from gpucluster.catalog.gpus import combine
    from gpucluster.errors import SpecError
    from gpucluster.spec import ClusterSpec, resolve

    accelerator, count = combine(gpu, None)
    if instance_type is not None:
        raise UsageError(f"--gpu {gpu} and --instance-type {instance_type} both pick the machine: give one of them")
    try:
        spec = resolve(ClusterSpec(cloud=cloud, nodes=1, region=region, accelerator=accelerator, gpus_per_node=count,
                                   spot=bool(spot)), backend)
        spec, _ = backend.spec.prepare(spec, detect=None)
    except SpecError as exc:
        if strict:
            raise
        return None, exc.message
    return spec.instance_type, ""
