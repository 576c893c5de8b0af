"""Issue 29 item 6: the commands agree. sweep takes the cluster-shape flags run takes (and refuses
them where run does); GPUs per node has one name; numeric flags show their type and range; the
estimate before a run covers the run's limit ("up to $X for Y min")."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

from gpucluster.cli.cost import estimate_cmd  # noqa: E402
from gpucluster.cli.run import run  # noqa: E402
from gpucluster.cli.sweep import sweep  # noqa: E402
from gpucluster.cli.up import up  # noqa: E402


def names(cmd: click.Command) -> set[str]:
    return {p.name for p in cmd.params if isinstance(p, click.Option) and not p.hidden}


def test_sweep_takes_every_cluster_shape_flag_run_takes():
    shape = {"cloud", "name", "region", "zone", "instance_type", "spot", "disk_gb", "max_lifetime", "ssh_cidr", "tags",
             "options", "project", "hosts", "identity", "known_hosts", "remote_python", "python", "ready_timeout",
             "start_deadline", "gpus_per_node", "nodes", "env", "env_file", "secret", "task_file"}
    assert shape <= names(run) and shape <= names(sweep), shape - names(sweep)


def test_one_name_for_gpus_per_node_and_the_old_one_hidden():
    for cmd in (run, up, sweep, estimate_cmd):
        assert "gpus_per_node" in names(cmd), cmd.name
    old = [p for p in estimate_cmd.params if "--gpus" in getattr(p, "opts", [])]
    assert old and old[0].hidden


def test_numeric_flags_show_their_type_and_range():
    ctx = click.Context(run)
    for cmd in (run, up, sweep, estimate_cmd):
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.is_flag and not p.hidden:
                record = p.get_help_record(ctx)
                if record and re.search(r"(minutes|hours|seconds|count|number)\b", record[1], re.I):
                    assert "TEXT" not in record[0], (cmd.name, record)
    hours = next(p for p in estimate_cmd.params if p.name == "hours")
    assert "FLOAT RANGE" in hours.get_help_record(ctx)[0]


@pytest.mark.parametrize("extra, minutes, why", [
    (["--max-minutes", "30"], "30", "the job's limit, --max-minutes"),
    ([], "240", "the nodes' lifetime cap, --max-lifetime"),
    (["--max-lifetime", "90"], "90", "the nodes' lifetime cap, --max-lifetime"),
])
def test_the_estimate_covers_the_runs_limit(home, extra, minutes, why):
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--instance-type", "g5.xlarge", "--dry-run",
                "--ssh-cidr", "203.0.113.7/32", *extra)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("estimated cost:"))
    m = re.match(rf"estimated cost: up to \$([0-9.]+) for {minutes} min \({re.escape(why)}\) at \$([0-9.]+)/h", line)
    assert m, line
    total, hourly = float(m.group(1)), float(m.group(2))
    assert total == pytest.approx(hourly * int(minutes) / 60, abs=0.005 * int(minutes) / 60 + 0.01)  # $/h is rounded


def test_up_says_what_the_lifetime_cap_costs_at_most(home):
    r = run_cli("up", "--cloud", "aws", "--nodes", "2", "--dry-run", "--ssh-cidr", "203.0.113.7/32")
    assert r.returncode == 0, r.stderr
    assert re.search(r"about \$[0-9.]+/hour \(up to \$[0-9.]+ for 240 min, the nodes' lifetime cap, --max-lifetime\)",
                     r.stdout), r.stdout
