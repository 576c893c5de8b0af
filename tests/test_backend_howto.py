"""docs/backends.md, followed for a toy backend: one new package, one registry line, no other
change, and `gpucluster run --cloud toy` works end to end (provision, launch, teardown, check).

The toy "cloud" keeps its machines in a JSON file, like a cloud's API keeps instances: `up`
records N nodes tagged with the cluster and run, `down` deletes them, and `leftovers` reads the
file back (and scans this machine for the run's processes, since the nodes are local processes
launched by the local launcher, the way aws reuses the ssh launcher). The package lives in a
temporary folder; the registry line is added in the driver process before the CLI is imported,
exactly as the one line in `infra/registry.py` would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

REPO = Path(__file__).resolve().parents[1]

INIT = '''
from gpucluster.infra.contract import Traits

TRAITS = Traits(name="toy", max_nodes=3)
'''

PLUGIN = '''
from gpucluster.errors import SpecError
from gpucluster.infra.contract import ExistingMachines, SpecRules, Transport
from gpucluster.infra.local.launch import LocalLauncher

from . import TRAITS
from .provider import ToyProvider


def validate(spec):
    if spec.gpus_per_node:
        raise SpecError(f"gpus per node {spec.gpus_per_node} is not allowed: toy nodes have no GPU; leave it out")
    return []


def make(options):
    return ToyProvider(), LocalLauncher()


PLUGIN = ExistingMachines(traits=TRAITS, spec=SpecRules(validate=validate), transport=Transport(make=make))
'''

PROVIDER = '''
import json
import os
from pathlib import Path

from gpucluster.domain import Check, Cluster, Leftover, Node, Provider

STATE = Path(os.environ["TOY_CLOUD_STATE"])


def _load():
    return json.loads(STATE.read_text()) if STATE.exists() else []


def _save(nodes):
    STATE.write_text(json.dumps(nodes))


class ToyProvider(Provider):
    cloud = "toy"
    check_is_complete = True

    def up(self, spec, events):
        nodes = [n for n in _load() if n["cluster"] != spec.name]
        made = []
        for rank in range(spec.nodes):
            name = f"{spec.name}-{rank}"
            events.resource_requested("toy-node", name)
            nodes.append({"name": name, "cluster": spec.name, "run": spec.run_id})
            _save(nodes)
            events.resource_created("toy-node", name, cloud_id=name)
            made.append(Node(rank=rank, host="127.0.0.1", private_ip="127.0.0.1"))
        return Cluster(name=spec.name, cloud="toy", nodes=tuple(made))

    def down(self, name, events):
        left = [n for n in _load() if n["cluster"] != name]
        for n in _load():
            if n["cluster"] == name:
                events.resource_deleted("toy-node", n["name"], cloud_id=n["name"])
        _save(left)

    def leftovers(self, name, run_id=None):
        from gpucluster.watch.procs import run_processes

        found = [Leftover(kind="toy-node", id=n["name"]) for n in _load() if n["cluster"] == name]
        if run_id:
            found += [Leftover(kind="process", id=str(p.pid)) for p in run_processes(run_id)]
        return Check(tuple(found))
'''

DRIVER = '''
import sys

sys.path.insert(0, sys.argv[1])
from gpucluster.infra import registry

registry.PACKAGES["toy"] = "toy"  # docs/backends.md step 3: the one registry line
registry.NAMES = tuple(registry.PACKAGES)

from gpucluster.cli.main import main

sys.exit(main(sys.argv[2:]))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "plugins" / "toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "plugin.py").write_text(PLUGIN)
    (pkg / "provider.py").write_text(PROVIDER)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    state = tmp_path / "toy-cloud.json"
    env = {**os.environ, "GPUCLUSTER_HOME": str(tmp_path / "home"), "TOY_CLOUD_STATE": str(state)}

    def gpucluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(driver), str(tmp_path / "plugins"), *args], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd=tmp_path)

    gpucluster.state = state
    return gpucluster


@pytest.mark.slow
def test_a_toy_backend_added_by_the_howto_runs_a_job_and_tears_down(toy, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(textwrap.dedent("""
        import os
        print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
    """))
    done = toy("run", "--cloud", "toy", "--nodes", "2", "--yes", "--", sys.executable, str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(toy.state.read_text()) == []  # the toy cloud's nodes were deleted
    runs = json.loads(toy("runs", "--json").stdout)
    assert [r["cloud"] for r in runs] == ["toy"]
    run = runs[0]
    assert run["status"] == "succeeded" and run["teardown_verified"], run
    shown = toy("show", run["id"], "--json")
    kinds = {r["kind"] for r in json.loads(shown.stdout)["resources"]}
    assert "toy-node" in kinds, shown.stdout
    logs = toy("logs", run["id"])
    assert "hello from rank 1 of 2" in logs.stdout, logs.stdout + logs.stderr


def test_the_toy_backend_s_own_limits_and_checks_refuse_bad_input(toy):
    too_many = toy("run", "--cloud", "toy", "--nodes", "4", "--yes", "--", "python", "x.py")
    assert too_many.returncode == 2 and "nodes" in too_many.stderr and "4" in too_many.stderr, too_many.stderr
    assert "Traceback" not in too_many.stderr
    gpus = toy("run", "--cloud", "toy", "--nodes", "2", "--gpus-per-node", "1", "--yes", "--", "python", "x.py")
    assert gpus.returncode == 2 and "toy nodes have no GPU" in gpus.stderr, gpus.stderr
    assert not toy.state.exists()  # nothing was created
    unknown = toy("run", "--cloud", "toyy", "--nodes", "1", "--yes", "--", "python", "x.py")
    assert unknown.returncode == 2 and "toy" in unknown.stderr, unknown.stderr  # the allowed list names it
