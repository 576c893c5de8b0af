"""A kept cluster's cost cap (issue 48, item 4 and "at 100 % the cluster is torn down and verified";
docs/cost.md "Kept clusters").

- `up --max-cost`: with no job running, the nodes' own lifetime is what the cap buys: the aws user
  data's dead-man switch and, on GKE, the idle stop's hold Job (its activeDeadlineSeconds, the
  node-side end of a kept GKE cluster's GPU nodes: infra/gcp/idle.py).
- The cap survives jobs: every `exec` finds it (it is the cluster's, recorded by `up`).
- An `exec` during which the cluster's cost reaches the cap: the job is stopped (status stopped,
  exit 4) and the cluster is torn down through `down`'s own path and checked (verified), so it no
  longer bills; before this, the job stopped and the cluster kept billing.
- An `exec` started on a cluster already past its cap: nothing starts, the cluster is torn down.

The cluster is a stand-in for an EC2 fleet (`Fleet`): `up` records a fleet of 2 g5.xlarge priced
from the shipped catalog (the real price, $1.006/h each), its nodes are this machine's processes
(the local launcher runs the jobs), `down` deletes the fleet, and the tag scan finds the fleet as
long as it is not deleted (the independent check `down` makes). The clock is scaled as in
tests/test_money_guards.py: the accrued cost is computed 10^5 s ahead from a few seconds into the
job (of the minute it would run), so the cap is reached mid-job.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402

from gpucluster.costing import guards  # noqa: E402
from gpucluster.errors import ExitCode  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py); the real jobs below are marked slow


def test_up_max_cost_gives_the_kept_nodes_the_lifetime_the_cap_buys_on_aws_and_gke():
    from gpucluster.infra.aws.user_data import render_user_data
    from gpucluster.infra.gcp.idle import manifests
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.prepare import Request, prepare

    aws = prepare(Request(cloud="aws", nodes=2, gpu="H100:8", max_cost=100.0, ssh_cidr="203.0.113.7/32",
                          dry_run=True, job=False), plugin("aws"))
    assert aws.spec.max_lifetime_minutes == 54 and aws.job is None  # $100 at $110.11/h
    text = render_user_data(cluster="c", expected_gpus=8, max_lifetime_minutes=aws.spec.max_lifetime_minutes,
                            idle_minutes=30)
    assert "max lifetime 54 minutes" in text
    gke = prepare(Request(cloud="gcp", nodes=2, gpu="L4:1", max_cost=3.0, project="proj-one", dry_run=True,
                          job=False, options=("idleMinutes=20",)), plugin("gcp"))
    minutes = gke.spec.max_lifetime_minutes
    assert minutes < 240
    now = 1795866466.0
    hold = manifests(cluster="c", namespace="default", minutes=20, nodes=2, deadline=now + minutes * 60, now=now)["job"]
    assert hold.spec.active_deadline_seconds == minutes * 60  # the hold Job's pods go then, watcher or not


class Fleet:
    """The stand-in cluster (see the module docstring)."""

    def __new__(cls):
        from gpucluster.domain import Check, Leftover
        from gpucluster.infra.local.provider import LocalProvider

        class _Fleet(LocalProvider):
            cloud = "aws"

            def __init__(self):
                self.downs, self.alive = [], set()

            def up(self, spec, events):
                detail = dict(instance_type=spec.instance_type, node_count=spec.nodes, spot=False, public_ipv4=1,
                              disk_gb=100, disk_type="gp3")
                events.resource_requested("fleet", f"{spec.name}-fleet", **detail)
                events.resource_created("fleet", f"{spec.name}-fleet", "fleet-0123", **detail)
                self.alive.add(spec.name)
                return super().up(spec.replace(gpus_per_node=0), events)

            def down(self, name, events):
                self.downs.append(name)
                self.alive.discard(name)
                events.resource_deleted("fleet", f"{name}-fleet", "fleet-0123")

            def leftovers(self, name, run_id=None):
                if run_id is not None:
                    return super().leftovers(name, run_id)
                return Check(leftovers=tuple([Leftover(kind="fleet", id="fleet-0123")] if name in self.alive else []))

        return _Fleet()


def _kept(home, cap):
    """`up --max-cost CAP` on the stand-in: the cluster, its provider, the ledger."""
    from gpucluster.costing import cost
    from gpucluster.costing.guards import CAP_KIND
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import provision_only
    from gpucluster.spec import ClusterSpec

    ledger = Ledger(home / "ledger.sqlite3")
    spec = ClusterSpec(cloud="aws", nodes=2, name="lab", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r-up")
    provider = Fleet()
    made = provision_only(spec, ledger=ledger, provider=provider, backend=plugin("aws"),
                          prices=cost.price_snapshot(spec, backend=plugin("aws")))
    ledger.add_metrics("r-up", [(None, {"kind": CAP_KIND, "max_cost": cap})])
    return made.cluster, provider, ledger, spec


def _exec(ledger, cluster, provider, spec, script, run_id):
    """`exec` as api/clusters.run_exec runs it: the job under the cluster's cap, then the cap's teardown."""
    from gpucluster.costing.guards import exec_guard
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.kept import Attached, cap_teardown
    from gpucluster.watch.launch import JobSpec
    from gpucluster.lifecycle.steps import execute
    from gpucluster.lifecycle.teardown import take_down

    job = exec_guard(ledger, "lab", "r-up", plugin("aws"), JobSpec(
        run_id=run_id, command=(sys.executable, str(script)), threads_per_proc=1, max_seconds=120))
    out = execute(spec.replace(run_id=run_id), job, ledger=ledger, provider=Attached(cluster),
                  launcher=LocalLauncher(grace=2.0), backend=plugin("aws"), keep=True)
    code, line = cap_teardown(ledger, "lab", "r-up", plugin("aws"), out, lambda: take_down(
        "lab", "aws", ledger=ledger, provider_for=lambda c, **_: provider, backend=plugin("aws")))
    return job, out, code, line


@needs_torch
@pytest.mark.slow
def test_the_cap_survives_execs_and_an_exec_reaching_it_tears_the_cluster_down_verified(home, tmp_path, monkeypatch):
    short, long_ = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("print('done', flush=True)\n")
    long_.write_text("import time\nfor i in range(600):\n    print(f'step {i}', flush=True)\n    time.sleep(0.1)\n")
    cluster, provider, ledger, spec = _kept(home, cap=10.0)
    job, out, code, line = _exec(ledger, cluster, provider, spec, short, "r-exec-1")
    assert job.max_cost == 10.0 and job.cost_of == "r-up"  # the cluster's cap, on the cluster's cost
    assert out.status == "succeeded" and (code, line) == (None, None) and provider.downs == []
    real, t0 = time.time, time.time()

    def wall():  # 27.8 h ahead (about $56 for the fleet) from 4 s into the second job (of its 60 s)
        return real() + (1e5 if real() - t0 > 4 else 0.0)

    monkeypatch.setattr(guards, "wall", wall)
    monkeypatch.setattr(guards, "COST_EVERY_S", 0.2)
    job, out, code, line = _exec(ledger, cluster, provider, spec, long_, "r-exec-2")
    assert job.max_cost == 10.0  # the cap survived the first exec
    assert out.status == "stopped" and out.exit_code == ExitCode.COST_CAP, out.failure
    assert out.failure.startswith("cost cap $10.00 reached (accrued $")
    assert code == ExitCode.COST_CAP and line.startswith("cluster 'lab': cost cap $10.00 reached") \
        and line.endswith("torn down, verified"), line
    assert provider.downs == ["lab"] and not provider.alive
    up = ledger.get_run("r-up")
    assert all(r.confirmed_gone for r in up.resources) and up.run.teardown == "verified"
    assert ledger.open_resources("lab") == []  # nothing of it bills


def test_an_exec_on_a_cluster_past_its_cap_starts_nothing_and_tears_it_down(home, monkeypatch):
    """The cap was reached between jobs (4 h at about $2.04/h against $5): `exec` (api/clusters.plan_exec,
    the CLI's and gpucluster.Cluster.exec's one path) refuses, exit 4, and as the cap says, the cluster
    goes (verified). Before this, the cluster was left billing with a hint to run `down`."""
    from gpucluster.cli import common
    from gpucluster.api.clusters import plan_exec
    from gpucluster.errors import CostCapReached

    cluster, provider, ledger, spec = _kept(home, cap=5.0)
    provider.attach = lambda name: cluster
    monkeypatch.setattr(common, "provider_for", lambda cloud, **_: provider)  # a fake fleet: one owner
    real = time.time
    monkeypatch.setattr(guards, "wall", lambda: real() + 4 * 3600)
    with pytest.raises(CostCapReached) as err:
        plan_exec("lab", dict(command=("true",), max_cost=None, max_minutes=None), ledger)
    assert err.value.exit_code == ExitCode.COST_CAP
    assert str(err.value).startswith("cluster 'lab' has reached its cost cap: cost cap $5.00 reached (accrued $8.")
    assert str(err.value).endswith("the cluster was torn down: verified")
    assert provider.downs == ["lab"] and ledger.open_resources("lab") == []
    assert [r.id for r in ledger.list_runs(limit=None)] == ["r-up"]  # no job recorded
