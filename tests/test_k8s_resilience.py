"""The control plane goes away mid-run and log streams break (issue 26, item 6), against FakeKubeApi
(tests/k8s_fake.py: `outage` and `cut_logs`, with their sources), in process and over HTTP through
the real kubernetes client (tests/k8s_fake_http.py).

Durations are scaled down: on GKE a zonal control-plane upgrade keeps the API away for minutes (GKE
docs, "Standard cluster upgrades") and the launcher retries for up to 600 s (`k8s_api.API_RETRY_S`);
here the outage lasts OUTAGE_S and the launcher's bound is RETRY_S, in the same proportion as a 90 s
outage to the 600 s bound.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from k8s_fake_http import serve  # noqa: E402
from test_k8s_launcher import NAME, Events, assert_everything_deleted, cluster, job, metric  # noqa: E402

from gpucluster.infra.kubernetes import launcher as k8s  # noqa: E402
from gpucluster.infra.kubernetes.api import API_RETRY_S  # noqa: E402

RETRY_S = 20.0
OUTAGE_S = RETRY_S * 90 / API_RETRY_S  # 3 s: a 90 s outage against the 600 s bound


def chatty(rank, n=40):
    """A training that prints as it goes (n lines, 0.1 s apart), its final record last."""
    lines = [f"node {rank} step {i:03d} " + "x" * (i % 7) for i in range(n)]
    lines += [metric("start", rank=rank, world_size=2), metric("final", rank=rank, epochs=1, loss=0.5, ok=True)]
    return PodScript(lines=lines, line_interval_s=0.1)


def launcher_for(fake, mode):
    if mode == "http":
        api, stop = serve(fake)
    else:
        api, stop = k8s.KubeApi(fake, fake, fake, stream=fake.stream), (lambda: None)
    return k8s.KubernetesLauncher(api=api, poll_interval=0.05, api_retry_s=RETRY_S), stop


def node_log(tmp_path, rank):
    return (tmp_path / "logs" / f"node-{rank}.log").read_text()


@pytest.mark.parametrize("mode", ["in-process", "http"])
@pytest.mark.parametrize("outputs", [False, True], ids=["no-outputs", "collecting"])
def test_an_api_outage_and_a_cut_stream_mid_run_lose_no_line_and_repeat_none(tmp_path, mode, outputs):
    fake = FakeKubeApi({r: chatty(r) for r in range(2)})
    # the API goes away once node 0 has printed its 10th line, for OUTAGE_S; node 1's stream is cut in
    # the middle of a line once it has printed its 25th
    fake.outage(OUTAGE_S, when=lambda f: any("step 010" in p.log_text() for p in f.pods.values() if p.index == 0))
    cut = []

    def cut_node_1(f):
        if not cut and any("step 025" in p.log_text() for p in f.pods.values() if p.index == 1):
            cut.append(True)
            f.cut_logs(1, after_bytes=20)
        return False

    fake.interrupt_when = cut_node_1  # asked at every pod listing; never interrupts
    launcher, stop = launcher_for(fake, mode)
    spec = job(output_dir=str(tmp_path / "out") if outputs else None, max_seconds=120)
    try:
        t0 = time.monotonic()
        result = launcher.launch(cluster(2), spec, Events(), tmp_path / "logs")
        if outputs:
            launcher.collect_outputs(spec, Events())
    finally:
        stop()
    assert result.ok, result.failure
    assert fake.refused_while_down > 0 and cut, "the outage and the cut happened mid-run"
    assert time.monotonic() - t0 > OUTAGE_S
    for rank in range(2):
        # every line the job printed, once, in order (the wait.py and launcher notes aside; with outputs the
        # entry script's job_end record ends the stream and is read, not logged)
        got = [ln for ln in node_log(tmp_path, rank).splitlines() if not ln.startswith("[gpucluster]")]
        assert got == fake.scripts[rank].lines, f"node {rank}: lines lost or repeated"
    assert launcher.cleanup_errors == []
    assert_everything_deleted(fake)


def test_a_node_whose_log_cannot_be_followed_ends_from_its_container_status(tmp_path):
    """Node 1's log is cut for good after its final record (every reattach refused): its exit code
    still comes, from the training container's status, and the run does not wait for the outputs
    copy's 30-minute bound."""
    scripts = {r: chatty(r, n=5) for r in range(2)}
    scripts[1].run_s = 3.0  # ends 3 s after its last line
    fake = FakeKubeApi(scripts)
    real_read = fake.read_namespaced_pod_log
    broken = []

    def read(name, namespace, container=None, **kw):
        if broken and name.startswith(f"{NAME}-1-") and container == "pytorch":
            from k8s_fake import FakeApiException

            raise FakeApiException(500, "Internal Server Error: error from the kubelet")  # retried, in vain
        return real_read(name, namespace, container=container, **kw)

    fake.read_namespaced_pod_log = read

    def cut_after_final(f):
        if not broken and any('"final"' in p.log_text() for p in f.pods.values() if p.index == 1):
            broken.append(True)
            f.cut_logs(1)
        return False

    fake.interrupt_when = cut_after_final
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0.05,
                                      api_retry_s=60)
    spec = job(output_dir=str(tmp_path / "out"), max_seconds=120)
    t0 = time.monotonic()
    result = launcher.launch(cluster(2), spec, Events(), tmp_path / "logs")
    assert result.ok, result.failure
    assert [n.exit_code for n in result.nodes] == [0, 0]
    assert time.monotonic() - t0 < 30
    got = {o.node_rank: o for o in launcher.collect_outputs(spec, Events())}
    assert set(got) == {0, 1}
    assert_everything_deleted(fake)
