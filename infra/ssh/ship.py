"""What the ssh launcher ships to the nodes: the run id checked as a folder name, the user's
script (its folder, when the command runs a local script: what of it `gpucluster.plan.shipping`
chooses, .gitignore and .gpuclusterignore honoured) and a tar bundle of the built-in workloads
plus that folder, bounded in size."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path
from typing import Iterator, Sequence

from gpucluster.errors import LaunchError, UsageError
from gpucluster.watch.launch import _PYTHON_RE, JobSpec, program_args
from gpucluster.plan.shipping import MAX_SHIP_BYTES, SKIP_DIRS as _SKIP_DIRS, Shipment, shipment  # noqa: F401 - re-exported
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# -- checks --------------------------------------------------------------------------
def check_run_id(run_id: str) -> None:
    if not _RUN_ID_RE.match(run_id or ""):
        raise LaunchError(f"run id {run_id!r} is not allowed: letters, digits, '.', '_' and '-' "
                          "(it names a folder on every node)")


# Python's options whose value is the next argument (`python -X faulthandler train.py`)
_PYTHON_VALUE_OPTIONS = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def user_program(job: JobSpec, python: str = "python3") -> tuple[Path | None, list[str] | None]:
    """(local folder to ship, torchrun program relative to it) when the command runs a local
    script (`python train.py`, `python -u train.py`, `./run.sh`, `bash run.sh`); (None, None)
    when it runs a module or something already on the nodes. A `python` that torchrun runs
    as a plain command becomes the nodes' Python."""
    if not job.command:
        return None, None
    prog = program_args(job)
    if prog[0] != "--no-python":
        path = Path(prog[0])
        if prog[0] == "-m" or not path.is_file():
            return None, None
        return path.resolve().parent, [path.name, *prog[1:]]
    cmd = prog[1:]
    is_python = bool(_PYTHON_RE.match(os.path.basename(cmd[0])))
    if is_python:
        cmd[0] = python
    script = None
    if not is_python and "/" in cmd[0] and Path(cmd[0]).is_file():
        script = 0
    else:
        takes_value = False
        for j, arg in enumerate(cmd[1:], start=1):
            if takes_value:  # the value of `-X opt` / `-W arg`, not the script
                takes_value = False
                continue
            if arg.startswith("-"):
                if arg in ("-m", "-c"):
                    break
                takes_value = is_python and arg in _PYTHON_VALUE_OPTIONS
                continue
            script = j if Path(arg).is_file() else None
            break
    if script is None:
        return None, ["--no-python", *cmd]
    path = Path(cmd[script])
    cmd[script] = "./" + path.name if script == 0 else path.name
    return path.resolve().parent, ["--no-python", *cmd]


def bundle(code_dir: Path | None, extra: Sequence[str] = ()) -> bytes:
    """A tar of workloads/ (the built-in workload scripts) and code/ (the user's script folder),
    the node programs, and `extra` files (a backend's own node programs, by their base name)."""
    import gpucluster.workloads as workloads

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(Path(workloads.__file__).parent.glob("*.py")):
            tar.add(f, arcname=f"workloads/{f.name}")
        from gpucluster.node import reaper

        tar.add(reaper.__file__, arcname="reaper.py")  # the node supervisor (stdlib only)
        from gpucluster.node import workdir

        tar.add(workdir.__file__, arcname="workdir.py")  # chooses what the job wrote, to copy back (stdlib only)
        from gpucluster.node import node_check

        tar.add(node_check.__file__, arcname="node_check.py")  # the health check (torch + stdlib)
        from gpucluster.watch.launch import PG_HOOK_DIR, pg_hook_file

        tar.add(pg_hook_file(), arcname=f"{PG_HOOK_DIR}/sitecustomize.py")  # did a rank join a process group (stdlib)
        for path in extra:
            tar.add(path, arcname=os.path.basename(path))
        # digits' data (~60 KB) goes with the scripts, so a node needs only torch
        from gpucluster.workloads.digits_data import local_digits_file

        digits = local_digits_file()
        if digits:
            tar.add(digits, arcname="workloads/data/digits.csv.gz")
        if code_dir is not None:
            ship = shipment(code_dir)
            try:
                ship.check_limit()
            except UsageError as exc:
                raise LaunchError(exc.message) from None
            for entry in ship.entries:
                tar.add(code_dir / entry.rel, arcname=f"code/{entry.rel}", recursive=False)
            from gpucluster.node.workdir import shipped_list

            # the shipped list (size, content) as the marker the job's own files are told from (workdir.py)
            listed = shipped_list(str(code_dir), [e.rel for e in ship.entries if not e.link]).encode()
            info = tarfile.TarInfo("shipped")
            info.size, info.mode = len(listed), 0o644
            tar.addfile(info, io.BytesIO(listed))
    return buf.getvalue()


def script_shipment(job: JobSpec, python: str = "python3") -> Shipment | None:
    """What of the script's folder is shipped, checked: within the size limit (the error names the
    largest files) and holding the script itself; None when the command ships no script."""
    code_dir, program = user_program(job, python)
    if code_dir is None:
        return None
    ship = shipment(code_dir)
    ship.check_limit()
    names = [a[2:] if a.startswith("./") else a for a in program or ()]
    script = next((n for n in names if "/" not in n and (code_dir / n).is_file()), None)
    if script is not None:
        ship.require(script)
    return ship


_ABOVE = re.compile(r"""["']\.\.(?:["']|/)""")  # a path above the script's folder in its text: '..', "../data"
SCRIPT_READ = 1 << 20  # bytes of the script read for it


def left_out_notes(ship: Shipment | None, job: JobSpec) -> list[str]:
    """Plan lines for the command's arguments that name a file left out of the shipment, and for a
    script whose text names a path above its folder (Lightning's `<script dir>/../../Datasets`)."""
    if ship is None:
        return []
    notes = [f"note: {n!r}, named by the command, is left out by a .gitignore/.gpuclusterignore rule and will not be "
             f"on the nodes; to ship it, add the line !{n} to {ship.root / '.gpuclusterignore'}"
             for n in ship.named_left_out(job.command[1:])]
    script = next((ship.root / a for a in job.command[1:] if a.endswith(".py") and (ship.root / a).is_file()), None)
    try:
        text = script.open("rb").read(SCRIPT_READ).decode("utf-8", "replace") if script else ""
    except OSError:
        text = ""
    if _ABOVE.search(text):
        notes.append(f"note: {script.name if script else 'the script'} names paths above its folder ('..'): on the nodes "
                     f"'..' is the node's run folder, not {ship.root.parent}; what the job writes there is removed at "
                     "teardown and does not come back, and data it reads there needs --data SRC:../NAME")
    return notes


def check_shippable(job: JobSpec, python: str = "python3", ssh: str = "ssh") -> Shipment | None:
    """Before anything is recorded: `ssh` on PATH, and the script's folder shippable (`script_shipment`;
    UsageError, exit 2, with the fix). What is shipped, for the plan."""
    import shutil

    if shutil.which(ssh) is None:
        raise UsageError(f"`{ssh}` is not on PATH (runs on these nodes are launched over OpenSSH); install it: "
                         "`sudo apt-get install openssh-client` / `brew install openssh`")
    return script_shipment(job, python)
