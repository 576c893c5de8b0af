"""The `local` plugin: machines that exist (this one)."""

from __future__ import annotations

from typing import Mapping

from gpucluster.domain import Check, Provider
from gpucluster.infra.contract import ExistingMachines, LaunchOptions, Operations, Record, SpecRules, Transport
from gpucluster.watch.procs import kill_run_processes

from . import TRAITS
from .catalog import share_gpus, validate_spec
from .held import KeptLocalLauncher, hold
from .provider import LocalProvider


def make(options: LaunchOptions) -> tuple[LocalProvider, KeptLocalLauncher]:
    return LocalProvider(), KeptLocalLauncher(python=options.python)


def check_down(provider: Provider, name: str, runs: Mapping[str, Record]) -> Check:
    """A crashed run's stray processes are killed first (this home's: by run id AND owner, so another
    home's processes on this machine are never touched) and its node folders removed; then each
    run's processes and folders are looked for."""
    from gpucluster.ownership import installation_id

    import shutil

    from gpucluster.home import home_dir

    owner = installation_id()
    for rid in runs:
        kill_run_processes(rid, owner=owner)
        # the run's node folders (what a --setup wrote beside them too), which its teardown did not reach
        shutil.rmtree(home_dir(create=False) / "runs" / rid / "nodes", ignore_errors=True)
    check = Check()
    for rid in sorted(runs):
        check = check + Check.of(provider.leftovers(name, rid))
    return Check.of(check, how="by run id")


PLUGIN = ExistingMachines(
    traits=TRAITS,
    spec=SpecRules(validate=validate_spec, prepare=share_gpus),
    transport=Transport(make=make),
    ops=Operations(check_down=check_down, hold=hold),
)
