"""A kept gcp cluster end to end through the CLI (issue 29 item 3 on gcp): `gpucluster up --cloud gcp`
keeps a cluster, `gpucluster exec CLUSTER -- python script.py` runs a new job on it twice (each its own
run row on the cluster, outputs back, no teardown), `gpucluster down CLUSTER` deletes it, verified.

The stand-ins are the ones a whole gcp run goes through in tests/test_recovery_gcp.py: the gcp
PulumiProvider on the real Automation API driver, which runs the FAKE Pulumi CLI
(tests/pulumi_fake.py), whose `up` makes a FAKE GKE cluster (tests/gke_fake.py: the real gcp program's
outputs under Pulumi's mocks, the kubeconfig pointing at a new fake API server whose pods run the
launcher's real entry programs as processes here) and whose `destroy` deletes it with its pods. The
commands are the real Click commands (`gpucluster.cli.main.main`, in this process: the fake CLI and
the fake cluster live here); `provider_for` returns that provider, Google's application-default
credentials are the fake's token. `exec` makes its launcher as it always does (the gcp transport's
KubernetesLauncher on the kept stack's kubeconfig); only its pod poll interval is shortened.

How the stand-ins behave, each from a public source, is in tests/gke_fake.py. What this test adds:
- a GKE stack lists no nodes: the program declares node pools, whose nodes GKE itself creates and
  deletes ("node pools are logical groups of nodes", GKE manages "creating and deleting nodes in the
  node pool": cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning), so the
  cluster read from the stack's outputs has no node list and `exec` must take the count from its
  `nodes` output. Checked once by hand (2026-11-26) against the old code: with `kept.attach`
  counting `cluster.nodes`, the first `exec` fails ("cluster 'kgke' has no node up", exit 2); with
  `Attached.up` counting them (the bug this test found), its line says "0 node(s)" and fails here.
- the GPU nodes' disks outlive a job's pods (hostPath, tests/k8s_fake.py `host_root`: a folder per
  node of the cluster, gone with it): the second `exec`, run at once (well within the cluster
  autoscaler's 10 minutes before it removes unneeded nodes, docs/gcp.md), lands on the same nodes
  and finds its data in their cache; every node holds the whole data, so which pod lands on which
  node does not matter. A pool scaled to zero between jobs would send it all again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("kubernetes")
pytest.importorskip("pulumi.automation")
pytest.importorskip("pulumi_gcp")

pytestmark = pytest.mark.slow

NAME = "kgke"
SCRIPT = """\
import os
rank = os.environ["RANK"]
out = os.environ["GPUCLUSTER_OUTPUT_DIR"]
data = sorted(os.listdir(os.environ["GPUCLUSTER_DATA"]))
with open(os.path.join(out, "marker-" + rank + ".txt"), "w") as f:
    f.write("rank %s of %s job %s data %s\\n" % (rank, os.environ["WORLD_SIZE"], os.environ["GPUCLUSTER_RUN_ID"],
                                              ",".join(data)))
print("script ran on rank", rank, flush=True)
"""


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from gpucluster.cli.main import main

    code = main(list(args))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_up_exec_twice_and_down_on_a_kept_gke_cluster(home, tmp_path, monkeypatch, capsys):
    from gke_fake import FakeGoogleCredentials, GkeLike
    from test_recovery_gcp import _no_process_left

    from gpucluster.lifecycle import prepare
    from gpucluster.cli import common
    from gpucluster.infra.gcp import access
    from gpucluster.ledger.store import Ledger

    gke = GkeLike(nodes=2)
    ok = [{"check": "gcp application-default credentials", "ok": True, "detail": "fake"}]
    provider, fake = gke.provider(NAME, provider_kw={"credentials": lambda *a: ok, "cloud_checks": lambda s: None})
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider.scoped(**scope))
    monkeypatch.setattr(access, "google_credentials", lambda credentials=None: FakeGoogleCredentials())
    real_make = prepare._make
    launchers: list = []

    def make(req, backend, spec, given, ready):
        made, launcher = real_make(req, backend, spec, given, ready)
        if launcher is not None:  # exec's: the launcher `exec` makes, polling faster
            launcher.poll_interval, launcher.api_retry_s = 0.5, 10
            launchers.append(launcher)
        return made, launcher

    monkeypatch.setattr(prepare, "_make", make)
    job = tmp_path / "job"
    job.mkdir()
    (job / "script.py").write_text(SCRIPT)
    data = tmp_path / "dataset"
    data.mkdir()
    for i in range(3):
        (data / f"part-{i}.bin").write_bytes(os.urandom(50_000))
    t0 = time.monotonic()
    try:
        code, out, err = _cli(capsys, "up", "--cloud", "gcp", "--name", NAME, "--project", "my-proj-42",
                              "--zone", "us-central1-a", "--nodes", "2", "--gpus-per-node", "1", "--yes")
        assert code == 0, out + err
        assert fake.verbs().count("up") == 1 and "destroy" not in fake.verbs()
        (cluster,) = gke.clusters
        code, out, err = _cli(capsys, "status", "--json")
        assert code == 0, out + err
        status = json.loads(out)
        assert [(s["cluster"], s["state"]) for s in status] == [(NAME, "kept")], status

        monkeypatch.chdir(job)
        exec_out, seen = [], set()
        for _ in range(2):
            code, out, err = _cli(capsys, "exec", NAME, "--data", str(data), "--", "python", "script.py")
            assert code == 0 and "Traceback" not in err, out[-3000:] + err[-3000:]
            assert f"exec on kept cluster {NAME} (2 node(s) on gcp" in out, out
            assert f"on kept cluster {NAME}: 2 node(s), nothing created" in out, out  # GKE lists no nodes
            assert f"teardown: cluster kept (--keep); remove it with 'gpucluster down {NAME}'" in out, out
            assert f"the nodes bill to cluster {NAME}" in out
            # the job's objects are ledger rows now, each confirmed gone: not "nothing was billed"
            assert "nothing was billed" not in out, out
            # what the job made on the cluster was deleted when it ended (the fake keeps a deleted
            # object or pod listed as terminating for a few listings, as the API server does while
            # its finalizers run): nothing of it stays, its containers' processes are gone
            (made,) = {c[3] for c in cluster.of("create") if c[1] == "job"} - seen
            seen.add(made)
            assert {c[1] for c in cluster.of("delete") if c[3] == made} == {"job", "service", "configmap"}
            assert [k for k in cluster.objects if k[1] == made and k not in cluster.terminating] == [], cluster.objects
            assert [n for n, p in cluster.pods.items() if made in n and p.terminating is None] == [], cluster.pods
            assert _no_process_left(made.removeprefix("gpucluster-")) == []
            cluster.settle()
            exec_out.append(out)
            # the cluster is still there: the same API server, the stack untouched (no destroy verb)
            assert gke.current is cluster and fake.verbs().count("up") == 1 and "destroy" not in fake.verbs()
            assert fake.stacks.get(NAME)
        assert len(launchers) == 2 and all(type(x).__name__ == "KubernetesLauncher" for x in launchers)

        ledger = Ledger.open_default()
        up_run, first, second = sorted(ledger.list_runs(limit=None), key=lambda r: r.created_at)
        assert [r.cluster for r in (up_run, first, second)] == [NAME] * 3
        assert up_run.teardown == "kept"
        for run in (first, second):
            rec = ledger.get_run(run.id)
            assert rec.run.status == "succeeded" and rec.run.teardown == "kept", (rec.run.failure, rec.run.teardown)
            assert rec.run.command == ["python", "script.py"] and rec.run.cloud == "gcp"
            outs = Path(rec.run.log_dir) / "outputs"
            for rank in (0, 1):  # the script ran on every node and its file came back
                assert (outs / f"node-{rank}" / f"marker-{rank}.txt").read_text() == \
                    f"rank {rank} of 2 job {run.id} data part-0.bin,part-1.bin,part-2.bin\n"
            assert {o.verdict for o in rec.outputs} == {"complete"}, rec.outputs
            job_name = f"default/gpucluster-{run.id}"  # each object a row, requested, created, confirmed gone
            assert sorted((r.kind, r.name) for r in rec.resources) == [
                ("k8s-configmap", job_name), ("k8s-job", job_name), ("k8s-service", job_name)], rec.resources
            assert all(r.created_at and r.confirmed_gone and r.deleted_at for r in rec.resources), rec.resources
            assert _no_process_left(run.id) == []
        # the second job found the data in the GPU nodes' cache (hostPath, kept with the nodes): nothing sent
        stage1, stage2 = (ledger.metrics(r.id, "stage") for r in (first, second))
        assert len(stage1) == len(stage2) == 2, (stage1, stage2)
        assert all(m["sent_files"] == 3 for m in stage1) and all(m["sent_files"] == 0 for m in stage2), (stage1, stage2)
        # each job was a Job of its own on the one cluster
        jobs = [c[3] for c in cluster.of("create") if c[1] == "job"]
        assert jobs == [f"gpucluster-{first.id}", f"gpucluster-{second.id}"], jobs
        # only the `up` run's rows hold the cluster: the jobs left no open row
        assert {r["run_id"] for r in ledger.open_resources(NAME)} == {up_run.id}

        code, out, err = _cli(capsys, "down", NAME, "--yes")
        assert code == 0, out + err
        assert f"{NAME}: down; verified by tag: every check ran and found nothing of ours" in out, out
    finally:
        gke.stop()
    took = time.monotonic() - t0
    assert fake.verbs().count("destroy") == 1 and fake.stacks.get(NAME, []) == [] and gke.current is None
    assert cluster.pods == {} and cluster.objects == {}
    assert ledger.open_resources(NAME) == []
    assert ledger.get_run(up_run.id).run.teardown == "verified"
    for run in (up_run, first, second):
        assert _no_process_left(run.id) == []
    code, out, err = _cli(capsys, "status", "--json")
    assert code == 0 and json.loads(out) == [], out + err
    code, out, err = _cli(capsys, "exec", NAME, "--", "python", "script.py")
    assert code == 2 and f"cluster '{NAME}' is not up" in err, out + err
    assert took < 60, took


LONG = """\
import time
print("long job started", flush=True)
time.sleep(120)
"""


def test_an_exec_killed_mid_job_leaves_rows_that_the_next_exec_or_down_cleans(home, tmp_path, monkeypatch, capsys):
    """`gpucluster exec` SIGKILLed while its Job runs: no cleanup runs (SIGKILL cannot be caught,
    signal(7)), so the Job, Service and ConfigMap stay on the cluster, their ledger rows open (written
    before each create) and the run row `running`. The next `exec` deletes them by the run's label,
    reads them back, closes the rows and finishes the killed run, then runs its own job; a second
    killed `exec` is left to `down`, which deletes the cluster with its objects and verifies: every
    row closed, the killed run finished as failed.

    The killed `exec` is a real process: tests/kept_gcp_cli.py (the real CLI, the stack's outputs from
    a file) reaching this test's fake API server over HTTP, as `ssh` does in tests/test_gcp_ssh.py."""
    import signal
    import subprocess

    from gke_fake import TOKEN, FakeGoogleCredentials, GkeLike
    from test_recovery_gcp import _no_process_left

    from gpucluster.cli import common
    from gpucluster.infra.gcp import access
    from gpucluster.ledger.store import Ledger

    gke = GkeLike(nodes=2)
    ok = [{"check": "gcp application-default credentials", "ok": True, "detail": "fake"}]
    provider, fake = gke.provider(NAME, provider_kw={"credentials": lambda *a: ok, "cloud_checks": lambda s: None})
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider.scoped(**scope))
    monkeypatch.setattr(access, "google_credentials", lambda credentials=None: FakeGoogleCredentials())
    job = tmp_path / "job"
    job.mkdir()
    (job / "long.py").write_text(LONG)
    (job / "script.py").write_text('print("short job", flush=True)\n')
    outputs = tmp_path / "outputs.json"
    procs: list = []

    def killed_exec(cluster):
        """An `exec` of the long script, SIGKILLed once both pods run; (its run, its Job's name)."""
        env = {**os.environ, "GPUCLUSTER_HOME": str(home), "FAKE_GCP_OUTPUTS": str(outputs), "FAKE_GCP_TOKEN": TOKEN,
               "COLUMNS": "200"}
        proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "kept_gcp_cli.py"), "exec", NAME,
                                 "--", "python", "long.py"], cwd=job, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        running: list = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and len(running) < 2:
            time.sleep(0.2)
            running = [p for p in list(cluster.pods.values()) if p.terminating is None and p.phase == "Running"]
        assert proc.poll() is None and len(running) == 2, (proc.poll(), cluster.pods)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        run = max(Ledger.open_default().list_runs(limit=None), key=lambda r: r.created_at)
        made = f"gpucluster-{run.id}"
        assert run.status == "running"  # nothing finished it
        # what it made is still on the cluster, and each is an open row of the killed run
        assert {k for k in cluster.objects if k[1] == made and k not in cluster.terminating} == {
            ("configmap", made), ("service", made), ("job", made)}, cluster.objects
        rows = Ledger.open_default().get_run(run.id).resources
        assert sorted((r.kind, r.name, bool(r.created_at), r.confirmed_gone) for r in rows) == [
            (k, f"default/{made}", True, False) for k in ("k8s-configmap", "k8s-job", "k8s-service")], rows
        return run, made

    try:
        code, out, err = _cli(capsys, "up", "--cloud", "gcp", "--name", NAME, "--project", "my-proj-42",
                              "--zone", "us-central1-a", "--nodes", "2", "--gpus-per-node", "1", "--yes")
        assert code == 0, out + err
        (cluster,) = gke.clusters
        outputs.write_text(json.dumps({NAME: fake.scripted_outputs}))
        first, made = killed_exec(cluster)
        # the next exec deletes them by the run's label first, then runs its own job
        monkeypatch.chdir(job)
        code, out, err = _cli(capsys, "exec", NAME, "--", "python", "script.py")
        # (err may hold the fake API server's own traceback: the killed client's log stream broke its pipe)
        assert code == 0 and "gpucluster: error" not in err, out[-3000:] + err[-3000:]
        assert f"run {first.id} had ended without cleanup" in out, out
        assert {c[1] for c in cluster.of("delete") if c[3] == made} == {"job", "service", "configmap"}
        assert [k for k in cluster.objects if k[1] == made and k not in cluster.terminating] == []
        ledger = Ledger.open_default()
        rec = ledger.get_run(first.id)
        assert rec.run.status == "failed" and "deleted by the next `gpucluster exec`" in rec.run.failure
        assert all(r.confirmed_gone for r in rec.resources), rec.resources
        assert _no_process_left(first.id) == []
        cluster.settle()
        second, made = killed_exec(cluster)
        code, out, err = _cli(capsys, "down", NAME, "--yes")
        assert code == 0, out + err
        assert f"{NAME}: down; verified by tag" in out, out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        gke.stop()
    assert cluster.objects == {} and cluster.pods == {}
    assert ledger.open_resources(NAME) == []
    rec = ledger.get_run(second.id)
    assert all(r.confirmed_gone for r in rec.resources), rec.resources
    assert rec.run.status == "failed" and rec.run.teardown == "verified", (rec.run.status, rec.run.teardown)
    assert "ended before the run finished" in (rec.run.failure or "")
    assert _no_process_left(second.id) == []
