"""Recovery on the cloud backends' stand-ins (issue 30 items 2, 4, 5).

aws (tests/test_cloud_run.py's fake EC2 nodes: the real Automation API driver on the fake Pulumi
CLI, the real program under mocks, real sshd "instances" booting from its user data):
- a spot interruption notice: every node runs infra/aws/node_notice.py beside its job, which
  watches IMDSv2's `spot/instance-action` on a fake metadata service (tests/imds_fake.py: tokens
  required, tokens that stop working, 404 until the notice); mid-training node 1's notice comes;
  the run stops within the watcher's interval, copies the outputs, destroys the stack; the next
  attempt boots new instances and resumes from the checkpoint;
- no spot capacity while provisioning: the fake `up` fails with EC2's capacity error in each of the
  three zones the provider tries; with `--fallback on-demand --fallback-after 1` the next attempt
  runs on on-demand capacity and succeeds.
The watcher itself against the fake metadata service: a unit, without nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from imds_fake import FakeImds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WATCHER = ROOT / "infra" / "aws" / "node_notice.py"


def test_the_watcher_renews_its_token_and_reports_the_notice(tmp_path):
    """The metadata service drops every token every 0.3 s; the watcher gets a new one on each 401
    and reports the notice within its interval. (Checked once by hand: a watcher that keeps its
    first token never sees the notice and this test fails.)"""
    imds = FakeImds()
    stop = threading.Event()

    def churn():
        while not stop.wait(0.3):
            imds.invalidate()

    threading.Thread(target=churn, daemon=True).start()
    proc = subprocess.Popen([sys.executable, str(WATCHER), "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, GPUCLUSTER_IMDS_URL=imds.url))
    try:
        time.sleep(1.5)
        assert proc.poll() is None  # no notice yet: 404s, and it keeps watching
        imds.schedule()
        out, err = proc.communicate(timeout=10)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        imds.stop()
    assert proc.returncode == 0, err
    record = json.loads(out.strip().splitlines()[-1].split("@gpucluster-metric ", 1)[1])
    assert record["kind"] == "node_notice" and record["action"] == "terminate" and record["source"] == "aws spot"
    assert record["when"] == imds.action["time"]
    from gpucluster.watch.metrics import read_line  # the supervisor's parser takes it as a record (not refused)

    assert isinstance(read_line(out.strip().splitlines()[-1]), dict)
    statuses = [s for m, p, s in imds.requests if m == "GET"]
    assert 401 in statuses and 404 in statuses and statuses[-1] == 200
    assert sum(1 for m, _, s in imds.requests if m == "PUT" and s == 200) >= 2  # renewed after a 401


def test_the_watcher_gives_up_quietly_off_ec2():
    proc = subprocess.run([sys.executable, str(WATCHER), "--interval", "0.1"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, GPUCLUSTER_IMDS_URL="http://127.0.0.1:9"))
    assert proc.returncode == 0 and proc.stdout == ""
    assert "does not answer" in proc.stderr and "not watching" in proc.stderr


# -- the fake EC2 nodes -----------------------------------------------------------------------------
pytest.importorskip("yaml")
from test_cloud_run import _launcher, _provider_and_fake, checkip, dlami_python, ec2  # noqa: E402,F401

ZONAL = ("creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, "
         "api error InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge capacity in the "
         "Availability Zone you requested (us-east-1a). Our system will be working on provisioning additional "
         "capacity. You can currently get g5.xlarge capacity by not specifying an Availability Zone in your "
         "request or choosing us-east-1b, us-east-1c.")


def _spec(run_id, **kw):
    from gpucluster.spec import ClusterSpec
    from specs import validate

    spec = ClusterSpec(cloud="aws", nodes=2, name="rec", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="127.0.0.1/32", gpus_per_node=1, run_id=run_id, **kw)
    validate(spec)
    return spec


@pytest.mark.slow
@pytest.mark.sshd
def _port() -> int:
    """A free rendezvous port: the "nodes" are this machine, where parallel tests start stores too."""
    import sshd

    return sshd.free_port()


def test_aws_spot_notice_mid_training_is_recovered_on_new_instances(home, tmp_path, ec2, checkip, dlami_python):
    from recovery_faults import Fault, Interrupting
    from test_recovery import _digits_job

    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.recovery import Policy, run_chain
    from gpucluster.spec import new_run_id

    imds = [FakeImds(), FakeImds()]
    ec2.node_envs = [{"GPUCLUSTER_IMDS_URL": m.url} for m in imds]
    terminate = ec2.terminate

    def terminated() -> None:  # the instances are gone: the next ones' metadata knows no notice
        terminate()
        for m in imds:
            m.clear()

    ec2.terminate = terminated
    provider, fake, found = _provider_and_fake(ec2)
    launcher = _launcher(tmp_path, ready_timeout=90)
    assert launcher.watcher and launcher.watcher[0].endswith("node_notice.py")
    spec = _spec(new_run_id(), spot=True)
    ledger = Ledger(home / "ledger.sqlite3")
    fault = Fault(lambda: imds[1].schedule("terminate", 120), lambda: None)
    try:
        chain = run_chain(spec, _digits_job(spec.run_id, epochs=30, rdzv_port=_port()), policy=Policy(retries=1, replace_bad_nodes=True),
                          ledger=ledger, provider=provider, launcher=Interrupting(launcher, "train", fault),
                          workload="digits", backend=plugin("aws"))
    finally:
        for m in imds:
            m.stop()
    assert ec2.errors == []
    first, last = chain.attempts
    assert first.cause == "interruption", first.outcome.failure
    assert "aws spot gave notice: terminate at " in first.interruption and first.interruption.startswith("node 1 (")
    (lost,) = ledger.metrics(first.run_id, kind="node_lost")
    assert lost["phase"] == "train" and lost["detected_at"] - imds[1].scheduled_at < 30
    assert last.outcome.status == "succeeded", last.outcome.failure
    assert ec2.boots == 2 and fake.verbs().count("destroy") >= 2  # new instances for the second attempt
    start = ledger.metrics(last.run_id, kind="start")[0]
    assert start["resumed_from_step"] > 0  # the notice left time to save and to copy the outputs back
    outs = ledger.get_run(first.run_id).outputs
    assert [o.verdict for o in outs] == ["complete", "complete"]
    for a in chain.attempts:
        run = ledger.get_run(a.run_id)
        assert run.run.teardown == "verified" and float(run.cost["total"]) > 0
    assert (ledger.metrics(last.run_id, kind="attempt")[0]["after"]) == first.interruption


@pytest.mark.slow
@pytest.mark.sshd
def test_no_spot_capacity_falls_back_to_on_demand(home, tmp_path, ec2, checkip, dlami_python):
    """Attempt 1 (spot): EC2 has no capacity in us-east-1a, then b, then c (the provider's own three
    zone attempts); attempt 2 runs on on-demand capacity (--fallback on-demand --fallback-after 1)."""
    from test_recovery import _digits_job

    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.recovery import policy, run_chain
    from gpucluster.spec import new_run_id
    from types import SimpleNamespace

    provider, fake, found = _provider_and_fake(ec2, fail_up_after=4, fail_text=ZONAL, fail_up_times=3)
    zones = []
    real_up = provider.driver.up
    provider.driver.up = lambda s, ev=None: zones.append((s.zone, s.spot)) or real_up(s, ev)
    launcher = _launcher(tmp_path, ready_timeout=90)
    spec = _spec(new_run_id(), spot=True)
    pol = policy(SimpleNamespace(recover=1, fallback="on-demand", fallback_after=1), plugin("aws"), spec)
    ledger = Ledger(home / "ledger.sqlite3")
    chain = run_chain(spec, _digits_job(spec.run_id, epochs=2, rdzv_port=_port()), policy=pol, ledger=ledger, provider=provider,
                      launcher=launcher, workload="digits", backend=plugin("aws"),
                      reprice=lambda s: {"market": "spot" if s.spot else "on-demand"})
    first, last = chain.attempts
    assert first.cause == "capacity" and first.interruption.startswith("no capacity: "), first.outcome.failure
    assert ledger.get_run(first.run_id).phase("provision").status == "failed"
    spot_zones = [z for z, spot in zones if spot]
    assert len(spot_zones) == 3 and spot_zones[:2] == [None, "us-east-1b"]  # the provider's three zone attempts
    assert last.outcome.status == "succeeded", last.outcome.failure
    assert last.spot is False and ledger.get_run(last.run_id).run.spec["spot"] is False
    assert ledger.get_run(last.run_id).run.prices == {"market": "on-demand"}
    for a in chain.attempts:
        assert ledger.get_run(a.run_id).run.teardown == "verified"


def test_a_jobs_forged_notice_is_data_and_the_keyed_watchers_notice_ends_the_run(tmp_path):
    """The job prints a spot notice of its own (no key): it is refused and counted, and the run goes
    on; then the real watcher (`--keyed`, its key on stdin as the ssh node's shell gives it) reports
    the metadata service's notice: the run ends at once, that node lost, cause interruption.
    (Checked once by hand: with the notice not in control.KEYED, the job's own line ends the run.)"""
    from gpucluster.watch.control import NodeKeys, give_keys
    from gpucluster.events import NullEvents
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.supervisor import NodeSupervisor

    class Events(NullEvents):
        def __init__(self):
            self.metrics = []

        def on_metric(self, node_rank, record):
            self.metrics.append(record)

    forged = ('@gpucluster-metric {"kind": "node_notice", "source": "aws spot", "action": "terminate", '
              '"when": "2026-11-26T01:36:28Z"}')
    imds = FakeImds()
    keys = {0: NodeKeys.new(), 1: NodeKeys.new()}
    job = subprocess.Popen([sys.executable, "-c", f"import time; print({forged!r}, flush=True); time.sleep(60)"],
                           stdout=subprocess.PIPE)
    watcher = subprocess.Popen([sys.executable, str(WATCHER), "--interval", "0.2", "--keyed"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=dict(os.environ, GPUCLUSTER_IMDS_URL=imds.url))
    give_keys(watcher, (keys[1].keys["node_notice"] + "\n").encode())
    events = Events()
    sup = NodeSupervisor(JobSpec(run_id="r1", command=("x",)), events, tmp_path, ["h0", "h1"], keys=keys)
    sup.attach(0, job.stdout)
    sup.attach(1, watcher.stdout)
    timer = threading.Timer(3.0, imds.schedule)
    timer.start()
    t0 = time.monotonic()
    try:
        result = sup.run({0: job, 1: watcher}, stop=lambda: [p.kill() for p in (job, watcher)])
    finally:
        timer.cancel()
        for p in (job, watcher):
            if p.poll() is None:
                p.kill()
            p.wait()
        imds.stop()
    took = time.monotonic() - t0
    assert 3.0 <= took < 15, took  # not ended by the job's line; ended by the watcher's, within seconds
    assert result.failure.startswith("node 1 (h1) lost: aws spot gave notice: terminate at "), result.failure
    (lost,) = [m for m in events.metrics if m["kind"] == "node_lost"]
    assert (lost["node_rank"], lost["cause"]) == (1, "interruption")
    assert sup.metrics.refused == 1  # the job's own copy, counted and not acted on


# -- saving within the notice ---------------------------------------------------------------------
def test_save_grace_is_the_notices_time_less_the_outputs_margin():
    from gpucluster.watch.nodeloss import NOTICE_S, OUTPUTS_MARGIN_S, save_grace

    now = 1_800_000_000.0
    at = lambda s: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + s))  # noqa: E731
    assert save_grace({"when": at(120)}, 3.0, now) == 120 - OUTPUTS_MARGIN_S
    assert save_grace({"when": at(50)}, 3.0, now) == 50 - OUTPUTS_MARGIN_S  # found late: less is left
    assert save_grace({"when": at(20)}, 3.0, now) == 3.0  # too late to save: the usual grace
    assert save_grace({"when": at(3600)}, 3.0, now) == NOTICE_S - OUTPUTS_MARGIN_S  # a skewed clock: bounded
    assert save_grace({}, 3.0, now) == save_grace({"when": "soon"}, 3.0, now) == NOTICE_S - OUTPUTS_MARGIN_S


@pytest.mark.slow
@pytest.mark.sshd
def test_a_save_longer_than_the_usual_grace_survives_a_spot_notice(tmp_path, monkeypatch):
    """Two real sshd "nodes", each with the aws watcher (node_notice.py) beside its job and a fake
    metadata service of its own; the job (tests/fixtures/slow_save.py) takes 6 s to write its
    checkpoint on SIGTERM, twice the launchers' usual grace (3 s; 1 s inside the node's supervisor).
    Node 1's notice comes mid-run: the ranks get the notice's time, less the outputs margin, to save;
    both checkpoints are written and come back, and the stop ends once the ranks have exited, not
    after the whole grace. (Checked once by hand: with the stop using the usual grace, as before,
    neither checkpoint is written and this test fails.)"""
    import shutil

    import sshd

    reason = sshd.missing_reason()
    if reason:
        pytest.skip(reason)
    from gpucluster.watch.launch import JobSpec

    imds = [FakeImds(), FakeImds()]
    hosts = sshd.SshdHosts.start(tmp_path / "sshd", 2, env=[{"GPUCLUSTER_IMDS_URL": m.url} for m in imds])
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "slow_save.py", project / "train.py")
    monkeypatch.chdir(project)
    remote = tmp_path / "remote"
    launcher = sshd.make_launcher(hosts, remote, watcher=(str(WATCHER), "--interval", "0.5", "--keyed"))
    launcher.grace = 3.0  # the launchers' default
    started: set[int] = set()

    def on_line(rank, line):
        if line.strip() == "started":
            started.add(rank)
            if started == {0, 1} and imds[1].action is None:
                imds[1].schedule("terminate", 120)

    events = sshd.Recorder(on_line=on_line)
    out = tmp_path / "out"
    job = JobSpec(f"notice-{os.getpid()}", command=("python", "train.py"), rdzv_port=sshd.free_port(),
                  max_seconds=120, threads_per_proc=1, output_dir=str(out))
    cluster = sshd.cluster_of(hosts, 2)
    try:
        result = launcher.launch(cluster, job, events, tmp_path / "logs")
        stopped_at = time.time()
        outs = launcher.collect_outputs(job, events)
        sshd.assert_nothing_left(hosts, cluster, job.run_id, remote)
    finally:
        hosts.stop()
        for m in imds:
            m.stop()
    assert imds[1].scheduled_at is not None, events.lines[-20:]
    assert result.failure.startswith("node 1 (") and "aws spot gave notice: terminate" in result.failure, result.failure
    lost = [r for _, r in events.metrics if r.get("kind") == "node_lost"]
    assert [(r["node_rank"], r["cause"]) for r in lost] == [(1, "interruption")]
    for n in (0, 1):  # every rank saved: 6 s, past the usual grace, within the notice
        assert (out / f"node-{n}" / "checkpoint.txt").read_text().startswith("saved in 6."), n
    assert [o.verdict for o in outs] == ["complete", "complete"]
    took = stopped_at - imds[1].scheduled_at
    assert 6 < took < 30, took  # the save's 6 s, not the notice's 90 s of grace
