"""What the job's own arguments must be before anything is recorded: the built-in workloads'
names and arguments (checked against each workload's own parser), and the ssh key files named."""

from __future__ import annotations

import os
import shlex

from gpucluster.errors import UsageError
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
