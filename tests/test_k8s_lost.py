"""Lost nodes on the Kubernetes launcher (issue 30 item 2, gcp): against the fake API server
(tests/k8s_fake.py), mid-training, node 1's pod is preempted by its node's graceful shutdown
(Failed, reason Terminated or GKE's Shutdown, a DisruptionTarget condition), deleted (listed with a
deletionTimestamp while it terminates), or vanishes. Each time the run fails at once naming node 1
as lost, with a `node_lost` record (cause "interruption") for the recovery loop, within a pod
listing of it. (Checked once by hand: without `FakeKubeApi.preempt` and `delete_pod` modelling a
pod that stays listed, a launcher that only noticed vanished pods failed these tests: a preempted
pod was reported as the job's own failure, exit code 143. And once more, 2026-11-26, against the
fake's deletion that takes time (Kubernetes docs, "Pod Lifecycle", "Termination of Pods": a deleted
pod is listed with a deletionTimestamp, Terminating, through its grace period): with `delete_ticks`
forced to 0, the old, kinder fake that drops a deleted pod at once, the `delete` case fails, the run
saying "disappeared" instead of "is being deleted".)"""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from test_k8s_launcher import NAME, launch, metric  # noqa: E402


def _training(rank):
    return PodScript(lines=[f"node {rank} up", metric("start", rank=rank, world_size=2),
                            metric("epoch", rank=0, epoch=1, loss=0.5, accuracy=0.9, samples_per_s=1.0)],
                     exit_code=None)


@pytest.mark.parametrize("how", ["preempt-terminated", "preempt-shutdown", "delete", "vanish"])
def test_a_pod_lost_mid_training_is_a_lost_node(tmp_path, how):
    fake = FakeKubeApi({0: _training(0), 1: _training(1)}, delete_ticks=3 if how == "delete" else 0)
    hit: list[float] = []

    def strike():
        end = time.monotonic() + 30
        while time.monotonic() < end:
            # node 1 trains: its container printed its first line (the fake runs the pod's real programs)
            if any(p.index == 1 and "node 1 up" in p.log_text() for p in list(fake.pods.values())):
                hit.append(time.time())
                if how.startswith("preempt"):
                    fake.preempt(1, reason="Terminated" if how.endswith("terminated") else "Shutdown")
                elif how == "delete":
                    fake.delete_pod(1)
                else:
                    fake.lose(1)
                return
            time.sleep(0.02)

    threading.Thread(target=strike, daemon=True).start()
    result, events, _ = launch(fake, tmp_path)
    assert hit, "the pod never trained"
    assert not result.ok and result.failed_node == 1
    assert result.failure.startswith(f"node 1 ({NAME}-1"), result.failure
    assert " lost: pod " in result.failure
    msg = "Pod was terminated in response to imminent node shutdown."
    # a preempted pod is seen while its containers stop (DisruptionTarget, still Running) or once Failed
    wants = {"preempt-terminated": (f"failed (Terminated): {msg}", f"is being disrupted (TerminationByKubelet): {msg}"),
             "preempt-shutdown": (f"failed (Shutdown): {msg}", f"is being disrupted (TerminationByKubelet): {msg}"),
             "delete": ("is being deleted",), "vanish": ("disappeared",)}[how]
    want = next((w for w in wants if w in result.failure), None)
    assert want is not None, result.failure
    assert result.failure.count(want) == 1  # said once, not again after the failure line
    lost = [r for _, r in events.metrics if r.get("kind") == "node_lost"]
    assert [(r["node_rank"], r["cause"]) for r in lost] == [(1, "interruption")]
    assert lost[0]["detected_at"] - hit[0] < 30
