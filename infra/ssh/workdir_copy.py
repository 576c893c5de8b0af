"""The ssh launcher's copy of what a job wrote in its working folder on a node (beside the
output folder, which `Session.copy_outputs` copies): `gpucluster/workdir.py`, shipped with the
job, chooses the files on the node and streams them as tar over the run's master connection."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

PROGRAM = "workdir.py"  # in each node's run folder, beside reaper.py (ship.bundle)


def copy_workdir(session: Any, node: Any, program: str, args: list[str], dest: Path) -> tuple[int, int, list[str]]:
    """What the job wrote in its working folder on the node, streamed into `dest` here: the
    node's Python runs `program` (gpucluster/workdir.py, shipped with the job) with `args`;
    its tar stream is unpacked by `gpucluster.outputs.extract_stream` (same rules as the
    output folder). (files, bytes, problems): problems name what did not come back."""
    from gpucluster.outputs import named, remove_if_empty, workdir_problems

    script = f"exec {shlex.quote(session.launcher.python)} {shlex.quote(program)} {shlex.join(args)}"
    tally, broken, rc, stderr = session.receive_tar(node, script, dest)
    problems: list[str] = [broken] if broken else []
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    answer: dict[str, Any] = {}
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



def _limit(args: list[str]) -> int | None:
    """The --limit value in workdir.py's arguments."""
    return int(args[args.index("--limit") + 1]) if "--limit" in args else None
