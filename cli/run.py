"""`gpucluster run`: provision, train with torchrun, tear down, report."""

from __future__ import annotations

import json
import os
import sys

import click

from gpucluster.cli.args import WORKLOADS
from gpucluster.cli.common import console as _console
from gpucluster.errors import UsageError, not_allowed
from gpucluster.infra.registry import NAMES as CLOUDS
from gpucluster.spec import ClusterSpec, parse_int


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
@click.option("--data", "data", multiple=True, metavar="SRC[:DEST]",
              help="A local folder staged to every node (repeatable); the first is $GPUCLUSTER_DATA. DEST: relative "
                   "to the job's working directory [default: data/BASENAME]. local: used in place, read-only. "
                   "aws: also s3://BUCKET[/PREFIX][:DEST], gcp: gs://BUCKET[/PREFIX][:DEST], synced by every node "
                   "with read-only access to just that prefix (DEST after the last ':').")
@click.option("--setup", "setup", multiple=True, metavar="CMD",
              help="Shell command run on every node before training, in the job's folder and environment "
                   "(repeatable, run in order), e.g. --setup 'pip install -r requirements.txt'.")
@click.option("--output", "output", default=None, metavar="DIR|URL",
              help="Where every node's output folder (GPUCLUSTER_OUTPUT_DIR) is copied back before teardown, "
                   "as DIR/node-N: a new or empty folder [default: $GPUCLUSTER_HOME/runs/RUN_ID/outputs]. "
                   "aws: also s3://BUCKET[/PREFIX], gcp: gs://BUCKET[/PREFIX]: every node uploads its folder to "
                   "PREFIX/RUN_ID/node-N with write access to just that prefix, nothing is copied back.")
@click.option("--keep", is_flag=True, help="Leave the cluster up after the run.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating billable resources.")
@click.option("--quiet", "-q", is_flag=True, help="No node logs, only progress and the report.")
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON at the end (logs go to stderr).")
@click.option("--resume", "resume", default=None, metavar="RUN_ID",
              help="Continue an earlier run: its collected outputs are staged to every node as "
                   "$GPUCLUSTER_RESUME_DIR (like --data, DEST resume/); the built-in workloads go on after the "
                   "epoch its checkpoint holds. The ledger links the two runs.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(cloud, nodes, gpus_per_node, procs_per_node, workload, epochs, workload_args, name, region, zone,
        instance_type, spot, disk_gb, max_minutes, max_lifetime, ssh_cidr, tags, options, dry_run, ready_timeout, hosts,
        identity, known_hosts, remote_python, threads_per_proc, max_restarts, project, start_deadline, data, setup,
        output, keep, yes, quiet, as_json, resume, command):
    """Provision a cluster, train on it with torchrun, tear it down, report.

    \b
    Examples:
      gpucluster run --cloud local --nodes 4
      gpucluster run --cloud local --nodes 2 --workload mnist --epochs 1
      gpucluster run --cloud local --nodes 2 -- python my_train.py --epochs 3
      gpucluster run --cloud local --nodes 2 --epochs 8 --resume r20261122-101500-ab12cd
      gpucluster run --cloud ssh --hosts ubuntu@10.0.0.5,ubuntu@10.0.0.6 --identity ~/.ssh/id_ed25519
      gpucluster run --cloud aws --nodes 2 --dry-run
    """
    from gpucluster.cli.args import (build_spec, check_cloud_flags, check_command, check_ssh_files, resolve_spec,
                                     workload_argv)
    from gpucluster.cli.common import print_notes
    from gpucluster.infra.contract import Capability, LaunchOptions
    from gpucluster.infra.registry import plugin, provisioning
    from gpucluster.home import home_dir
    from gpucluster.launch import JobSpec
    from gpucluster.outputs import check_output_dest
    from gpucluster.ledger import Ledger
    from gpucluster.lifecycle import execute
    from gpucluster.spec import new_run_id, resolve, validate

    check_cloud_flags(cloud)
    chosen = plugin(cloud)  # the one look-up of this command: below, the plugin is passed down
    output_dir = None if output is None else check_output_dest(output, chosen)  # creates nothing
    if command and workload:
        raise UsageError("give either --workload or a command after --, not both")
    if not command:
        workload = workload or "digits"
        if workload not in WORKLOADS:
            raise UsageError(not_allowed("workload", workload, WORKLOADS))
    if command and command[0] == "--":
        command = command[1:]
    host_list = chosen.ops.host_list(hosts)  # refused elsewhere (check_cloud_flags) when not used
    if nodes is None:
        nodes = str(len(host_list)) if host_list else "2"
    run_id = new_run_id()
    spec = build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb,
                      max_lifetime, ssh_cidr, tags, host_list, run_id, options)
    validate(spec, chosen)  # bad input is refused before anything is looked up
    spec = resolve(spec, chosen)  # the location actually used, defaults included: stored and checked later
    spec = chosen.with_project(spec, project, required=not dry_run)
    ready_s = parse_int("ready timeout (seconds)", ready_timeout, low=10, high=6 * 3600)
    deadline_min = parse_int("start deadline (minutes)", start_deadline, low=1, high=24 * 60)
    if dry_run and not chosen.can(Capability.PROVISIONS):
        raise UsageError(not_allowed("--dry-run with cloud", cloud,
                                     f"{' or '.join(provisioning())} (clouds gpucluster provisions)"))
    wl_args = workload_argv(workload, workload_args, epochs, command)
    if command:
        check_command(command)
    from gpucluster.staging import parse_data, parse_setup

    mounts, setup_cmds = parse_data(data, chosen), parse_setup(setup)
    resumed_from, resume_mount = _resume(resume, mounts, chosen) if resume is not None else (None, None)
    # object-storage URLs: the cloud's component grants the nodes exactly these (read / write)
    reads = [m.src for m in mounts + ((resume_mount,) if resume_mount is not None else ()) if m.remote]
    spec = chosen.with_object_access(spec, reads, [output_dir] if isinstance(output_dir, str) else [])
    check_ssh_files(identity, known_hosts)
    provider, launcher = chosen.transport.make(LaunchOptions(
        identity=identity, known_hosts=known_hosts, remote_python=remote_python, spec_options=spec.option_dict,
        ready_timeout=ready_s, start_deadline_s=deadline_min * 60))
    if output_dir is not None and not launcher.collects_outputs:
        raise UsageError(f"--output {output!r}: copying outputs back is not supported yet with cloud {cloud} "
                         "(supported: local, ssh, aws, gcp)")
    spec, warnings = resolve_spec(spec, dry_run=dry_run)
    out = _console(stderr=as_json)
    print_notes(out, warnings)
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
                      max_seconds=limit * 60 if limit else None, setup=setup_cmds, data=mounts, resume=resume_mount,
                      # where outputs would go, as the lifecycle would set it (nothing is created)
                      output_dir=str(output_dir) if output_dir is not None else (
                          "$GPUCLUSTER_HOME/runs/RUN_ID/outputs" if launcher.collects_outputs else None))
        _plan(out, spec, job, nproc)
        from gpucluster.cli.dryrun import print_dry_run

        return print_dry_run(out, provider, launcher, spec, job, as_json)
    ledger = Ledger.open_default()  # checks GPUCLUSTER_HOME before anything starts
    ledger.check()  # writable, not damaged: else the run's row could not be kept true
    home_dir()
    provider.preflight()  # e.g. the Pulumi CLI: missing or too old is said before anything is recorded

    present = chosen.ops.known_gpus()  # local: this machine's GPUs, shared by its "nodes"
    if present is not None and gpn is None:
        gpn = present // spec.nodes if present else 0
        spec = spec.replace(gpus_per_node=gpn)
    nproc = nproc or (gpn or 1)
    job = JobSpec(run_id=run_id, command=tuple(command), workload=None if command else workload,
                  workload_args=tuple(wl_args) if not command else (), nproc_per_node=nproc,
                  max_restarts=parse_int("max restarts", max_restarts, low=0, high=10),
                  max_seconds=limit * 60 if limit else None,
                  threads_per_proc=None if threads_per_proc is None else parse_int(
                      "threads per process", threads_per_proc, low=1, high=1024),
                  setup=setup_cmds, data=mounts, resume=resume_mount,
                  output_dir=None if output_dir is None else str(output_dir))

    estimate = _plan(out, spec, job, nproc)
    # e.g. the image, the data and what is shipped; its errors come before anything exists
    for line in launcher.describe(spec, job):
        out.print(f"  {line}")
    if chosen.can(Capability.PROVISIONS) and not yes:
        if not sys.stdin.isatty():
            raise UsageError("this creates billable cloud resources: confirm with --yes when not on a terminal")
        if not click.confirm("Create the cluster and run?", default=False):
            raise click.exceptions.Abort()

    from gpucluster.cli.render import RichRunUI, run_report

    ui = RichRunUI(out, quiet=quiet, epochs=int(epochs) if epochs else None)
    with ui:
        outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher, ui=ui, keep=keep and chosen.can(Capability.PROVISIONS),
                          prices=estimate, workload=workload or _command_name(command), resumed_from=resumed_from)
    record = ledger.get_run(outcome.run_id)
    if as_json:
        click.echo(json.dumps(record, indent=2, default=str))
    else:
        out.print()
        run_report(out, record)
    return int(outcome.exit_code)


def _resume(value: str, mounts: tuple, store: object = None) -> tuple[str, object]:
    """--resume RUN_ID checked against the ledger (read only: a missing ledger is not created)."""
    from gpucluster.home import home_dir
    from gpucluster.ledger import Ledger
    from gpucluster.resume import check_dest_free, resume_source

    check_dest_free(mounts)
    path = home_dir(create=False) / "ledger.sqlite3"
    ledger = Ledger(path) if path.is_file() else None
    try:
        return resume_source(ledger, value, store)
    finally:
        if ledger is not None:
            ledger.close()


def _command_name(command: tuple[str, ...]) -> str | None:
    return os.path.basename(command[-1] if len(command) == 1 else command[1]) if command else None


def _plan(out, spec: ClusterSpec, job, nproc: int):
    """Print what will happen and what it is estimated to cost; returns the price snapshot."""
    from gpucluster.infra.contract import Capability
    from gpucluster.infra.registry import plugin

    chosen = plugin(spec.cloud)
    what = job.display
    line = None
    est = None
    priced = chosen.can(Capability.PRICED)
    if priced:
        try:
            from gpucluster import cost as _cost

            est = _cost.estimate(spec, 1.0)
        except (ImportError, AttributeError):
            est = None
    line = chosen.spec.plan_line(spec, nproc, getattr(est, "hourly", None))
    if line is None:
        gpus = f"{spec.gpus_per_node} GPU(s)/node" if spec.gpus_per_node else "CPU only"
        line = f"{spec.nodes} node(s) on {spec.cloud} ({gpus}, {nproc} process(es)/node)"
    out.print(f"[bold]plan[/bold]: {line}, run {job.run_id}: {what}", highlight=False)
    for cmd in job.setup:
        out.print(f"  setup: {cmd}", highlight=False)
    if job.resume is not None:
        out.print(f"  resumes: the outputs in {job.resume.src} as $GPUCLUSTER_RESUME_DIR", highlight=False)
    snapshot = None
    try:
        from gpucluster import cost
    except ImportError:
        cost = None
    if cost is not None and hasattr(cost, "price_snapshot") and priced:
        snapshot = cost.price_snapshot(spec)
        est = est or cost.estimate(spec, 1.0)
        out.print(f"estimated cost: {est.render_line() if hasattr(est, 'render_line') else est}")
    elif not priced:
        out.print("estimated cost: $0 (machines gpucluster does not rent)")
    return snapshot
