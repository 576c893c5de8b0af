"""Recovery on gcp, end to end on the stand-ins (issue 30 items 2, 4, 5): the real recovery chain
(gpucluster/lifecycle/recovery.py) with the gcp PulumiProvider driving the fake Pulumi CLI and the Kubernetes
launcher against fake GKE clusters (tests/gke_fake.py: each `up` makes a new cluster, a new API server
at a new endpoint reached from the stack's kubeconfig with Google credentials; `destroy` deletes it
with its pods), whose pods run the launcher's real entry programs and digits itself (gloo, CPU).

Mid-training (at the first epoch record) node 1's pod is preempted: the kubelet's graceful node shutdown
(tests/k8s_fake.py `preempt`: SIGTERM to its containers, then Failed, reason Terminated, with a
DisruptionTarget condition). The run detects it within 30 s of the fault, stops the other ranks (they
save on SIGTERM), copies what outputs it can (node 0's: node 1's pod is gone, no exec into it), tears
the cluster down; the next attempt provisions a new cluster, stages the last checkpoint into its pods
and resumes from it; the chain has 2 attempts with the interruption's reason; nothing is left.
The same chain through `gpucluster run --cloud gcp --spot --recover 1`, each attempt priced.

Checked once by hand (2026-11-26), each stand-in behaviour against the old, kinder one:
- a new cluster at a new endpoint per `up`, deleted by `destroy`: with a launcher that kept its first
  cluster's API client, the second attempt fails here ("staging the data failed: ... Connection
  refused"); against one cluster that outlives `destroy` the same launcher's chain succeeded;
- the tag scan reports the cluster until it is deleted: with a provider that skipped `pulumi
  destroy`, the chain stops after the first attempt (its teardown finds the cluster); with the old
  scan that never finds anything it went on to a second attempt over the undeleted cluster;
- the fake CLI reports the program's resources with their inputs: with the old one (no inputs) the
  attempts were priced as on-demand n1 VMs without GPUs and the CLI test's cost assertion fails."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("kubernetes")
pytest.importorskip("torch")
pytest.importorskip("pulumi.automation")
pytest.importorskip("pulumi_gcp")

pytestmark = pytest.mark.slow


def _spec(run_id, **kw):
    from gpucluster.spec import ClusterSpec
    from specs import validate

    spec = ClusterSpec(cloud="gcp", nodes=2, name="rec", zone="us-central1-a", instance_type="n1-standard-8",
                       accelerator="nvidia-tesla-v100", gpus_per_node=1, project="my-proj-42", run_id=run_id, **kw)
    validate(spec)
    return spec


def _no_process_left(run_id: str, within_s: float = 20.0) -> list:
    """The run's processes on this machine (the fake pods' containers), once they have had the time a
    deleted pod's containers get to end (the pods' 15 s grace; at once, unless the machine is loaded)."""
    from gpucluster.watch.procs import run_processes

    end = time.monotonic() + within_s
    while run_processes(run_id) and time.monotonic() < end:
        time.sleep(0.2)
    return run_processes(run_id)


def test_a_preempted_gke_node_is_recovered_on_a_new_cluster(home, tmp_path):
    from gke_fake import GkeLike
    from recovery_faults import Fault, Interrupting
    from test_k8s_check import free_port
    from test_recovery import _digits_job

    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.recovery import Policy, run_chain
    from gpucluster.spec import new_run_id

    gke = GkeLike()
    provider, fake = gke.provider("rec")
    launcher = gke.launcher(poll_interval=0.5)
    spec = _spec(new_run_id(), spot=True)
    ledger = Ledger(home / "ledger.sqlite3")
    struck: list = []

    def preempt() -> None:  # node 1's GKE node shuts down: its pod gets SIGTERM, then is Failed
        struck.append(gke.current)
        gke.current.preempt(1, reason="Shutdown")

    fault = Fault(preempt)
    t0 = time.monotonic()
    try:
        chain = run_chain(spec, _digits_job(spec.run_id, epochs=4, every=5, rdzv_port=free_port()),
                          policy=Policy(retries=1, replace_bad_nodes=True), ledger=ledger, provider=provider,
                          launcher=Interrupting(launcher, "train", fault), workload="digits", backend=plugin("gcp"))
    finally:
        gke.stop()
    took = time.monotonic() - t0
    first, last = chain.attempts
    assert first.cause == "interruption", first.outcome.failure
    assert first.interruption.startswith("node 1 (") and " lost: pod " in first.interruption, first.interruption
    assert "imminent node shutdown" in first.interruption
    (lost,) = ledger.metrics(first.run_id, kind="node_lost")
    assert lost["phase"] == "train" and lost["detected_at"] - fault.fired_at < 30
    assert last.outcome.status == "succeeded", last.outcome.failure
    # a new cluster for the second attempt: the first one's API server and pods are gone
    assert len(gke.clusters) == 2 and gke.urls[0] != gke.urls[1] and struck == gke.clusters[:1]
    assert fake.verbs().count("up") == 2 and fake.verbs().count("destroy") >= 2
    assert [c[1] for c in gke.clusters[1].of("create")][:3] == ["configmap", "service", "job"]
    # what came back from the first attempt: node 0's outputs (its rank saved on SIGTERM); node 1's
    # pod was preempted with its node, so nothing of it could be copied
    outs = {o.node_rank: o for o in ledger.get_run(first.run_id).outputs}
    assert outs[0].verdict == "complete", outs[0]
    assert outs[1].verdict != "complete", outs[1]
    # the resumed attempt started from the checkpoint, not from scratch
    (start,) = [m for m in ledger.metrics(last.run_id, kind="start") if m.get("rank") == 0]
    assert start["resumed_from_step"] > 0 and start["resumed_from_epoch"] >= 1, start
    assert start["resumed_from"].startswith(str(gke.clusters[1].root))  # staged into the new cluster's pod
    epochs = [m["epoch"] for m in ledger.metrics(last.run_id, kind="epoch")]
    assert epochs and epochs[0] == start["resumed_from_epoch"] + 1 and epochs[-1] == 4, epochs
    assert ledger.metrics(last.run_id, kind="attempt")[0]["after"] == first.interruption
    assert ledger.get_run(last.run_id).chain == [first.run_id, last.run_id]
    # nothing is left: the stack is empty, no cluster, no pod, no process of either attempt
    assert fake.stacks.get("rec", []) == [] and gke.current is None
    for c in gke.clusters:
        assert c.pods == {} and c.objects == {}
    for a in chain.attempts:
        run = ledger.get_run(a.run_id)
        assert run.run.teardown == "verified", (a.run_id, run.run.teardown, run.run.unchecked)
        assert all(r.confirmed_gone for r in run.resources)
        assert _no_process_left(a.run_id) == []
    assert took < 120, took


def test_gpucluster_run_recovers_a_preempted_gke_node_through_the_cli(home, monkeypatch):
    """The same chain through `gpucluster run --cloud gcp --spot --recover 1` (Click, the plan, the
    prices, the ledger, `run_plan`), with the provider and the launcher the plan makes swapped for
    the stand-ins' (the launcher is the one `run` makes, given the fake Google credentials). The
    torchrun argv names the default rendezvous port, but the fake pods' torchrun never binds it (it
    listens on a free port and publishes it under the pod's DNS names: tests/k8s_fake_torchrun.py)."""
    from gke_fake import FakeGoogleCredentials, GkeLike
    from recovery_faults import Fault, Interrupting

    from gpucluster.lifecycle import prepare
    from gpucluster.cli import run
    from gpucluster.ledger.store import Ledger

    gke = GkeLike()
    ok = [{"check": "gcp application-default credentials", "ok": True, "detail": "fake"}]
    provider, fake = gke.provider("rec", provider_kw={"credentials": lambda *a: ok, "cloud_checks": lambda s: None})
    fault = Fault(lambda: gke.current.preempt(1, reason="Shutdown"))
    real_make = prepare._make
    made = []

    def make(req, backend, spec, _provider, ready):
        _, launcher = real_make(req, backend, spec, None, ready)  # the Kubernetes launcher `run` makes
        launcher.credentials, launcher.poll_interval, launcher.api_retry_s = FakeGoogleCredentials(), 0.5, 10
        made.append(launcher)
        return provider, Interrupting(launcher, "train", fault)

    monkeypatch.setattr(prepare, "_make", make)
    try:
        code = run.run.main(["--cloud", "gcp", "--name", "rec", "--project", "my-proj-42", "--zone", "us-central1-a",
                             "--nodes", "2", "--gpus-per-node", "1", "--spot", "--recover", "1", "--no-check",
                             "--workload", "digits", "--epochs", "3", "--checkpoint-every", "5",
                             "--threads-per-proc", "1", "--yes"], standalone_mode=False)
    finally:
        gke.stop()
    assert made and type(made[0]).__name__ == "KubernetesLauncher"
    ledger = Ledger.open_default()
    runs = sorted(ledger.list_runs(), key=lambda r: r.created_at)
    assert code == 0, [(r.id, r.status, r.failure) for r in runs]
    first, last = runs
    assert (first.status, last.status) == ("failed", "succeeded") and last.resumed_from == first.id
    (one,) = ledger.metrics(first.id, kind="attempt")
    (two,) = ledger.metrics(last.id, kind="attempt")
    assert (one["attempt"], one["cause"], two["attempt"], two["cause"]) == (1, "interruption", 2, None)
    assert two["after"] == one["interruption"] and one["interruption"].startswith("node 1 (")
    assert "imminent node shutdown" in one["interruption"], one
    (lost,) = ledger.metrics(first.id, kind="node_lost")
    assert lost["detected_at"] - fault.fired_at < 30
    (start,) = [m for m in ledger.metrics(last.id, kind="start") if m.get("rank") == 0]
    assert start["resumed_from_step"] > 0, start
    assert len(gke.clusters) == 2 and fake.stacks.get("rec", []) == [] and gke.current is None
    for c in gke.clusters:
        assert c.pods == {} and c.objects == {}
    for r in runs:
        assert ledger.get_run(r.id).run.teardown == "verified" and _no_process_left(r.id) == []
        # each attempt is priced from what the program declared: its GPU pool's spot V100s, by the second
        cost = ledger.get_run(r.id).cost
        gpus = [ln for ln in cost["lines"] if ln["category"] == "gpus"]
        assert [g["description"] for g in gpus] == ["2 x V100 (spot)"] and float(cost["total"]) > 0, cost
