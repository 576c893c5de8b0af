"""What the job's own arguments must be before anything is recorded: the built-in workloads'
names and arguments (checked against each workload's own parser), and the ssh key files named."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys

from gpucluster.errors import UsageError, not_allowed
from gpucluster.spec import parse_int

WORKLOADS = ("digits", "mnist", "synthetic")


def workload_argv(workload: str | None, workload_args: str, epochs: int | None,
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
        wl_args = ["--epochs", str(parse_int("epochs", str(epochs), low=1, high=100000))] + wl_args
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


_RUNNABLE = "an executable on PATH, or python SCRIPT.py / python -m MODULE / python -c CODE"


def check_command(command: tuple[str, ...]) -> None:
    """A `--` command must be runnable before anything starts: a script file, a module, code, or
    an executable file (not a folder); `python` alone, or `-m`/`-c` without their argument, is not."""
    from gpucluster.watch.launch import _PYTHON_RE, JobSpec, program_args, python_target

    exe = command[0]
    if os.path.isdir(os.path.expanduser(exe)):
        raise UsageError(not_allowed("command", exe, f"{_RUNNABLE} (it is a folder)"))
    if _PYTHON_RE.match(os.path.basename(exe)):
        rest = command[1:]
        if not rest:
            raise UsageError(not_allowed("command", exe, f"{_RUNNABLE} (python alone would wait for input "
                                         "or do nothing)"))
        what, arg = python_target(rest)
        if what in ("-m", "-c") and arg is None:
            raise UsageError(not_allowed("command", shlex.join(command), f"python {what} followed by its "
                                         f"{'module' if what == '-m' else 'code'}"))
        why = {None: "options only: python would wait for input or do nothing",
               "-": "'-' reads the program from stdin, which the nodes' processes do not have",
               "exit": f"{arg} prints and exits: nothing would run"}.get(what)
        if why:
            raise UsageError(not_allowed("command", shlex.join(command), f"{_RUNNABLE} ({why})"))
        if what == "-m":
            _check_module(str(arg))
        elif what == "script" and not os.path.isfile(str(arg)):
            raise UsageError(not_allowed("script", arg, "a Python file, not a folder" if os.path.isdir(str(arg))
                                         else "a Python file that exists (path relative to the current directory)"))
    prog = program_args(JobSpec(run_id="check", command=command))
    if prog[0] == "--no-python":
        _check_executable(prog[1])
    elif prog[0] == "-m":
        _check_module(prog[1])
    elif os.path.isdir(prog[0]):
        raise UsageError(not_allowed("script", prog[0], "a Python file, not a folder"))
    elif not os.path.isfile(prog[0]):
        raise UsageError(not_allowed("script", prog[0], "a Python file that exists (path relative to the current directory)"))


def _check_executable(exe: str) -> None:
    if os.sep in exe:
        ok = os.path.isfile(exe) and os.access(exe, os.X_OK)
    else:
        ok = shutil.which(exe) is not None
    if not ok:
        raise UsageError(not_allowed("command", exe, "an executable on PATH, or python SCRIPT.py / python -m MODULE"))


def _check_module(module: str) -> None:
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.pop(0)
    if not found:
        raise UsageError(not_allowed("python module", module, "a module importable from the current directory"))


def parse_size(flag: str, value: str) -> int:
    """'500MB', '10GB', '2.5 GB', '1000' (bytes) -> bytes; UsageError (exit 2) naming the value."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B?)\s*", value or "", re.I)
    if not m:
        raise UsageError(f"{flag} {value!r} is not allowed: a size such as 500MB or 10GB")
    unit = m.group(2).upper().rstrip("B")
    return int(float(m.group(1)) * 1000 ** " KMGT".index(unit or " "))
