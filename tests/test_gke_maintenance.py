"""GKE's host-maintenance node labels read as a notice (infra/gcp/maintenance.py), and the node watch that
asks for them (infra/kubernetes/notices.py), without a cluster. The end-to-end run: test_k8s_maintenance.py."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from gpucluster.infra.gcp.maintenance import MAINTENANCE_LEAD_S, maintenance_notice
from gpucluster.infra.kubernetes.notices import NodeNotices

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

NOW = 1_800_000_000.0


def node(labels=None, taints=()):
    return NS(metadata=NS(name="n", labels=labels or {}), spec=NS(taints=[NS(key=k, effect="NoSchedule") for k in taints]))


def test_no_label_no_notice_and_a_far_maintenance_waits():
    assert maintenance_notice(node(), NOW) is None
    far = node({"cloud.google.com/scheduled-maintenance-time": str(int(NOW + MAINTENANCE_LEAD_S + 60))})
    assert maintenance_notice(far, NOW) is None
    assert maintenance_notice(node({"cloud.google.com/scheduled-maintenance-time": "soon"}), NOW) is None


def test_a_maintenance_within_the_lead_is_a_notice_with_its_start():
    rec = maintenance_notice(node({"cloud.google.com/scheduled-maintenance-time": str(int(NOW + 600))}), NOW)
    assert rec["source"] == "GCE host maintenance" and rec["when"] == "2027-01-15T08:10:00Z"
    assert "terminate" in rec["action"]


@pytest.mark.parametrize("marks", [dict(labels={"cloud.google.com/active-node-maintenance": "ONGOING"}),
                                   dict(taints=("cloud.google.com/impending-node-termination",))])
def test_a_maintenance_under_way_is_a_notice_now(marks):
    rec = maintenance_notice(node(**marks), NOW)
    assert rec is not None and rec["when"] == "2027-01-15T08:00:00Z"


class Api(Exception):  # as kubernetes' ApiException: a status and a reason
    def __init__(self, status):
        self.status, self.reason = status, "x"


def test_the_watch_stops_once_nodes_may_not_be_read_and_says_so():
    said, calls = [], []

    def read_node(name):
        calls.append(name)
        raise Api(403)

    watch = NodeNotices(NS(core=NS(read_node=read_node)), maintenance_notice, interval_s=0, say=said.append)
    assert watch.poll({0: "a", 1: "b"}) is None and watch.poll({0: "a"}) is None
    assert calls == ["a"] and len(said) == 1 and "not watched" in said[0]


def test_the_watch_names_the_node_and_reads_no_more_often_than_its_interval():
    calls = []

    def read_node(name):
        calls.append(name)
        return node({"cloud.google.com/active-node-maintenance": "ONGOING"} if name == "b" else {})

    watch = NodeNotices(NS(core=NS(read_node=read_node)), maintenance_notice, interval_s=3600, clock=lambda: NOW)
    rank, rec = watch.poll({0: "a", 1: "b"})
    assert rank == 1 and rec["node"] == "b"
    assert watch.poll({0: "a", 1: "b"}) is None and calls == ["a", "b"]
