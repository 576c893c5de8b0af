"""The process-group hook (issue 46 item 2, gpucluster/node/node_pghook.py) without torch: a fake module
named torch.distributed.distributed_c10d in a temporary folder, the hook as the `sitecustomize.py` a
worker's Python finds first on its PYTHONPATH (as the announcer puts it there), its records on stderr;
the announcer's PYTHONPATH; what the metrics and the report make of the records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpucluster.cli.render import run_report
from gpucluster.watch.launch import _ANNOUNCE, PG_HOOK_DIR, lay_pg_hook, pg_hook_file
from gpucluster.ledger.store import Ledger
from gpucluster.watch.metrics import MetricsState
from gpucluster.ledger.records import RunRecord

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

PREFIX = "@gpucluster-metric "
C10D = '''
calls = []
def init_process_group(backend=None, **kw):
    """the real one's doc"""
    if backend == "boom":
        raise RuntimeError("the user's own error")
    calls.append(backend)
def get_rank():
    if calls and calls[-1] == "norank":
        raise RuntimeError("no rank")
    return 1
def get_world_size():
    return 4
def get_backend():
    return "gloo"
__all__ = ["init_process_group", "get_rank", "get_world_size", "get_backend"]
'''


@pytest.fixture
def fake(tmp_path):
    """(hook folder, fake torch folder): torch/distributed imports its c10d as the real one does."""
    site = tmp_path / "fake"
    (site / "torch" / "distributed").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "__init__.py").write_text("from .distributed_c10d import *\n")
    (site / "torch" / "distributed" / "distributed_c10d.py").write_text(C10D)
    hook = Path(lay_pg_hook(str(tmp_path)))
    return hook, site


def _py(code, hook, site, *flags, env=None, extra_path=()):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUCLUSTER_PG"))}
    e.update(PYTHONPATH=os.pathsep.join([str(hook), *map(str, extra_path), str(site)]),
             GPUCLUSTER_PG_HOOK=str(hook), RANK="3")
    e.update(env or {})
    cp = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=e, timeout=60)
    records = [json.loads(ln[len(PREFIX):]) for ln in cp.stderr.splitlines() if ln.startswith(PREFIX)]
    return cp, records


def test_the_hook_says_it_is_there_and_who_joined(fake):
    hook, site = fake
    cp, records = _py("import sys; assert 'torch' not in sys.modules, 'the hook imported torch'\n"
                      "import torch.distributed as d\n"
                      "d.init_process_group('gloo', timeout=5)\n"
                      "assert d.distributed_c10d.calls == ['gloo']\n"
                      "assert d.init_process_group is d.distributed_c10d.init_process_group\n"
                      "assert d.init_process_group.__doc__ == 'the real one\\'s doc'\n"
                      "print(type(d.distributed_c10d.__loader__).__name__)", hook, site)
    assert cp.returncode == 0, cp.stderr
    assert records == [{"kind": "pg_hook", "rank": 3},
                       {"kind": "pg_join", "rank": 3, "group_rank": 1, "world_size": 4, "backend": "gloo"}]


def test_a_script_without_a_group_only_says_the_hook_is_there(fake):
    hook, site = fake
    cp, records = _py("import torch.distributed; print('no group')", hook, site)
    assert cp.returncode == 0 and cp.stdout == "no group\n", cp.stderr
    assert records == [{"kind": "pg_hook", "rank": 3}]


def test_the_hook_never_raises_into_the_script(fake):
    hook, site = fake
    # the script's own error is its own; a failure of the hook's (get_rank raising) is swallowed
    cp, records = _py("import torch.distributed as d\n"
                      "try:\n    d.init_process_group('boom')\nexcept RuntimeError as e:\n    print(e)\n"
                      "d.init_process_group('norank')\nprint('on')", hook, site)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["the user's own error", "on"]
    assert records == [{"kind": "pg_hook", "rank": 3},
                       {"kind": "pg_join", "rank": 3, "world_size": 4, "backend": "gloo"}]
    # stderr closed: nothing said, nothing raised
    cp, _ = _py("import os; os.close(2)\nimport torch.distributed as d\nd.init_process_group('gloo')\nprint('ok')",
                hook, site)
    assert cp.returncode == 0 and cp.stdout == "ok\n"


def test_the_processes_a_worker_starts_stay_quiet(fake):
    hook, site = fake
    cp, records = _py("import subprocess, sys\n"
                      "subprocess.run([sys.executable, '-c', 'import torch.distributed as d; d.init_process_group(1)'])",
                      hook, site)
    assert cp.returncode == 0, cp.stderr
    # one pg_hook for the worker; its child (a DataLoader worker, a second script) joins and says so
    assert [r["kind"] for r in records] == ["pg_hook", "pg_join"]


@pytest.mark.parametrize("flags", [("-S",), ("-I",), ("-E",)])
def test_python_without_site_or_pythonpath_says_nothing(fake, flags):
    """-S, -I, -E: the hook is absent, so whether the rank joined is not known (never "none joined")."""
    hook, site = fake
    code = ("import sys; sys.path.insert(0, %r)\nimport torch.distributed as d\nd.init_process_group('gloo')\n"
            "print('trained')" % str(site))
    cp, records = _py(code, hook, site, *flags)
    assert cp.returncode == 0 and cp.stdout == "trained\n", cp.stderr
    assert records == []


def test_a_sitecustomize_it_hides_still_runs(fake, tmp_path):
    """A user's (or Debian's) sitecustomize later on sys.path runs as before and stays `sitecustomize`."""
    hook, site = fake
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nMARK = 'mine'\nos.environ['USER_SITE_RAN'] = '1'\n")
    cp, records = _py("import os, sitecustomize\nprint(os.environ.get('USER_SITE_RAN'), sitecustomize.MARK)\n"
                      "import torch.distributed as d\nd.init_process_group('gloo')", hook, site, extra_path=[mine])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == "1 mine\n"
    assert [r["kind"] for r in records] == ["pg_hook", "pg_join"]
    # one that fails is said as Python says it, and the hook is still there
    (mine / "sitecustomize.py").write_text("raise ValueError('broken site')\n")
    cp, records = _py("print('runs')", hook, site, extra_path=[mine])
    assert cp.returncode == 0 and cp.stdout == "runs\n"
    assert "Error in sitecustomize" in cp.stderr and "broken site" in cp.stderr
    assert [r["kind"] for r in records] == ["pg_hook"]


def test_the_hook_costs_nothing_measurable(fake):
    """The one-shot finder answers for one name: a thousand imports through it stay under a millisecond each."""
    hook, site = fake
    cp, _ = _py("import sys, time, importlib\n"
                "assert type(sys.meta_path[0]).__name__ == '_Finder'\n"
                "t = time.perf_counter()\n"
                "for i in range(1000):\n    sys.meta_path[0].find_spec('json.x%d' % i)\n"
                "print(time.perf_counter() - t)", hook, site)
    assert cp.returncode == 0, cp.stderr
    assert float(cp.stdout) < 1.0


def test_importing_the_module_here_does_nothing():
    """gpucluster.node.node_pghook imported as a module (mypy, the tests): no finder, no chained sitecustomize."""
    before = list(sys.meta_path)
    import gpucluster.node.node_pghook  # noqa: F401

    assert sys.meta_path == before


def _announce(env):
    """What the announcer hands the user's program: its PYTHONPATH, and whether the hook said it is there."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "GPUCLUSTER_PG"))}
    e.update(env, RANK="0")
    program = ["-c", "import os; print(repr(os.environ.get('PYTHONPATH')))"]
    cp = subprocess.run([sys.executable, "-c", _ANNOUNCE, "-c", json.dumps(program)], capture_output=True, text=True,
                        env=e, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.splitlines()[-1], PREFIX + '{"kind": "pg_hook", "rank": 0}' in cp.stderr


def test_the_announcer_puts_the_hook_first_and_keeps_the_users_pythonpath(tmp_path):
    hook = lay_pg_hook(str(tmp_path))
    assert hook == str(tmp_path / PG_HOOK_DIR) and (tmp_path / PG_HOOK_DIR / "sitecustomize.py").read_bytes() \
        == pg_hook_file().read_bytes()
    assert _announce({"GPUCLUSTER_PG_HOOK": hook, "PYTHONPATH": "/src:/lib"}) == (f"'{hook}{os.pathsep}/src:/lib'", True)
    # an outer hooked process's mark is not this worker's
    assert _announce({"GPUCLUSTER_PG_HOOK": hook, "GPUCLUSTER_PG_SAID": "1"}) == (f"'{hook}'", True)
    assert _announce({"GPUCLUSTER_PG_HOOK": hook, "PYTHONPATH": ""}) == (f"'{hook}'", True)  # never "hook:" (the cwd)
    shutil.rmtree(hook)  # no hook file there: PYTHONPATH as it was
    assert _announce({"GPUCLUSTER_PG_HOOK": hook, "PYTHONPATH": "/src"}) == ("'/src'", False)
    assert _announce({"PYTHONPATH": "/src"}) == ("'/src'", False)


def test_the_metrics_know_when_no_rank_joined():
    def summary(launched, records):
        m = MetricsState(launched_world=launched)
        for r in records:
            m.update(r, 0)
        return {k: v for k, v in m.summary().items() if k.startswith("pg_")}

    hooked = [{"kind": "pg_hook", "rank": 0}, {"kind": "pg_hook", "rank": 1}]
    assert summary(2, []) == {}  # no hook: not known
    assert summary(2, hooked[:1]) == {"pg_hooked": 1}  # rank 1's Python never loaded it: not known
    assert summary(2, hooked + hooked) == {"pg_ranks": 0, "pg_hooked": 2}
    assert summary(2, hooked + [{"kind": "pg_join", "rank": 1, "world_size": 2}]) \
        == {"pg_ranks": 1, "pg_hooked": 2, "pg_world_size": 2}
    assert summary(2, [{"kind": "pg_join", "rank": 0, "world_size": 1}]) == {"pg_ranks": 1, "pg_world_size": 1}


def _report(tmp_path, metrics, lines=("hi",), nodes=2):
    tmp_path.mkdir(exist_ok=True)
    ledger = Ledger(tmp_path / "l.db")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=nodes, gpus_per_node=0, command=["python", "main.py"],
                      spec={}, workload=None)
    start = PREFIX + '{"kind": "worker_start", "rank": 0, "local_rank": 0, "pid": 1}'
    for rank in range(nodes):
        ledger.record_node("r1", rank, f"local:{rank}", 0, [start, *lines])
    ledger.finish_run("r1", status="succeeded", exit_code=0, failure=None, metrics=metrics)
    record = ledger.get_run("r1")
    con = Console(record=True, width=400)
    run_report(con, record)
    return " ".join(con.export_text().split()), record.to_dict()["warnings"]


def test_the_report_and_json_say_no_rank_joined(tmp_path):
    text, warnings = _report(tmp_path, {"pg_ranks": 0, "pg_hooked": 2, "final_records": 0})
    assert "SUCCEEDED" in text
    assert ("warning: no rank joined the process group: did the script train? None of its 2 ranks called "
            "torch.distributed.init_process_group; no rank reported a metric or a loss") in text
    assert len(warnings) == 1 and warnings[0].startswith("warning: no rank joined the process group")
    assert "no sign of training" not in text  # one line for both
    many = [f"step {i}" for i in range(10)]  # it printed progress, but no rank joined: still said, alone
    text, warnings = _report(tmp_path / "a", {"pg_ranks": 0, "pg_hooked": 2}, many)
    assert warnings == ["warning: no rank joined the process group: did the script train? None of its 2 ranks called "
                        "torch.distributed.init_process_group. (A script that needs more GPUs per node than it found "
                        "may exit 0 without joining a process group.)"]


@pytest.mark.parametrize("metrics,nodes", [
    ({"pg_ranks": 2, "pg_hooked": 2, "pg_world_size": 2}, 2),  # joined
    ({"pg_hooked": 1}, 2),  # not known: rank 1 never loaded the hook
    ({}, 2),  # not known: no hook at all (python -S, an older gpucluster's record)
    ({"pg_ranks": 0, "pg_hooked": 1}, 1),  # one process: nothing to join
    ({"pg_ranks": 0, "pg_hooked": 2, "world_size": 2}, 2),  # Lightning printed a group of 2
])
def test_no_warning_when_a_rank_joined_or_nobody_knows(tmp_path, metrics, nodes):
    text, warnings = _report(tmp_path, metrics, [f"step {i}" for i in range(10)], nodes=nodes)
    assert "no rank joined" not in text and warnings == []


def test_every_rank_alone_in_a_group_of_one_is_said(tmp_path):
    text, warnings = _report(tmp_path, {"pg_ranks": 2, "pg_hooked": 2, "pg_world_size": 1},
                             [f"step {i}" for i in range(10)])
    assert warnings == [w for w in warnings if "world size was 1 on a 2-node run" in w] and len(warnings) == 1
    assert RunRecord.from_dict(json.loads(json.dumps(record_dict(tmp_path)))).to_dict()["warnings"] == warnings


def record_dict(tmp_path):
    return Ledger(tmp_path / "l.db").get_run("r1").to_dict()
