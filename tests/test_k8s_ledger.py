"""The ledger rows of a GKE run's Kubernetes objects (issue: gcp exec records nothing): each object is a
row `k8s-<kind>` written BEFORE its create request (DESIGN.md, ledger first), closed as confirmed gone
only when a read-back by the run's label finds it gone (or being deleted); what is still there stays
open, is a cleanup error and is what `KubernetesLauncher.leftovers` finds for the run.

The API server is tests/k8s_fake.py (in memory). The behaviour these tests lean on, from public
sources (tests/k8s_fake_objects.py `_list` cites them): a deleted object whose deletion has not
finished is still listed, with `metadata.deletionTimestamp` set (Kubernetes docs "Finalizers", "Garbage
Collection": with Foreground propagation the owner "remains visible through the Kubernetes API" until
its dependents are gone); a failing delete answers 500 (Kubernetes docs, "API Concepts").
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi  # noqa: E402
from test_k8s_launcher import NAME, RUN, Events, cluster, healthy, job  # noqa: E402

from gpucluster.domain import LAUNCHER_KINDS  # noqa: E402
from gpucluster.ledger.store import LedgerError  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s  # noqa: E402
from gpucluster.infra.kubernetes.gone import ROW_KINDS  # noqa: E402

ROWS = {f"k8s-{k}": f"default/{NAME}" for k in ("configmap", "service", "job")}


class Rows(Events):
    """The launcher's events, as the lifecycle's ledger writer gets them, with what the fake API
    server had been asked to create at the moment each row was written."""

    def __init__(self, fake, fail_on=None):
        super().__init__()
        self.fake, self.fail_on = fake, fail_on
        self.rows: list[tuple[str, str, str, int]] = []  # (verb, kind, name, creates asked so far)
        self.messages: list[str] = []

    def _row(self, verb, kind, name):
        if (verb, kind) == self.fail_on:
            raise LedgerError("ledger: disk I/O error")  # a full home: the write raises
        self.rows.append((verb, kind, name, len(self.fake.of("create"))))

    def resource_requested(self, kind, name, **detail):
        self._row("requested", kind, name)

    def resource_created(self, kind, name, cloud_id=None, **detail):
        self._row("created", kind, name)

    def resource_deleted(self, kind, name, cloud_id=None):
        self._row("deleted", kind, name)

    def message(self, text):
        self.messages.append(text)

    def state(self):
        out: dict[tuple[str, str], list[str]] = {}
        for verb, kind, name, _ in self.rows:
            out.setdefault((kind, name), []).append(verb)
        return out


def run(fake, tmp_path, events=None, **kw):
    events = events or Rows(fake)
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0, api_retry_s=3)
    result = launcher.launch(cluster(2), job(**kw), events, tmp_path / "logs")
    return result, events, launcher


def test_the_row_kinds_are_launcher_kinds():
    # `kept.find` and the progress line leave launcher rows out of "is the cluster up": a k8s row that
    # is not one would make a cluster look up after `down`
    assert set(ROW_KINDS) <= set(LAUNCHER_KINDS)


def test_each_object_is_a_row_before_its_request_and_confirmed_gone_after_the_run(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=0)  # a delete that finishes at once
    result, events, launcher = run(fake, tmp_path)
    assert result.ok, result.failure
    creates = [c[1] for c in fake.of("create")]
    assert creates == ["configmap", "service", "job"]
    for verb, kind, name, asked in events.rows:
        if verb == "requested":  # written while that object had not yet been asked for
            assert asked == creates.index(kind.removeprefix("k8s-")), (kind, asked)
        if verb == "created":
            assert asked == creates.index(kind.removeprefix("k8s-")) + 1, (kind, asked)
    assert events.state() == {(k, n): ["requested", "created", "deleted"] for k, n in ROWS.items()}
    # each kind was read back by the run's label after the deletes
    lists = [c for c in fake.of("list") if c[1] in ("configmap", "service", "job") and c[3] == f"gpucluster-run={RUN}"]
    assert {c[1] for c in lists} == {"configmap", "service", "job"}
    assert launcher.cleanup_errors == [] and not any("terminating" in m for m in events.messages)
    assert launcher.leftovers(cluster(2), RUN) == []


def test_objects_still_terminating_count_as_going_and_are_said(tmp_path):
    # the fake keeps a deleted object listed with a deletionTimestamp for 2 more listings (its finalizers)
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=2)
    result, events, launcher = run(fake, tmp_path)
    assert result.ok, result.failure
    assert events.state() == {(k, n): ["requested", "created", "deleted"] for k, n in ROWS.items()}
    assert launcher.cleanup_errors == []
    (said,) = [m for m in events.messages if "still terminating" in m]
    assert f"job default/{NAME}" in said and f"service default/{NAME}" in said, said
    assert launcher.leftovers(cluster(2), RUN) == []  # being deleted: not a leftover


def test_a_refused_delete_leaves_its_row_open_and_is_the_runs_leftover(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=0)
    fake.refuse_delete = {"service": 500}
    result, events, launcher = run(fake, tmp_path)
    assert result.ok, result.failure
    state = events.state()
    assert state[("k8s-service", f"default/{NAME}")] == ["requested", "created"]  # not confirmed gone
    assert state[("k8s-job", f"default/{NAME}")][-1] == "deleted"
    assert state[("k8s-configmap", f"default/{NAME}")][-1] == "deleted"
    assert [e.split(":")[0] for e in launcher.cleanup_errors] == [f"service default/{NAME}"]
    (left,) = launcher.leftovers(cluster(2), RUN)
    assert (left.kind, left.id, left.run_id) == ("k8s-service", f"default/{NAME}", RUN)
    fake.refuse_delete = {}
    fake.delete_namespaced_service(NAME, "default")
    assert launcher.leftovers(cluster(2), RUN) == []


def test_a_ledger_that_cannot_take_the_row_means_nothing_is_created(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=0)
    events = Rows(fake, fail_on=("requested", "k8s-service"))
    with pytest.raises(LedgerError):
        run(fake, tmp_path, events=events)
    assert [c[1] for c in fake.of("create")] == ["configmap"]  # the service was never asked for
    assert fake.objects == {}  # and what was made went


def test_a_killed_runs_objects_are_found_by_its_label_and_not_another_runs(tmp_path):
    from gpucluster.infra.kubernetes.api import Retry
    from gpucluster.infra.kubernetes.objects import Created
    from gpucluster.infra.kubernetes.plan import plan_job

    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=0)
    api = k8s.KubeApi(fake, fake, fake)
    for rid in (RUN, "r20261122-050000-beef02"):  # two runs whose process died before any delete
        plan = plan_job(cluster(2), job(run_id=rid), namespace="default")
        Created(api, plan, Retry(0)).objects()
    launcher = k8s.KubernetesLauncher(api=api)
    left = launcher.leftovers(cluster(2), RUN)
    assert sorted((x.kind, x.id) for x in left) == sorted(ROWS.items())
    assert launcher.leftovers(cluster(2), None) is None  # objects are found only by a run's label
