"""The `ssh` plugin: machines that exist (a list of hosts)."""

from __future__ import annotations

from typing import Mapping, TypedDict

from gpucluster.domain import Check, Provider
from gpucluster.infra.contract import ExistingMachines, LaunchOptions, Operations, Record, SpecRules, Transport

from . import TRAITS
from .cleanup import clean_recorded_hosts
from gpucluster.lifecycle.held import HOST_KIND

from .held import HeldSshLauncher, hold, host_run_rows, ready_file
from .launch import DEFAULT_REMOTE_DIR, RUN_RESOURCE
from .provider import SshProvider, resolve_hosts, validate_spec


class _Given(TypedDict, total=False):
    """The launcher settings given (`SshLauncher`'s keywords of the same names)."""

    identity: str
    known_hosts: str
    python: str


def make(options: LaunchOptions) -> tuple[SshProvider, HeldSshLauncher]:
    kw: _Given = {}  # only what is given: the launcher's own defaults otherwise
    if options.identity:
        kw["identity"] = options.identity
    if options.known_hosts:
        kw["known_hosts"] = options.known_hosts
    if options.remote_python:
        kw["python"] = options.remote_python
    launcher = HeldSshLauncher(**kw)  # an SshLauncher that can also reclaim a dead job on a kept cluster
    # The provider asks only the nodes where this launcher started the run for leftovers.
    return SshProvider(launcher=launcher), launcher


def check_down(provider: Provider, name: str, runs: Mapping[str, Record]) -> Check:
    """Every host a run reached (also those its teardown closed) is cleaned through the
    connection details its ledger rows hold."""
    rows = []
    for rid in sorted(runs):
        run = runs[rid] or {}
        resources = run.get("resources") or []
        assert isinstance(resources, list)
        rows += [{**r, "cluster": name} for r in resources if r["kind"] == RUN_RESOURCE]
    recorded = {r["run_id"] for r in rows}
    # a kept cluster's hosts (`up --cloud ssh`, gpucluster.lifecycle.held): every run without rows of its own (the `up`, a
    # job killed before it wrote them) is looked for there by its run id, and its run folder removed
    held = []
    for rid in sorted(runs):
        found = (runs[rid] or {}).get("resources") or []
        assert isinstance(found, list)
        held += [{**r, "cluster": name} for r in found if r["kind"] == HOST_KIND]
    if held:
        ready_file(name).unlink(missing_ok=True)  # the hosts' kept answers go with the cluster
        rows += host_run_rows(held, sorted(set(runs) - recorded), DEFAULT_REMOTE_DIR)
        recorded |= set(runs)
    # a run with no resource row at all (ended before its launcher wrote the connection details, which
    # it does before its first connection: a full home, a kill in prepare) reached no host
    recorded |= {rid for rid in runs if not (runs[rid] or {}).get("resources")}
    from gpucluster.ownership import installation_id

    check = Check.of(clean_recorded_hosts(rows, owner=installation_id()), how="by run id")  # this home's only
    return check.with_unchecked(*(
        f"run {rid}: the ledger holds no ssh connection details for it; check its hosts by hand"
        for rid in sorted(set(runs) - recorded)))


PLUGIN = ExistingMachines(
    traits=TRAITS,
    spec=SpecRules(options=("private_ips",), validate=validate_spec, resolve=resolve_hosts),
    transport=Transport(make=make),
    ops=Operations(check_down=check_down, hold=hold),
)
