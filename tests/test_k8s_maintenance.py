"""GPU host maintenance on GKE (issue 41 item 8): a GPU VM cannot live-migrate, so Compute Engine's host
maintenance terminates it; GKE labels the node beforehand. The launcher reads the job's nodes and acts on
the label as on a spot notice: the ranks are stopped with time to save, every node's outputs come back
while its pod still runs, and the run ends as a lost node (cause "interruption") that the recovery loop
resumes. Against FakeKubeApi's host maintenance (tests/k8s_fake_nodes.py: the label late, and nothing
more until the window starts, when the pod is terminated with the ONGOING label), an hour's notice
played in under 4 s.

Checked once by hand (2026-11-29): on the code before this (no node read) the run went on until the
window's start, node 1's pod was terminated, and its outputs were lost (FAILED: "pod ... is Failed");
with a watcher that waited for the ONGOING label only, the same (the fake marks it when the pod is
already being terminated); with a kinder fake that set ONGOING a while before terminating the pod, that
watcher passed."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from test_k8s_launcher import Events, cluster, job  # noqa: E402
from test_k8s_outputs import assert_copied, with_outputs  # noqa: E402

from gpucluster.infra.gcp.gke import GKE  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s, plan as k8s_plan  # noqa: E402
from gpucluster.watch.outputs import COMPLETE  # noqa: E402


def test_gpu_host_maintenance_is_a_notice_and_every_output_comes_back(tmp_path):
    fake = FakeKubeApi({r: with_outputs(PodScript(lines=["training"], exit_code=None), r) for r in range(2)})
    fake.time_scale = 400.0  # fake seconds per real second: 25 minutes' notice in under 4 s
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                      api_retry_s=10, platform=GKE)
    launcher.notice_interval_s, launcher.wall_clock = 0.05, fake.wall  # a reading every 20 fake seconds
    announced: list[float] = []

    def announce() -> None:  # once both nodes train, Compute Engine schedules node 1's host maintenance
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if len(fake.pods) == 2 and all("training" in p.log_text() for p in list(fake.pods.values())):
                announced.append(fake.wall())
                fake.host_maintenance(1, notice_s=1500, label_lag_s=60)
                return
            time.sleep(0.02)

    threading.Thread(target=announce, daemon=True).start()
    spec, events, noticed = job(output_dir=str(tmp_path / "out")), Events(), []
    on_metric = events.on_metric
    events.on_metric = lambda rank, record: (noticed.append(fake.wall()) if record["kind"] == "node_notice" else None,
                                             on_metric(rank, record))
    result = launcher.launch(cluster(2), spec, events, tmp_path / "logs")
    got = {o.node_rank: o for o in launcher.collect_outputs(spec, Events())}
    assert announced, "the pods never trained"
    assert not result.ok and result.failed_node == 1, result.failure
    assert "lost: GCE host maintenance gave notice: terminate" in result.failure, result.failure
    # not at the label's first sight (25 minutes ahead) but in the lead (900 s) before the window's start; the
    # supervisor's loop (0.2 s, 80 fake seconds here) reads the pods, so the notice comes up to that late
    assert announced[0] + 1500 - 900 - 100 <= noticed[0] < announced[0] + 1500, noticed[0] - announced[0]
    notices = [rec for _, rec in events.metrics if rec["kind"] == "node_notice"]
    assert notices and notices[0]["node"] == "gke-gpu-node-1" and notices[0]["node_rank"] == 1
    lost = [rec for _, rec in events.metrics if rec["kind"] == "node_lost"]
    assert [(r["node_rank"], r["cause"]) for r in lost] == [(1, "interruption")]
    # both pods told to stop, with the notice's time to save written in the stop file
    stops = [c for c in fake.of("exec") if k8s_plan.STOP_FILE in c[4]]
    assert sorted(c[3].rsplit("-", 1)[0] for c in stops) == sorted(n.rsplit("-", 1)[0] for n in fake.pods)
    assert all(c[4][-1] == "90" for c in stops), stops
    # every node's outputs came back, node 1's too: its pod still ran when they were copied
    assert got[0].verdict == got[1].verdict == COMPLETE, [o.problem() for o in got.values()]
    assert_copied(tmp_path, fake, 0), assert_copied(tmp_path, fake, 1)
