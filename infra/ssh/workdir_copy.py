"""The ssh launcher's copy of what a job wrote in its working folder on a node (beside the
output folder, which `Session.copy_outputs` copies): `gpucluster/node/workdir.py`, shipped with the
job, chooses the files on the node and streams them as tar over the run's master connection."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gpucluster.errors import LaunchError
from gpucluster.events import RunEvents
from gpucluster.states import JsonObject
from gpucluster.watch.launch import JobSpec

from . import objects
from .session import HeldRun, Session, node_label

if TYPE_CHECKING:
    from gpucluster.domain import Node
    from gpucluster.watch.outputs import NodeOutputs

PROGRAM = "workdir.py"  # in each node's run folder, beside reaper.py (ship.bundle)


def copy_workdir(session: Session, node: Node, program: str, args: list[str], dest: Path) -> tuple[int, int, list[str]]:
    """What the job wrote in its working folder on the node, streamed into `dest` here: the
    node's Python runs `program` (gpucluster/node/workdir.py, shipped with the job) with `args`;
    its tar stream is unpacked by `gpucluster.watch.outputs.extract_stream` (same rules as the
    output folder). (files, bytes, problems): problems name what did not come back."""
    from gpucluster.watch.outputs import named, remove_if_empty, workdir_problems

    script = f"exec {shlex.quote(session.launcher.python)} {shlex.quote(program)} {shlex.join(args)}"
    tally, broken, rc, stderr = session.receive_tar(node, script, dest)
    problems: list[str] = [broken] if broken else []
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    answer: JsonObject = {}
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        pass
    if rc == 255:
        problems.append(session.explain(node, stderr))
    elif rc != 0 or not isinstance(answer, dict) or "files" not in answer:
        problems.append(f"the copy program exited with code {rc}" + (": " + "; ".join(lines[-3:]) if lines else ""))
        answer = {}
    problems += workdir_problems(answer, None if not args else _limit(args))
    if tally["refused"]:
        problems.append(named("refused (links, devices, paths outside)", tally["refused"]))
    remove_if_empty(dest)
    return tally["files"], tally["bytes"], problems



def push_workdirs(held: HeldRun, job: JobSpec, results: list[NodeOutputs], *, tool_files: Sequence[str], shipped: str) -> None:
    """`--output s3://...`: each node uploads what its job wrote in its working folder (chosen by
    workdir.py, as for a copy home) with its own transfer program; folded into its verdict. `held`:
    the launcher's connections and node folders; `tool_files`: what gpucluster put in a run folder
    (never the job's); `shipped`: the mark the job's own files are newer than."""
    from gpucluster.watch.outputs import WORKDIR_STAGE, add_workdir, workdir_args, workdir_push_script, workdir_pushed
    from gpucluster.watch.outputs import workdir_url

    transfer = held.session.launcher.objects
    by_rank = {r.node_rank: r for r in results}

    def one(node: Node) -> tuple[None, None]:
        res, cwd = by_rank.get(node.rank), held.cwds.get(node.rank)
        if res is None or not cwd or transfer is None:
            return None, None
        d, py = held.dirs[node.rank], held.session.launcher.python
        tool = () if cwd != d else (*tool_files, WORKDIR_STAGE)
        where = workdir_url(str(job.output_dir), job.run_id, node.rank)
        stage = f"{d}/{WORKDIR_STAGE}"
        script = workdir_push_script(py, f"{d}/{PROGRAM}", workdir_args(job, cwd, f"{d}/{shipped}", tool, held.out_dirs[node.rank]), stage,
                                     transfer.script(py, "push", stage, where))
        start, who = time.monotonic(), f"node {node.rank} ({node_label(node)})"
        try:
            cp = held.session.run(node, script, timeout=objects.TRANSFER_TIMEOUT_S)
        except LaunchError as exc:  # the node stopped answering: nothing of its working folder is known to be up
            add_workdir(res, 0, 0, [f"{who}: upload to {where} failed: {exc}"])
            return None, None
        add_workdir(res, *workdir_pushed(where, who, cp.returncode, cp.stdout.decode("utf-8", "replace"),
                                         cp.stderr.decode("utf-8", "replace"), time.monotonic() - start,
                                         job.collect_limit))
        return None, None

    held.session.each(one)


def lay_back(session: Session, job: JobSpec, rel: str, dirs: dict[int, str], events: RunEvents) -> None:
    """--resume: the chosen node's working-folder files, staged under resume/, copied into every
    node's working folder (writable copies, not the cache's read-only links); LaunchError naming
    each node where it failed."""
    from gpucluster.watch.launch import resume_record
    from gpucluster.watch.staging import RESUME_DEST

    python = session.launcher.python

    def one(node: Node) -> tuple[JsonObject | None, str | None]:
        d = dirs[node.rank]
        cp = session.run(node, f"exec {shlex.quote(python)} {shlex.quote(f'{d}/{PROGRAM}')} "
                               f"{shlex.quote(f'{d}/code')} --lay-back "
                               f"{shlex.quote(f'{d}/code/{RESUME_DEST}/{rel}')}", timeout=600)
        if cp.returncode != 0:
            return None, (f"node {node.rank} ({node_label(node)}): laying back the resumed files failed: "
                          + cp.stderr.decode("utf-8", "replace").strip()[-300:])
        return json.loads(cp.stdout.decode().strip().splitlines()[-1]), None

    done = session.each(one)
    errors = [err for _, err in done if err]
    if errors:
        raise LaunchError("; ".join(errors))
    for node, (got, _) in zip(session.nodes, done):
        if got is None:  # (each node answered: an error was raised above)
            continue
        events.on_metric(node.rank, resume_record(job, got["files"], got["bytes"]))


def _limit(args: list[str]) -> int | None:
    """The --limit value in workdir.py's arguments."""
    return int(args[args.index("--limit") + 1]) if "--limit" in args else None
