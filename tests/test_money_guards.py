"""Money guards (issue 48, docs/cost.md "Money guards"): `--max-cost` and `--stall-minutes`.

Units: the plan's checks (refusals, the nodes' lifetime from the cap, the stall default), the
running guard on a scaled clock (warning once at 80 %, the stop at the cap, earlier attempts
counted, the stall clock and what counts as a sign of life), the cap while a recovery chain's next
cluster is being created. Real runs on the local backend (torchrun agents and workers) under a
priced stand-in provider that records an EC2 fleet of g5.xlarge at the catalog's real price: a cap
reached mid-training (checkpoint saved on SIGTERM, outputs home, teardown verified, status
"stopped", exit code 4), a sleeping job and one blocked in a collective caught by the stall guard
with their last lines, and a slow job that keeps printing never stopped.

Billing facts the guard relies on (the report's computation, gpucluster/costing/runcost.py):
EC2 bills per second with a one-minute minimum ("Per-second billing", https://aws.amazon.com/ec2/pricing/);
GCE likewise (https://cloud.google.com/compute/vm-instance-pricing#billing_model).
"""

from __future__ import annotations

import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402

from gpucluster.costing import guards  # noqa: E402
from gpucluster.errors import ExitCode, UsageError  # noqa: E402
from gpucluster.costing.guards import Guard, plan_guards  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py); the real runs below are marked slow


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _plan(**kw):
    base = dict(max_cost=None, stall_minutes=None, hourly=Decimal("110.11"), estimate_total=Decimal("440.44"),
                max_minutes=None, lifetime=240, cloud="aws", priced=True, provisions=True, job=True)
    base.update(kw)
    return plan_guards(**base)


# -- the plan -------------------------------------------------------------------------------------
def test_a_cap_the_estimate_for_max_minutes_exceeds_is_refused_naming_both_ways_out():
    with pytest.raises(UsageError) as err:
        _plan(max_cost=50, max_minutes=60, estimate_total=Decimal("110.11"))
    assert str(err.value) == ("--max-cost 50 is not allowed with --max-minutes 60: the estimate for that limit is "
                              "$110.11 ($110.11/h); allowed: --max-cost $110.11 or more, or --max-minutes 27 or less")
    assert _plan(max_cost=120, max_minutes=60, estimate_total=Decimal("110.11")).max_cost == 120


def test_a_cap_below_the_first_billed_minute_and_a_cap_where_nothing_is_priced_are_refused():
    with pytest.raises(UsageError, match=r"the cluster's first minute .* costs \$1.84; allowed: \$1.84 or more"):
        _plan(max_cost=1)
    with pytest.raises(UsageError, match="--max-cost is not allowed with --cloud local"):
        _plan(max_cost=5, priced=False, hourly=None, provisions=False, cloud="local")


def test_without_max_minutes_the_nodes_lifetime_is_what_the_cap_buys():
    out = _plan(max_cost=100)  # $100 at $110.11/h: 54 min, shorter than the 240-minute lifetime
    assert out.lifetime == 54 and any("power themselves off 54 min" in line for line in out.lines)
    assert _plan(max_cost=1000).lifetime is None  # the cap buys more than the lifetime: unchanged


def test_the_stall_guard_is_on_by_default_where_machines_are_created_and_off_elsewhere():
    assert _plan().stall_s == guards.DEFAULT_STALL_MINUTES * 60
    assert _plan(stall_minutes=0).stall_s is None
    assert _plan(provisions=False, priced=False, hourly=None, cloud="ssh").stall_s is None
    assert _plan(provisions=False, priced=False, hourly=None, cloud="ssh", stall_minutes=2).stall_s == 120
    assert _plan(job=False).stall_s is None  # `up`: no job to watch


@pytest.mark.parametrize("value", ["-3", "0", "abc", "nan", "inf", "", "1e9"])
def test_bad_caps_are_refused_in_one_line(value):
    with pytest.raises(UsageError, match=r"--max-cost .* is not allowed: an amount in US dollars > 0"):
        guards.parse_cost(value)
    assert guards.parse_cost("$7.50") == 7.5


# -- the running guard ----------------------------------------------------------------------------
def test_the_cost_guard_warns_once_at_80_percent_and_stops_at_the_cap_counting_earlier_attempts():
    clock, said, spent = Clock(), [], [0.0]
    recorded = []
    g = Guard(max_cost=10.0, stall_s=None, cost_before=2.0, accrued=lambda: spent[0], say=said.append,
              clock=clock, every=10.0, record=recorded.append)
    assert g.poll() is None and g.last_accrued == 2.0
    spent[0] = 6.5  # 8.5 with the earlier attempts: past 80 %, read on the next 10-second tick only
    assert g.poll() is None and said == []
    clock.t += 10
    assert g.poll() is None and len(said) == 1 and "85% of its cap $10.00" in said[0]
    spent[0] = 7.0
    clock.t += 10
    assert g.poll() is None and len(said) == 1  # said once
    assert recorded == [{"kind": "cost_warning", "accrued": 8.5, "cap": 10.0}]  # the ledger; a live webhook
    spent[0] = 8.01
    clock.t += 10
    stop = g.poll()
    assert stop.kind == "cost" and stop.reason == "cost cap $10.00 reached (accrued $10.01)"


def test_the_stall_clock_starts_with_the_job_and_any_sign_of_life_resets_it():
    clock = Clock()
    g = Guard(max_cost=None, stall_s=60.0, clock=clock)
    clock.t += 600
    assert g.poll() is None  # staging/setup: the clock has not started
    g.start()
    clock.t += 59
    assert g.poll() is None
    g.alive(1)  # a printed line
    clock.t += 59
    assert g.poll() is None
    g.utilisation(0, {"gpu": [{"index": 0, "util": 97}]})  # GPUs busy: alive, whatever it prints
    clock.t += 59
    assert g.poll() is None
    g.utilisation(0, {"gpu": [{"index": 0, "util": 2}]})  # idle GPUs: no sign of life
    g.utilisation(1, {"gpu": [], "cpu_cores": 0.01, "cpu_scope": "node"})
    clock.t += 1
    stop = g.poll()
    assert stop.kind == "stall" and stop.reason.startswith("stalled for 1 min")
    assert "node 0: last utilisation GPU 2 %" in stop.reason and "node 1: last utilisation CPU 0.01 cores" in stop.reason


def test_a_cap_reached_while_a_chains_next_cluster_is_created_stops_it_there(tmp_path, monkeypatch):
    """The recovery chain's second attempt starts with what the first cost (`cost_before`); its
    cluster's creation is slow (a stand-in whose up() records the fleet, then waits as EC2's
    CreateFleet and the boot do). The cap is reached during that wait: the attempt is interrupted
    as Ctrl-C would, torn down and verified, status "stopped", exit code 4, and no job starts."""
    from gpucluster.infra.registry import plugin
    from gpucluster.watch.launch import JobSpec, Launcher
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(guards, "COST_EVERY_S", 0.05)
    provider = SlowPricedProvider(wait_s=20.0)

    class NeverLaunched(Launcher):
        def launch(self, *a, **kw):
            raise AssertionError("no job may start past the cap")

    spec = ClusterSpec(cloud="aws", nodes=2, name="capped", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r-second")
    ledger = Ledger(tmp_path / "l.db")
    job = JobSpec(run_id="r-second", workload="digits", max_cost=5.0, cost_before=4.99)
    t0 = time.monotonic()
    out = execute(spec, job, backend=plugin("aws"), ledger=ledger, provider=provider, launcher=NeverLaunched())
    assert time.monotonic() - t0 < 10  # stopped during the creation, not after its 20 s
    assert out.status == "stopped" and out.exit_code == ExitCode.COST_CAP
    assert out.failure.startswith("cost cap $5.00 reached (accrued $5.0") and "being created" in out.failure
    assert provider.downs == ["capped"] and out.teardown == "verified"
    run = ledger.get_run("r-second")
    assert run.run.status == "stopped" and all(r.confirmed_gone for r in run.resources)


# -- stand-ins ------------------------------------------------------------------------------------
class PricedLocal:
    """A priced cluster made of local "nodes": up() records one EC2 fleet of `nodes` g5.xlarge (what
    the aws provider records, priced from the catalog as a real run's), the nodes are this machine's
    processes (the local backend's launcher runs them); down() records the fleet deleted."""

    def __new__(cls, *a, **kw):
        from gpucluster.infra.local.provider import LocalProvider

        class _Priced(LocalProvider):
            cloud = "aws"

            def __init__(self, wait_s: float = 0.0):
                self.wait_s, self.downs = wait_s, []

            def up(self, spec, events):
                detail = dict(instance_type=spec.instance_type, node_count=spec.nodes, spot=False, public_ipv4=1,
                              disk_gb=100, disk_type="gp3")
                events.resource_requested("fleet", f"{spec.name}-fleet", **detail)
                events.resource_created("fleet", f"{spec.name}-fleet", "fleet-0123", **detail)
                end = time.monotonic() + self.wait_s
                while time.monotonic() < end:
                    time.sleep(0.05)
                return super().up(spec.replace(gpus_per_node=0), events)

            def down(self, name, events):
                self.downs.append(name)
                events.resource_deleted("fleet", f"{name}-fleet", "fleet-0123")

        return _Priced(*a, **kw)


def SlowPricedProvider(wait_s):  # noqa: N802 - a stand-in's constructor
    return PricedLocal(wait_s=wait_s)


# -- real runs on the local backend ---------------------------------------------------------------
def _run(home, job, spec):
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute

    ledger = Ledger(home / "ledger.sqlite3")
    provider = PricedLocal()
    out = execute(spec, job, backend=plugin(spec.cloud), ledger=ledger, provider=provider,
                  launcher=LocalLauncher(grace=3.0))
    return out, ledger, provider


@needs_torch
@pytest.mark.slow
def test_a_cap_reached_mid_training_saves_brings_home_tears_down_and_exits_4(home, monkeypatch):
    """digits on 2 priced "g5.xlarge" nodes (2 x $1.006/h), cap $10. The scaled clock: the accrued
    cost is computed 10^5 s (27.8 h, about $56) ahead once the first checkpoint exists, so the cap
    is reached mid-training, after a checkpoint, whatever the machine's speed."""
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.procs import run_processes
    from gpucluster.spec import ClusterSpec, new_run_id

    rid = new_run_id()
    outputs = home / "runs" / rid / "outputs"
    real = time.time
    monkeypatch.setattr(guards, "wall", lambda: real() + (1e5 if (outputs / "node-0" / "checkpoint.json").exists()
                                                          else 0.0))
    monkeypatch.setattr(guards, "COST_EVERY_S", 0.2)
    spec = ClusterSpec(cloud="aws", nodes=2, name="cap", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id=rid)
    job = JobSpec(run_id=rid, workload="digits", workload_args=("--epochs", "400", "--seed", "5"),
                  threads_per_proc=1, max_seconds=300, max_cost=10.0)
    out, ledger, provider = _run(home, job, spec)
    run = ledger.get_run(rid)
    assert out.status == "stopped" and out.exit_code == ExitCode.COST_CAP, out.failure
    assert out.failure.startswith("cost cap $10.00 reached (accrued $")
    assert run.run.status == "stopped" and run.run.teardown == "verified" and provider.downs == ["cap"]
    assert (outputs / "node-0" / "checkpoint.pt").is_file()  # saved (each epoch, and on SIGTERM), brought home
    epochs = ledger.metrics(rid, kind="epoch")
    assert 0 < len(epochs) < 2 * 400  # stopped mid-training
    assert run_processes(rid) == []
    assert float(run.run.cost["total"]) > 0  # the report's own figure, as real prices give it
    from rich.console import Console

    from gpucluster.cli.render import run_report

    console = Console(record=True, width=200)
    run_report(console, run)
    assert "cost cap $10.00 reached" in console.export_text()


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("how", ["sleeping", "collective"])
def test_a_hung_job_is_stopped_by_the_stall_guard_with_its_last_lines(home, tmp_path, how):
    """A script that prints, then hangs: rank 0 sleeping, or rank 0 blocked in an all_reduce that
    rank 1 never joins (gloo waits on its socket, no CPU). --stall-minutes 0.05 (3 s): the run
    fails "stalled for 0.05 min", the node's last lines and utilisation are in the record."""
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.procs import run_processes
    from gpucluster.spec import ClusterSpec, new_run_id

    script = tmp_path / "hang.py"
    script.write_text(HANG)
    rid = new_run_id()
    spec = ClusterSpec(cloud="local", nodes=2, name="stall", gpus_per_node=0, run_id=rid)
    job = JobSpec(run_id=rid, command=(sys.executable, str(script), how), threads_per_proc=1, max_seconds=120,
                  stall_s=3.0)
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute

    ledger = Ledger(home / "ledger.sqlite3")
    t0 = time.monotonic()
    out = execute(spec, job, backend=plugin("local"), ledger=ledger, provider=LocalProvider(),
                  launcher=LocalLauncher(grace=2.0))
    assert time.monotonic() - t0 < 60
    assert out.status == "failed" and out.exit_code == ExitCode.FAILURE
    assert out.failure.startswith("stalled for 0.05 min"), out.failure
    assert "last utilisation CPU" in out.failure
    run = ledger.get_run(rid).to_dict()
    assert any("about to hang" in ln for n in run["node_results"] for ln in n["last_lines"])
    assert run["teardown"] == "verified" and run_processes(rid) == []


@needs_torch
@pytest.mark.slow
def test_a_slow_job_that_keeps_printing_is_never_stopped(home, tmp_path):
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.infra.registry import plugin
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id

    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    rid = new_run_id()
    spec = ClusterSpec(cloud="local", nodes=2, name="slow", gpus_per_node=0, run_id=rid)
    job = JobSpec(run_id=rid, command=(sys.executable, str(script)), threads_per_proc=1, max_seconds=120, stall_s=2.5)
    ledger = Ledger(home / "ledger.sqlite3")
    out = execute(spec, job, backend=plugin("local"), ledger=ledger, provider=LocalProvider(),
                  launcher=LocalLauncher(grace=2.0))
    assert out.status == "succeeded", out.failure  # 6 s of work, a line every second, under a 2.5 s stall guard


HANG = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank}: about to hang", flush=True)
if sys.argv[1] == "collective" and rank == 0:
    dist.all_reduce(__import__("torch").ones(1))  # rank 1 never joins
time.sleep(600)
"""

SLOW = """
import time
for i in range(6):
    time.sleep(1.0)
    print(f"step {i}", flush=True)
"""


@pytest.mark.parametrize("args,said", [
    (["--max-cost", "abc"], "gpucluster: error: --max-cost 'abc' is not allowed: an amount in US dollars > 0"),
    (["--max-cost", "-5"], "gpucluster: error: --max-cost '-5' is not allowed: an amount in US dollars > 0"),
    (["--max-cost", "1"], "gpucluster: error: --max-cost 1 is not allowed: at $110.11/h the cluster's first minute"),
    (["--max-cost", "10", "--max-minutes", "60"],
     "gpucluster: error: --max-cost 10 is not allowed with --max-minutes 60: the estimate for that limit is $110.11"),
    (["--stall-minutes", "soon"], "gpucluster: error: --stall-minutes 'soon' is not allowed: a number of minutes"),
])
def test_the_cli_refuses_a_bad_cap_in_one_line_exit_2_before_anything_is_recorded(tmp_path, args, said):
    from conftest import run_cli

    home = tmp_path / "home"
    cp = run_cli("run", "--cloud", "aws", "--nodes", "2", "--gpu", "H100:8", "--ssh-cidr", "203.0.113.7/32", "--yes",
                 *args, env={"GPUCLUSTER_HOME": str(home)}, timeout=120)
    assert cp.returncode == 2, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(said), cp.stderr
    assert "Traceback" not in cp.stderr and not (home / "ledger.sqlite3").exists()


# -- budgets ----------------------------------------------------------------------------------------
def test_periods_start_at_utc_midnight_monday_and_the_first_of_the_month():
    from gpucluster.costing.budget import period_start

    now = 1795866466.0  # Saturday 2026-11-28 11:47:46 UTC
    assert period_start("daily", now) == 1795824000.0  # 2026-11-28 00:00 UTC
    assert period_start("weekly", now) == 1795392000.0  # Monday 2026-11-23
    assert period_start("monthly", now) == 1793491200.0  # 2026-11-01


def _spent_ledger(home, total="4.20"):
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(home / "ledger.sqlite3")
    ledger.create_run("r-spent", cloud="aws", cluster="c", nodes=1, gpus_per_node=1, command=["x"], spec={},
                      workload=None)
    ledger.finish_run("r-spent", status="succeeded", exit_code=0)
    ledger.set_cost("r-spent", {"total": total, "lines": [], "notes": [], "still_billing": []})
    return ledger


def test_a_run_past_the_budget_is_refused_naming_spent_remaining_and_estimate_unless_over_budget(
        tmp_path, monkeypatch):
    from gpucluster.cli.budgets import check_budget, record_override

    (tmp_path / "config.yaml").write_text("budget:\n  daily: 5\n  monthly: 100\n")
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    ledger = _spent_ledger(tmp_path)
    assert check_budget(ledger, Decimal("0.50"), None, False) == []  # 4.20 + 0.50 fits the daily 5
    with pytest.raises(UsageError) as err:
        check_budget(ledger, Decimal("2.00"), None, False)
    assert str(err.value).startswith("the daily budget is $5.00: $4.20 spent since ")
    assert "$0.80 remaining, and this run's estimate is $2.00: not started (give --over-budget" in str(err.value)
    assert check_budget(ledger, Decimal("2.00"), 0.7, False) == []  # its --max-cost is what it can spend
    lines = check_budget(ledger, Decimal("2.00"), None, True)
    assert len(lines) == 1 and lines[0].startswith("over budget (--over-budget): the daily budget is $5.00")
    record_override(ledger, "r-spent", lines)
    (rec,) = ledger.metrics("r-spent", kind="budget")
    assert rec["over_budget"] is True and rec["lines"] == lines


@pytest.mark.parametrize("text,said", [("budget: 5\n", "a mapping of periods"),
                                       ("budget: {hourly: 5}\n", "budget.hourly: unknown period"),
                                       ("budget: {daily: -1}\n", "budget.daily: '-1' is not allowed")])
def test_a_bad_budget_in_the_config_is_refused_naming_its_line(tmp_path, monkeypatch, text, said):
    from gpucluster.errors import ConfigError
    from gpucluster.plan.userconfig import load_config

    monkeypatch.delenv("GPUCLUSTER_CONFIG", raising=False)  # the suite's "no config file"

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=said):
        load_config(path)


def test_the_cli_refuses_past_the_budget_and_cost_report_shows_the_standing(tmp_path):
    from conftest import run_cli

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _spent_ledger(home).close()
    (tmp_path / "config.yaml").write_text("budget:\n  daily: 5\n")
    env = {"GPUCLUSTER_HOME": str(home), "GPUCLUSTER_CONFIG": str(tmp_path / "config.yaml")}
    cp = run_cli("run", "--cloud", "aws", "--nodes", "2", "--gpu", "A10G", "--max-minutes", "60", "--ssh-cidr",
                 "203.0.113.7/32", "--yes", env=env, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert cp.stderr.strip().splitlines()[-1].startswith("gpucluster: error: the daily budget is $5.00: $4.20 spent")
    cp = run_cli("cost", "report", env=env, timeout=120)
    assert cp.returncode == 0 and "Budget (daily, since " in cp.stdout and "$4.20 spent of $5.00, $0.80 remaining" \
        in cp.stdout, cp.stdout


def test_the_caps_lifetime_reaches_the_aws_dead_man_switch_and_the_gke_jobs_deadline(monkeypatch):
    """Without --max-minutes, what the cap buys at the plan's $/h becomes the nodes' lifetime: the aws
    user data's dead-man switch powers off then, and the GKE Job's activeDeadlineSeconds ends then."""
    from gpucluster.infra.aws.user_data import render_user_data
    from gpucluster.infra.kubernetes.plan import run_limits
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.prepare import Request, prepare

    plan = prepare(Request(cloud="aws", nodes=2, gpu="H100:8", max_cost=100.0, ssh_cidr="203.0.113.7/32",
                           dry_run=True), plugin("aws"))
    assert plan.spec.max_lifetime_minutes == 54 and plan.job.max_cost == 100.0
    assert float(plan.estimate.total) <= 100.0  # priced again for the shorter lifetime
    text = render_user_data(cluster="c", expected_gpus=8, max_lifetime_minutes=plan.spec.max_lifetime_minutes)
    assert "max lifetime 54 minutes" in text and "max lifetime 240" not in text
    gcp = prepare(Request(cloud="gcp", nodes=2, gpu="L4:1", max_cost=3.0, project="proj-one", dry_run=True), plugin("gcp"))
    assert gcp.spec.max_lifetime_minutes < 240
    limit, deadline = run_limits(None, gcp.spec.max_lifetime_minutes * 60, 120)
    assert deadline <= gcp.spec.max_lifetime_minutes * 60 and limit < deadline


# -- kept clusters ----------------------------------------------------------------------------------
def _kept_ledger(home, cap, hours_ago):
    """A kept cluster created by `up --max-cost CAP` HOURS_AGO: its fleet of 2 g5.xlarge still open."""
    from gpucluster.costing.guards import CAP_KIND
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.spec import ClusterSpec

    ledger = Ledger(home / "ledger.sqlite3")
    then = time.time() - hours_ago * 3600
    spec = ClusterSpec(cloud="aws", nodes=2, name="lab", region="us-east-1", instance_type="g5.xlarge", run_id="r-up")
    from gpucluster.costing import cost

    ledger.create_run("r-up", cloud="aws", cluster="lab", nodes=2, gpus_per_node=1, command=["gpucluster", "up"],
                      spec=spec.to_dict(), workload=None, prices=cost.price_snapshot(spec, backend=plugin("aws")),
                      now=then)
    detail = dict(instance_type="g5.xlarge", node_count=2, spot=False, public_ipv4=1, disk_gb=100, disk_type="gp3")
    ledger.resource_requested("r-up", "fleet", "lab-fleet", region="us-east-1", detail=detail, now=then)
    ledger.resource_created("r-up", "fleet", "lab-fleet", "fleet-0123", now=then)
    ledger.finish_run("r-up", status="succeeded", exit_code=0, teardown="kept")
    ledger.add_metrics("r-up", [(None, {"kind": CAP_KIND, "max_cost": cap})])
    return ledger


def test_exec_on_a_kept_cluster_past_its_cap_is_refused_and_below_it_watches_the_clusters_cost(tmp_path):
    """2 x g5.xlarge ($1.006/h each) up for 3 h: about $6.05 accrued (instances, disks, IPv4)."""
    from gpucluster.errors import CostCapReached
    from gpucluster.costing.guards import exec_guard
    from gpucluster.infra.registry import plugin
    from gpucluster.watch.launch import JobSpec

    ledger = _kept_ledger(tmp_path, cap=5.0, hours_ago=3)
    job = JobSpec(run_id="r-exec", workload="digits")
    with pytest.raises(CostCapReached) as err:
        exec_guard(ledger, "lab", "r-up", plugin("aws"), job)
    assert err.value.exit_code == ExitCode.COST_CAP
    assert str(err.value).startswith("cluster 'lab' has reached its cost cap: cost cap $5.00 reached (accrued $6.")
    ledger.close()
    (tmp_path / "b").mkdir()
    ledger = _kept_ledger(tmp_path / "b", cap=50.0, hours_ago=3)
    watched = exec_guard(ledger, "lab", "r-up", plugin("aws"), job)
    assert (watched.max_cost, watched.cost_of) == (50.0, "r-up")


def test_status_shows_a_kept_clusters_accrued_cost_against_its_cap(tmp_path):
    from gpucluster.cli.status import cluster_rows

    ledger = _kept_ledger(tmp_path, cap=10.0, hours_ago=3)
    (row,) = cluster_rows(ledger, observe=False)
    assert row["max_cost_usd"] == "10.0" and row["state"] == "kept, 61% of its cap $10.00", row["state"]  # $6.05
