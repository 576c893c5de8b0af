"""Which clusters `exec` and `ssh` accept (gpucluster/lifecycle/kept.py), and the process check that stands for
the teardown of a job on a kept cluster. The ledger is real; the end-to-end runs are tests/test_kept.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpucluster.domain import Cluster, Leftover, Node
from gpucluster.errors import ClusterBusy, ExitCode, UsageError
from gpucluster.lifecycle.kept import Attached, check_fits, close_processes, find
from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _kept(led: Ledger, name: str = "demo", *, status: str = "succeeded", teardown: str | None = "kept",
          lifetime: int = 240, created: float | None = None) -> str:
    rid = f"r20261126-{len(led.list_runs(limit=None)):06d}-abcdef"
    now = created or time.time()
    led.create_run(rid, cloud="aws", cluster=name, nodes=2, gpus_per_node=1, command=["gpucluster", "up"],
                   spec={"cloud": "aws", "nodes": 2, "name": name, "max_lifetime_minutes": lifetime}, now=now)
    led.resource_requested(rid, "instance", f"{name}-0", now=now)
    if status != "running":
        led.finish_run(rid, status=status, exit_code=0, teardown=teardown, now=now + 60)
    return rid


def test_what_is_refused_and_why(home):
    led = Ledger.open_default()
    with pytest.raises(UsageError, match='not in the ledger; create one'):
        find(led, "demo")
    rid = _kept(led)
    assert find(led, "demo").origin.id == rid
    with pytest.raises(UsageError, match='"demo"'):  # did you mean
        find(led, "dem0")
    led.resource_deleted(rid, "instance", "demo-0")
    with pytest.raises(UsageError, match="is not up: the ledger holds nothing of it"):
        find(led, "demo")
    _kept(led, "orphan", status="running")
    with pytest.raises(UsageError, match="never finished.*gpucluster down orphan"):
        find(led, "orphan")
    _kept(led, "broken", teardown="leftovers")
    with pytest.raises(UsageError, match="its teardown said leftovers; finish it with `gpucluster down broken`"):
        find(led, "broken")


def test_a_cluster_another_process_uses_is_busy_for_exec_not_for_ssh(home):
    led = Ledger.open_default()
    rid = _kept(led)
    job = "r20261126-999999-bbbbbb"
    led.create_run(job, cloud="aws", cluster="demo", nodes=2, gpus_per_node=1, command=["python", "x.py"],
                   spec={"cloud": "aws", "nodes": 2, "name": "demo"})
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom gpucluster.lifecycle.owner import owner_lock\n"
        f"with owner_lock('demo', 'run', run_id={job!r}):\n    print('locked', flush=True)\n    time.sleep(30)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ClusterBusy, match="in use by"):
            find(led, "demo")
        assert find(led, "demo", in_use_ok=True).origin.id == rid  # a shell or a tunnel beside the job
    finally:
        holder.kill()
        holder.wait()


def test_a_job_limit_past_the_dead_man_deadline_is_refused(home):
    led = Ledger.open_default()
    _kept(led, lifetime=60, created=time.time() - 50 * 60)
    kept = find(led, "demo")
    with pytest.raises(UsageError, match="--max-minutes 20 is not allowed.*power themselves off in 10 min"):
        check_fits(kept, 20 * 60)
    assert check_fits(kept, 5 * 60) is None
    assert "power themselves off in 10 min" in check_fits(kept, None)
    led2 = Ledger.open_default()
    _kept(led2, "old", lifetime=60, created=time.time() - 61 * 60)
    with pytest.raises(UsageError, match="max lifetime has passed"):
        check_fits(find(led2, "old"), None)


def test_the_attached_provider_creates_and_deletes_nothing():
    cluster = Cluster(name="demo", cloud="aws", nodes=(Node(0, "203.0.113.1", "10.0.0.1"),))
    said = []

    class Events:
        def message(self, text):
            said.append(text)

    p = Attached(cluster)
    assert p.up(None, Events()) is cluster and "nothing created" in said[0]
    with pytest.raises(UsageError, match="does not tear it down"):
        p.down("demo", Events())
    with pytest.raises(UsageError):
        p.leftovers("demo")


class _Launcher:
    def __init__(self, answer):
        self.answer = answer

    def leftovers(self, cluster, run_id):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer,code,verdict,closed", [
    ([], None, "kept", True),
    ([Leftover("process", "ubuntu@203.0.113.1/pid 42", detail="python x.py")], ExitCode.LEFTOVERS, "leftovers", False),
    (OSError("connection refused"), ExitCode.LEFTOVERS, "not verified", False),
])
def test_the_job_s_processes_are_checked_after_it(home, answer, code, verdict, closed):
    led = Ledger.open_default()
    rid = "r20261126-000001-cccccc"
    led.create_run(rid, cloud="aws", cluster="demo", nodes=1, gpus_per_node=1, command=["x"], spec={})
    led.resource_requested(rid, "process", "node-0")
    led.resource_created(rid, "process", "node-0", "ubuntu@203.0.113.1:/x/pgid")
    led.finish_run(rid, status="succeeded", exit_code=0, teardown="kept")
    cluster = Cluster(name="demo", cloud="aws", nodes=(Node(0, "203.0.113.1", "10.0.0.1"),))
    forced, said = close_processes(led, _Launcher(answer), cluster, rid)
    assert forced == code
    rec = led.get_run(rid)
    assert rec.run.teardown == verdict
    assert all(r.confirmed_gone for r in rec.resources) is closed
    if code is not None:
        assert said


def test_a_cluster_whose_nodes_are_not_addressed_counts_them_from_its_outputs():
    """gcp: `cluster_from_outputs` gives no addressed nodes (one pod per node) and the count in
    outputs["nodes"]; `exec` and `ssh` take it, and refuse a cluster with none."""
    from gpucluster.lifecycle.kept import Kept, attach, node_count

    kept = Kept("gke", "gcp", [], None, {})

    class Stack:
        def __init__(self, outputs):
            self.outputs = outputs

        def attach(self, name):
            return Cluster(name, "gcp", (), outputs=self.outputs)

    assert node_count(attach(Stack({"nodes": 2}), kept)) == 2
    for outputs in ({"nodes": 0}, {}, {"nodes": "x"}):
        with pytest.raises(UsageError, match="has no node up"):
            attach(Stack(outputs), kept)


class _Reclaimer:
    """A launcher's `leftovers(..., remove=True)` as the lifecycle sees it: None (cannot), or what is still there."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def leftovers(self, cluster, run_id, *, remove=False):
        assert remove, "a dead run is reclaimed, not only listed"
        self.asked.append(run_id)
        return self.answer


@pytest.mark.parametrize("answer,refused", [
    (None, "never finished.*what it started there may still run: k8s-job default/gpucluster-x"),
    ([Leftover("k8s-job", "default/gpucluster-x")], "could not all be deleted: k8s-job default/gpucluster-x"),
    ([], None),
])
def test_a_job_whose_process_died_is_reclaimed_by_the_next_exec_or_refused(home, answer, refused):
    from gpucluster.lifecycle.kept import reclaim

    led = Ledger.open_default()
    origin = _kept(led)
    dead = "r20261126-000009-dddddd"
    led.create_run(dead, cloud="gcp", cluster="demo", nodes=2, gpus_per_node=1, command=["python", "x.py"], spec={})
    led.resource_requested(dead, "k8s-job", "default/gpucluster-x")
    led.resource_created(dead, "k8s-job", "default/gpucluster-x")
    with pytest.raises(UsageError, match="never finished.*k8s-job default/gpucluster-x"):
        find(led, "demo")  # `ssh` and anything but exec: refused, naming what it left
    kept = find(led, "demo", dead_ok=True)
    assert kept.dead.id == dead and kept.origin.id == origin
    launcher = _Reclaimer(answer)
    cluster = Cluster(name="demo", cloud="gcp", nodes=())
    if refused:
        with pytest.raises(UsageError, match=refused):
            reclaim(led, launcher, cluster, kept)
        assert led.get_run(dead).run.status == "running" and not led.get_run(dead).resources[0].confirmed_gone
    else:
        assert "had ended without cleanup" in reclaim(led, launcher, cluster, kept)
        rec = led.get_run(dead)
        assert rec.run.status == "failed" and all(r.confirmed_gone for r in rec.resources)
    assert launcher.asked == [dead]
    # a cluster whose maker died is never reclaimed: `down` finishes it
    _kept(led, "orphan", status="running")
    with pytest.raises(UsageError, match="never finished.*gpucluster down orphan"):
        find(led, "orphan", dead_ok=True)
