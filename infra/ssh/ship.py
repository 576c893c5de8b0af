"""What the ssh launcher ships to the nodes: the run id checked as a folder name, the user's
script (its folder, when the command runs a local script) and a tar bundle of the built-in
workloads plus that folder, bounded in size."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path
from typing import Iterator, Sequence

from gpucluster.errors import LaunchError
from gpucluster.launch import _PYTHON_RE, JobSpec, program_args

MAX_SHIP_BYTES = 200 * 1024 * 1024
_SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache"}
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
    total = 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(Path(workloads.__file__).parent.glob("*.py")):
            tar.add(f, arcname=f"workloads/{f.name}")
        from gpucluster import reaper

        tar.add(reaper.__file__, arcname="reaper.py")  # the node supervisor (stdlib only)
        from gpucluster import workdir

        tar.add(workdir.__file__, arcname="workdir.py")  # chooses what the job wrote, to copy back (stdlib only)
        from gpucluster import node_check

        tar.add(node_check.__file__, arcname="node_check.py")  # the health check (torch + stdlib)
        for path in extra:
            tar.add(path, arcname=os.path.basename(path))
        # digits' data (~60 KB) goes with the scripts, so a node needs only torch
        from gpucluster.workloads.digits_data import local_digits_file

        digits = local_digits_file()
        if digits:
            tar.add(digits, arcname="workloads/data/digits.csv.gz")
        if code_dir is not None:
            for path in _code_files(code_dir):
                total += path.lstat().st_size
                if total > MAX_SHIP_BYTES:
                    raise LaunchError(_too_big(code_dir))
                tar.add(path, arcname=f"code/{path.relative_to(code_dir).as_posix()}", recursive=False)
    return buf.getvalue()


def _code_files(code_dir: Path) -> Iterator[Path]:
    """The files of the script's folder that are shipped (tool folders and .pyc left out)."""
    for root, dirnames, filenames in os.walk(code_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(root, name)
            if path.suffix != ".pyc":
                yield path


def _too_big(code_dir: Path) -> str:
    return (f"the script's folder {str(code_dir)!r} holds more than {MAX_SHIP_BYTES >> 20} MB to copy to every "
            "node; put the script in a folder of its own (data belongs on the nodes or in object storage)")


def check_shippable(job: JobSpec, python: str = "python3", ssh: str = "ssh") -> None:
    """Before anything is recorded: `ssh` on PATH, and the script's folder within the size that is
    shipped to every node (UsageError, exit 2, with the fix)."""
    import shutil

    from gpucluster.errors import UsageError

    if shutil.which(ssh) is None:
        raise UsageError(f"`{ssh}` is not on PATH (runs on these nodes are launched over OpenSSH); install it: "
                         "`sudo apt-get install openssh-client` / `brew install openssh`")
    code_dir, _ = user_program(job, python)
    if code_dir is None:
        return
    total = 0
    for path in _code_files(code_dir):
        total += path.lstat().st_size
        if total > MAX_SHIP_BYTES:
            raise UsageError(_too_big(code_dir))
