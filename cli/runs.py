"""`gpucluster run`, `runs` and `show`."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys

import click

from gpucluster.errors import SpecError, UsageError, not_allowed
from gpucluster.spec import CLOUDS, max_nodes, ClusterSpec, parse_int

WORKLOADS = ("digits", "mnist", "synthetic")


from gpucluster.cli.console import make_console as _console  # noqa: E402


def parse_tags(values: tuple[str, ...]) -> dict[str, str]:
    from gpucluster.spec import is_reserved_tag, reserved_tag_error

    tags = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(not_allowed("tag", item, "KEY=VALUE"))
        if is_reserved_tag(key):
            raise UsageError(reserved_tag_error(key.strip(), "--tag key"))
        tags[key.strip()] = value.strip()
    return tags


# Flags that only some clouds use: elsewhere they would be silently ignored, so they are refused.
# parameter name -> (flag as written in --help, clouds that use it)
CLOUD_ONLY_FLAGS = {
    "region": ("--region", ("aws", "gcp")),
    "zone": ("--zone", ("aws", "gcp")),
    "instance_type": ("--instance-type/--machine-type", ("aws", "gcp")),
    "spot": ("--spot", ("aws", "gcp")),
    "disk_gb": ("--disk-gb", ("aws", "gcp")),
    "max_lifetime": ("--max-lifetime", ("aws",)),  # GKE nodes have no self-shutdown timer
    "ssh_cidr": ("--ssh-cidr", ("aws",)),  # GKE nodes are reached through the Kubernetes API
    "tags": ("--tag", ("aws", "gcp")),
    "hosts": ("--hosts", ("ssh",)),
    "identity": ("--identity", ("ssh",)),  # aws: the cluster's own key
    "known_hosts": ("--known-hosts", ("ssh",)),  # aws: the stack's pinned host keys
    "remote_python": ("--remote-python", ("ssh", "aws")),
    "keep": ("--keep", ("aws", "gcp")),  # local/ssh processes are always stopped (lifecycle._teardown)
    "ready_timeout": ("--ready-timeout", ("aws",)),  # waiting for ssh and the DLAMI's first boot
    "project": ("--project", ("gcp",)),  # a GCP project
    "start_deadline": ("--start-deadline", ("gcp",)),  # GKE pods' scheduling deadline
}

_WHY_NOT = {"local": "local runs use this machine as it is", "ssh": "the ssh backend uses machines that already exist",
            "aws": "aws nodes are created and reached by gpucluster itself",
            "gcp": "gcp runs on GKE pods reached through the Kubernetes API"}


def check_cloud_flags(cloud: str, ctx: click.Context | None = None) -> None:
    """Refuse (exit 2) a flag the chosen cloud would silently ignore, naming it."""
    from click.core import ParameterSource

    if cloud not in CLOUDS:
        return
    ctx = ctx or click.get_current_context()
    for param, (flag, clouds) in CLOUD_ONLY_FLAGS.items():
        if param not in ctx.params or cloud in clouds:
            continue
        source = ctx.get_parameter_source(param)
        if source is None or source == ParameterSource.DEFAULT:
            continue
        raise UsageError(f"{flag} does not apply to --cloud {cloud} ({_WHY_NOT[cloud]}); "
                         f"it is used with --cloud {' or '.join(clouds)} only: remove it")


def workload_argv(workload: str | None, workload_args: str, epochs: str | None,
                  command: tuple[str, ...] = ()) -> list[str]:
    """--workload-args split like a shell would, checked against the workload's own parser."""
    if command and (workload_args or epochs is not None):
        flag = "--workload-args" if workload_args else "--epochs"
        raise UsageError(f"{flag} is for built-in workloads (--workload); with a command after --, put the "
                         "arguments after the command")
    try:
        wl_args = shlex.split(workload_args) if workload_args else []
    except ValueError as exc:
        raise UsageError(f"--workload-args {workload_args!r} cannot be split into arguments ({exc}); "
                         "check the quotes") from None
    if epochs is not None:
        wl_args = ["--epochs", str(parse_int("epochs", epochs, low=1, high=100000))] + wl_args
    if workload and wl_args:
        from gpucluster.workloads.args import check_args

        problem = check_args(workload, wl_args)
        if problem:
            raise UsageError(f"--workload-args {workload_args!r} is refused by the {workload} workload: {problem} "
                             f"(see: python -m gpucluster.workloads.{workload} --help)")
    return wl_args


def check_ssh_files(identity: str | None, known_hosts: str | None) -> None:
    """Key and known_hosts files must exist before anything is recorded or started."""
    for flag, value, what in (("--identity", identity, "an ssh private key file"),
                              ("--known-hosts", known_hosts, "an OpenSSH known_hosts file")):
        if value is None:
            continue
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            state = "is a directory" if os.path.isdir(path) else "does not exist"
            raise UsageError(f"{flag} {value!r} {state}; give {what}")
        if not os.access(path, os.R_OK):
            raise UsageError(f"{flag} {value!r} cannot be read; give {what} you can read")


def parse_options(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Repeatable `--option KEY=VALUE` -> spec options; the cloud's `validate_spec` checks the
    keys and values against the same schema as the stack file's `gpucluster:` options."""
    opts: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(not_allowed("option", item, "KEY=VALUE, e.g. --option efa=true"))
        opts[key.strip()] = value.strip()
    return tuple(sorted(opts.items()))


def resolve_spec(provider, spec: ClusterSpec, *, dry_run: bool = False) -> tuple[ClusterSpec, list[str]]:
    """The provider's pre-plan resolution (aws: SSH CIDR from this machine's public IPv4, GPUs
    per node from the type), re-validated. In a dry run a failed detection is a note, not an
    error: nothing is created."""
    from gpucluster.spec import validate

    resolve = getattr(provider, "resolve_spec", None)
    notes: list[str] = []
    if resolve:
        try:
            spec, notes = resolve(spec)
        except SpecError as exc:
            if not dry_run:
                raise
            spec, notes = resolve(spec, detect=None)
            notes.append(f"{exc.message} (a real run stops here with exit code 2; this preview has no SSH rule)")
    return spec, [*validate(spec), *notes]


def print_dry_run(out, provider, launcher, spec: ClusterSpec, job, as_json: bool = False) -> int:
    """`--dry-run`: what the cloud's real Pulumi program declares under Pulumi's mock runtime,
    and what each node would run. Creates nothing, needs no credentials. The cloud's dry run
    (`infra/<cloud>_dryrun.py`) returns a dict; with a "text" entry it renders itself."""
    dry = getattr(provider, "dry_run", None)
    if dry is None:
        raise UsageError(not_allowed("--dry-run cloud", spec.cloud, "aws or gcp"))
    d = dry(spec, job=job, launcher=launcher)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
        return 0
    if "text" in d:
        click.echo(d["text"])
        return 0
    out.print(f"[bold]dry run[/bold]: {d['resource_count']} resources would be declared ({d['note']})")
    for typ, n in d["resources"].items():
        out.print(f"  {n:>3} × {typ}", highlight=False)
    inst = d.get("instances") or {}
    if inst:
        out.print(f"instances: {inst['count']} × {inst['type']}, root {inst['root']}, IMDSv2 {inst['imds']}, "
                  f"shutdown={inst['shutdown']}, spot={inst['spot']}", highlight=False)
    for r in d.get("security_group_rules", []):
        out.print(f"security group {r['direction']}: {r['protocol']} ports {r['ports']} "
                  f"{'from' if r['direction'] == 'ingress' else 'to'} {r['peer']}  ({r['description']})", highlight=False)
    out.print(f"AMI filter: {json.dumps(d.get('ami_filter'))}", highlight=False)
    ud = d.get("user_data") or {}
    if ud:
        out.print(f"user data: runcmd {ud['runcmd']}; files {ud['files']}; host key: {ud['host_key']}", highlight=False)
    out.print(f"tags: {json.dumps(d.get('tags'))}", highlight=False)
    outputs = d.get("outputs") or {}
    preview = getattr(launcher, "preview_commands", None)
    if preview and outputs.get("private_ips"):
        out.print("per-node commands (private IPs are the mocks'):")
        for rank, cmd in enumerate(preview(job, outputs["private_ips"], int(outputs.get("gpus_per_node") or 0))):
            out.print(f"  node {rank}: {cmd}", highlight=False, soft_wrap=True)
    out.print("nothing was created (dry run)")
    return 0


def check_command(command: tuple[str, ...]) -> None:
    """A `--` command must exist before anything starts: script file, module or executable."""
    from gpucluster.launch import JobSpec, program_args

    prog = program_args(JobSpec(run_id="check", command=command))
    if prog[0] == "--no-python":
        exe = prog[1]
        if not (shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK))):
            raise UsageError(not_allowed("command", exe, "an executable on PATH, or python SCRIPT.py / python -m MODULE"))
    elif prog[0] == "-m":
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(prog[1]) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise UsageError(not_allowed("python module", prog[1], "a module importable from the current directory"))
    elif not os.path.isfile(prog[0]):
        raise UsageError(not_allowed("script", prog[0], "a Python file that exists (path relative to the current directory)"))


def build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime,
               ssh_cidr, tags, hosts, run_id, options: tuple[str, ...] = ()) -> ClusterSpec:
    if cloud not in CLOUDS:
        raise SpecError(not_allowed("cloud", cloud, CLOUDS))
    n = parse_int("nodes", nodes, low=1, high=max_nodes(cloud))
    g = None if gpus_per_node is None else parse_int("gpus per node", gpus_per_node, low=0, high=16)
    return ClusterSpec(
        cloud=cloud, nodes=n, name=name or f"gpucluster-{cloud}", region=region, zone=zone,
        instance_type=instance_type, gpus_per_node=g, spot=spot,
        disk_gb=parse_int("disk size (GB)", disk_gb, low=10, high=16384),
        max_lifetime_minutes=parse_int("max lifetime (minutes)", max_lifetime, low=5, high=7 * 24 * 60),
        ssh_cidr=ssh_cidr, tags=tuple(sorted(parse_tags(tags).items())), hosts=tuple(hosts), run_id=run_id,
        options=parse_options(options),
    )


@click.command(context_settings=dict(ignore_unknown_options=False, allow_interspersed_args=False))
@click.option("--cloud", default="local", show_default=True, metavar="|".join(CLOUDS), help="Where the cluster runs.")
@click.option("--nodes", "-n", default=None, help="Number of nodes [default: 2; ssh: the number of --hosts]. local: at most 16.")
@click.option("--gpus-per-node", default=None, help="GPUs per node [default: all the node has; local: GPUs present / nodes].")
@click.option("--procs-per-node", default=None, help="Training processes per node [default: GPUs per node, or 1 on CPU].")
@click.option("--workload", "-w", default=None, metavar="|".join(WORKLOADS),
              help="Built-in workload (default digits when no command is given after --).")
@click.option("--epochs", default=None, help="Epochs for a built-in workload.")
@click.option("--workload-args", default="", help="More arguments for the built-in workload, e.g. \"--batch-size 64\".")
@click.option("--name", default=None, help="Cluster name [default: gpucluster-CLOUD].")
@click.option("--region", default=None)
@click.option("--zone", default=None)
@click.option("--instance-type", "--machine-type", "instance_type", default=None, help="EC2 type or GCE machine type.")
@click.option("--spot", is_flag=True, help="Spot/preemptible capacity.")
@click.option("--disk-gb", default="100", show_default=True)
@click.option("--max-minutes", default=None, help="Wall-clock limit for the job; everything is stopped past it.")
@click.option("--max-lifetime", default="240", show_default=True,
              help="Minutes after which cloud nodes power themselves off, even if this machine is gone.")
@click.option("--ssh-cidr", default=None, help="Who may SSH to cloud nodes (e.g. 203.0.113.7/32).")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Extra tag/label (repeatable).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Cloud option, as in the stack file (repeatable), e.g. --option efa=true --option image=base.")
@click.option("--dry-run", is_flag=True, help="aws/gcp: show what would be declared and run (the real Pulumi "
              "program under Pulumi's mocks) and the estimate; create nothing, need no credentials.")
@click.option("--ready-timeout", default="600", show_default=True,
              help="Seconds to wait for cloud nodes to answer ssh and report ready.")
@click.option("--hosts", default=None, help="ssh backend: user@host1,user@host2[:port], head first.")
@click.option("--identity", default=None, type=click.Path(dir_okay=False), help="ssh private key.")
@click.option("--known-hosts", default=None, type=click.Path(dir_okay=False),
              help="ssh known_hosts file [default: ~/.ssh/known_hosts]; unknown host keys are refused.")
@click.option("--remote-python", default=None, help="ssh: the Python (with torch) to run on the nodes [default: python3].")
@click.option("--threads-per-proc", default=None, help="CPU threads per training process [default: cores / processes].")
@click.option("--max-restarts", default="0", show_default=True, help="torchrun restarts (c10d restarts can hang: keep 0).")
@click.option("--project", default=None, help="gcp: the project [default: stack config, GOOGLE_PROJECT... env, "
              "gcloud config, then the ADC project].")
@click.option("--start-deadline", default="20", show_default=True,
              help="gcp: minutes every pod may take to be running (GPU nodes, driver, image); past it the run "
                   "fails with the scheduler's reason.")
@click.option("--keep", is_flag=True, help="Leave the cluster up after the run.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating billable resources.")
@click.option("--quiet", "-q", is_flag=True, help="No node logs, only progress and the report.")
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON at the end (logs go to stderr).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(cloud, nodes, gpus_per_node, procs_per_node, workload, epochs, workload_args, name, region, zone,
        instance_type, spot, disk_gb, max_minutes, max_lifetime, ssh_cidr, tags, options, dry_run, ready_timeout, hosts,
        identity, known_hosts, remote_python, threads_per_proc, max_restarts, project, start_deadline, keep, yes, quiet,
        as_json, command):
    """Provision a cluster, train on it with torchrun, tear it down, report.

    \b
    Examples:
      gpucluster run --cloud local --nodes 4
      gpucluster run --cloud local --nodes 2 --workload mnist --epochs 1
      gpucluster run --cloud local --nodes 2 -- python my_train.py --epochs 3
      gpucluster run --cloud ssh --hosts ubuntu@10.0.0.5,ubuntu@10.0.0.6 --identity ~/.ssh/id_ed25519
      gpucluster run --cloud aws --nodes 2 --dry-run
    """
    from gpucluster.infra.registry import get_backend
    from gpucluster.home import home_dir
    from gpucluster.launch import JobSpec
    from gpucluster.ledger import Ledger
    from gpucluster.lifecycle import execute
    from gpucluster.spec import new_run_id, resolve, validate

    check_cloud_flags(cloud)
    if command and workload:
        raise UsageError("give either --workload or a command after --, not both")
    if not command:
        workload = workload or "digits"
        if workload not in WORKLOADS:
            raise UsageError(not_allowed("workload", workload, WORKLOADS))
    if command and command[0] == "--":
        command = command[1:]
    host_list: tuple[str, ...] = ()
    if hosts:
        from gpucluster.infra.ssh.provider import parse_hosts

        host_list = parse_hosts(hosts)
    elif cloud == "ssh":
        raise UsageError("the ssh backend needs --hosts user@host1,user@host2[:port] (head first)")
    if nodes is None:
        nodes = str(len(host_list)) if host_list else "2"
    run_id = new_run_id()
    spec = build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb,
                      max_lifetime, ssh_cidr, tags, host_list, run_id, options)
    validate(spec)  # bad input is refused before anything is looked up
    spec = resolve(spec)  # the location actually used, defaults included: stored and checked later
    from gpucluster.infra.gcp.access import spec_with_project

    spec = spec_with_project(spec, project, required=not dry_run)
    ready_s = parse_int("ready timeout (seconds)", ready_timeout, low=10, high=6 * 3600)
    deadline_min = parse_int("start deadline (minutes)", start_deadline, low=1, high=24 * 60)
    if dry_run and cloud in ("local", "ssh"):
        raise UsageError(not_allowed("--dry-run with cloud", cloud, "aws or gcp (clouds gpucluster provisions)"))
    wl_args = workload_argv(workload, workload_args, epochs, command)
    if command:
        check_command(command)
    check_ssh_files(identity, known_hosts)
    provider, launcher = get_backend(cloud, identity=identity, known_hosts=known_hosts, remote_python=remote_python,
                                     spec_options=spec.option_dict, ready_timeout=ready_s,
                                     start_deadline_s=deadline_min * 60)
    spec, warnings = resolve_spec(provider, spec, dry_run=dry_run)
    out = _console(stderr=as_json)
    for w in warnings:
        out.print(f"[yellow]note:[/yellow] {w}" if "detected" in w else f"[yellow]warning:[/yellow] {w}")
    limit = None
    if max_minutes is not None:
        try:
            limit = float(max_minutes)
        except ValueError:
            limit = -1.0
        if not limit > 0:
            raise UsageError(not_allowed("max minutes", max_minutes, "a number of minutes > 0"))
    gpn = spec.gpus_per_node
    if procs_per_node is not None:
        nproc = parse_int("procs per node", procs_per_node, low=1, high=64)
    else:
        nproc = None
    if dry_run:
        gpn = spec.gpus_per_node
        nproc = nproc or (gpn or 1)
        job = JobSpec(run_id=run_id, command=tuple(command), workload=None if command else workload,
                      workload_args=tuple(wl_args) if not command else (), nproc_per_node=nproc,
                      max_restarts=parse_int("max restarts", max_restarts, low=0, high=10),
                      max_seconds=limit * 60 if limit else None)
        _plan(out, spec, job, nproc)
        return print_dry_run(out, provider, launcher, spec, job, as_json)
    ledger = Ledger.open_default()  # checks GPUCLUSTER_HOME before anything starts
    ledger.check()  # writable, not damaged: else the run's row could not be kept true
    home_dir()
    preflight = getattr(provider, "preflight", None)
    if preflight:
        preflight()  # e.g. the Pulumi CLI: missing or too old is said before anything is recorded

    if cloud == "local":
        from gpucluster.infra.local.catalog import gpus_present

        present = gpus_present()
        if gpn is None:
            gpn = present // spec.nodes if present else 0
            spec = spec.replace(gpus_per_node=gpn)
    nproc = nproc or (gpn or 1)
    job = JobSpec(run_id=run_id, command=tuple(command), workload=None if command else workload,
                  workload_args=tuple(wl_args) if not command else (), nproc_per_node=nproc,
                  max_restarts=parse_int("max restarts", max_restarts, low=0, high=10),
                  max_seconds=limit * 60 if limit else None,
                  threads_per_proc=None if threads_per_proc is None else parse_int(
                      "threads per process", threads_per_proc, low=1, high=1024))

    estimate = _plan(out, spec, job, nproc)
    describe = getattr(launcher, "describe", None)
    if describe:  # e.g. the image, the data and what is shipped; its errors come before anything exists
        for line in describe(spec, job):
            out.print(f"  {line}")
    if cloud not in ("local", "ssh") and not yes:
        if not sys.stdin.isatty():
            raise UsageError("this creates billable cloud resources: confirm with --yes when not on a terminal")
        if not click.confirm("Create the cluster and run?", default=False):
            raise click.exceptions.Abort()

    from gpucluster.cli.render import RichRunUI, run_report

    ui = RichRunUI(out, quiet=quiet, epochs=int(epochs) if epochs else None)
    with ui:
        outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher, ui=ui, keep=keep,
                          prices=estimate, workload=workload or _command_name(command))
    record = ledger.get_run(outcome.run_id)
    if as_json:
        click.echo(json.dumps(record, indent=2, default=str))
    else:
        out.print()
        run_report(out, record)
    return int(outcome.exit_code)


def _command_name(command: tuple[str, ...]) -> str | None:
    return os.path.basename(command[-1] if len(command) == 1 else command[1]) if command else None


def _plan(out, spec: ClusterSpec, job, nproc: int):
    """Print what will happen and what it is estimated to cost; returns the price snapshot."""
    what = job.display
    line = None
    est = None
    if spec.cloud in ("aws", "gcp"):
        try:
            from gpucluster import cost as _cost

            est = _cost.estimate(spec, 1.0)
        except (ImportError, AttributeError):
            est = None
    from gpucluster.infra.registry import backend

    line = backend(spec.cloud).plan_line(spec, nproc, getattr(est, "hourly", None))
    if line is None:
        gpus = f"{spec.gpus_per_node} GPU(s)/node" if spec.gpus_per_node else "CPU only"
        line = f"{spec.nodes} node(s) on {spec.cloud} ({gpus}, {nproc} process(es)/node)"
    out.print(f"[bold]plan[/bold]: {line}, run {job.run_id}: {what}", highlight=False)
    snapshot = None
    try:
        from gpucluster import cost
    except ImportError:
        cost = None
    if cost is not None and hasattr(cost, "price_snapshot") and spec.cloud in ("aws", "gcp"):
        snapshot = cost.price_snapshot(spec)
        est = est or cost.estimate(spec, 1.0)
        out.print(f"estimated cost: {est.render_line() if hasattr(est, 'render_line') else est}")
    elif spec.cloud in ("local", "ssh"):
        out.print("estimated cost: $0 (machines gpucluster does not rent)")
    return snapshot


@click.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100000))
@click.option("--cloud", default=None, type=click.Choice(CLOUDS))
@click.option("--status", default=None, type=click.Choice(["running", "succeeded", "failed", "interrupted"]))
@click.option("--json", "as_json", is_flag=True, help="JSON list for scripts.")
def runs(limit, cloud, status, as_json):
    """List recorded runs, newest first.

    \b
    Example:
      gpucluster runs --limit 5
    """
    from gpucluster.ledger import Ledger

    rows = Ledger.open_default().list_runs(limit=limit, cloud=cloud, status=status)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return 0
    from rich.table import Table

    from gpucluster.cli.render import fmt_secs, fmt_time

    t = Table(show_edge=False)
    for col in ("run", "started (UTC)", "cloud", "cluster", "nodes", "job", "status", "wall", "accuracy", "cost"):
        t.add_column(col)
    for r in rows:
        wall = (r["ended_at"] - r["created_at"]) if r.get("ended_at") else None
        m = r.get("metrics") or {}
        acc = f"{m['accuracy']:.2%}" if m.get("accuracy") is not None else "-"
        c = r.get("cost") or {}
        from gpucluster.cost import money

        cost = money(c["total"]) if c.get("total") is not None else "-"
        t.add_row(r["id"], fmt_time(r["created_at"]), r["cloud"], r["cluster"], str(r["nodes"]),
                  r.get("workload") or "-", r["status"], fmt_secs(wall), acc, cost)
    con = _console()
    if not rows:
        con.print("no runs recorded yet: try 'gpucluster run --cloud local --nodes 2'")
    else:
        con.print(t)
    return 0


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The whole record as JSON (metrics included).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write GPU/CPU utilisation over time (one line per node) to this PNG.")
def show(run_id, as_json, plot_path):
    """Show one run: phases, nodes, metrics, resources, teardown verdict, cost.

    \b
    Example:
      gpucluster show r20261122-031500-1a2b3c
      gpucluster show r20261122-031500-1a2b3c --plot util.png
    """
    from gpucluster.ledger import Ledger

    if plot_path:
        from gpucluster.plots import check_plot_file

        check_plot_file(plot_path, "--plot file")  # before anything is read or drawn
    ledger = Ledger.open_default()
    run = ledger.get_run(run_id, with_metrics=as_json)
    if run is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    if plot_path:
        from gpucluster.plots import plot_run

        written = plot_run(ledger, run["id"], plot_path)
        click.echo(f"utilisation plot: {written}", err=as_json)
    if as_json:
        click.echo(json.dumps(run, indent=2, default=str))
        return 0
    from gpucluster.cli.render import run_report

    con = _console()
    run_report(con, run)
    if run.get("resources"):
        from rich.table import Table

        t = Table(title="resources", show_edge=False, title_justify="left")
        for col in ("kind", "name", "id", "gone"):
            t.add_column(col)
        for r in run["resources"]:
            t.add_row(r["kind"], r["name"], r.get("cloud_id") or "-", "yes" if r["confirmed_gone"] else "NO")
        con.print(t)
    return 0
