"""GKE teardown waits for deletion to really finish, within a bound, against a slow FAKE GKE API.

Behaviours of the stand-in, with their public sources:
- `delete_cluster` returns a long-running Operation at once; the cluster is gone only when the
  operation is DONE, minutes later (GKE API reference, projects.locations.clusters.delete returns an
  Operation; projects.locations.operations.get reports its status PENDING/RUNNING/DONE:
  https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.operations).
- While it is being deleted the cluster is still listed with status STOPPING (Cluster.Status:
  "STOPPING: the STOPPING state indicates the cluster is being deleted",
  https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Status).
- Deleting a cluster that is already being deleted fails (FAILED_PRECONDITION, an operation is already
  running on the cluster), so the fake refuses a second delete.
"""

from __future__ import annotations

from google_fake import FakeProject

from gpucluster.infra.leftovers import scope_of
from gpucluster.infra.registry import plugin as _plugin

from types import SimpleNamespace as NS

import pytest

from gpucluster.errors import TeardownIncomplete
from gpucluster.infra import leftovers
from gpucluster.infra.gcp import leftovers as gcp_leftovers
from gpucluster.infra.pulumi.provider import PulumiProvider

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

PROJECT = "proj-one"
OWNER = "0123456789abcdef"  # this home's installation id, as the cluster's labels carry it (gpucluster.ownership)
PATH = f"projects/{PROJECT}/locations/us-central1-a/clusters/demo"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


class SlowGke:
    """FAKE ClusterManagerClient: deletion takes `delete_seconds` of the fake clock (STOPPING meanwhile)."""

    def __init__(self, clock, delete_seconds=300.0, status="RUNNING"):
        self.clock, self.delete_seconds = clock, delete_seconds
        self.status = status
        self.deleting_since = 0.0 if status == "STOPPING" else None
        self.deletes, self.op_reads = 0, 0

    def _gone(self):
        return self.deleting_since is not None and self.clock() - self.deleting_since >= self.delete_seconds

    def list_clusters(self, parent):
        if self._gone():
            return NS(clusters=[])
        labels = {"managed-by": "gpucluster", "gpucluster-cluster": "demo", "gpucluster-owner": OWNER}
        return NS(clusters=[NS(name="demo", location="us-central1-a", resource_labels=labels,
                               status=NS(name="STOPPING" if self.deleting_since is not None else self.status))])

    def delete_cluster(self, name):
        self.deletes += 1
        if self.deleting_since is not None:
            raise RuntimeError("400 FAILED_PRECONDITION: an operation is already running on the cluster")
        self.deleting_since = self.clock()
        return NS(name="operation-123", status=NS(name="RUNNING"))

    def get_operation(self, name):
        self.op_reads += 1
        assert name == f"projects/{PROJECT}/locations/us-central1-a/operations/operation-123"
        return NS(status=NS(name="DONE" if self._gone() else "RUNNING"), error=None)


def test_delete_polls_the_operation_to_its_end():
    clock = Clock()
    gke = SlowGke(clock, delete_seconds=300)
    (lo,) = leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope_of({"project": PROJECT, "gke_client": gke, "google": FakeProject()})).leftovers
    assert not lo.deleting
    errors = gcp_leftovers.delete([lo], client=gke, wait_seconds=1800, poll_seconds=10, clock=clock, sleep=clock.sleep)
    assert errors == [] and clock.t >= 300 and gke.op_reads >= 30
    assert leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope_of({"project": PROJECT, "gke_client": gke, "google": FakeProject()})).verified


def test_delete_past_the_bound_names_the_running_operation():
    clock = Clock()
    gke = SlowGke(clock, delete_seconds=10_000)
    left = leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope_of({"project": PROJECT, "gke_client": gke, "google": FakeProject()})).leftovers
    errors = gcp_leftovers.delete(left, client=gke, wait_seconds=120, poll_seconds=10, clock=clock, sleep=clock.sleep)
    assert len(errors) == 1 and "still deleting after 120 s" in errors[0] and "operation-123" in errors[0]


class Driver:
    """FAKE PulumiDriver: `pulumi destroy` returned (its own timeout hit), the cluster still STOPPING."""

    def destroy(self, name, events):
        return True

    def read_meta(self, name):
        return {"spec": {"options": {"project": PROJECT}, "zone": "us-central1-a"}}


class Events:
    def __init__(self):
        self.messages = []

    def resource_requested(self, *a, **k): ...
    def resource_created(self, *a, **k): ...
    def resource_deleted(self, *a, **k): ...

    def message(self, text):
        self.messages.append(text)


def provider(gke, clock, await_seconds):
    from gpucluster.ownership import Ownership

    return PulumiProvider(_plugin("gcp"), driver=Driver(), ownership=Ownership(OWNER), scan_options={
        "gke_client": gke, "google": FakeProject(), "await_seconds": await_seconds, "poll_seconds": 15, "clock": clock,
        "sleep": clock.sleep})


def test_down_waits_for_a_stopping_cluster_with_progress_and_does_not_delete_it_again():
    clock = Clock()
    gke = SlowGke(clock, delete_seconds=200, status="STOPPING")
    events = Events()
    provider(gke, clock, 1800).down("demo", events)  # no TeardownIncomplete: it went within the bound
    assert gke.deletes == 0
    waits = [m for m in events.messages if m.startswith("waiting for 1 resource(s) the cloud is deleting")]
    assert len(waits) >= 10 and "STOPPING (being deleted)" in waits[0] and "of at most 1800 s" in waits[-1]


def test_down_past_the_bound_is_a_leftover_still_being_deleted():
    clock = Clock()
    gke = SlowGke(clock, delete_seconds=10_000, status="STOPPING")
    with pytest.raises(TeardownIncomplete) as err:
        provider(gke, clock, 60).down("demo", Events())
    # it still exists: a leftover (the CLI's verdict "leftovers"), named with the cloud's own state
    assert "still being deleted after 60 s" in err.value.message
    assert "STOPPING" in err.value.message and gke.deletes == 0


def test_the_old_instant_fake_would_have_hidden_the_wait():
    # with deletion taking no time, nothing is ever STOPPING and no wait happens: the slow fake is what
    # exercises the path users meet (checked: with delete_seconds=0 the wait messages are absent)
    clock = Clock()
    gke = SlowGke(clock, delete_seconds=0, status="STOPPING")
    events = Events()
    provider(gke, clock, 1800).down("demo", events)
    assert not [m for m in events.messages if m.startswith("waiting")]


# -- the pods' service account and its grants, after a failed destroy (issue 26 item 8) ------------
def account(project, email, description, uid="1"):
    project.accounts[email] = {"uniqueId": uid, "displayName": "gpucluster pods", "description": description}


def test_the_scan_finds_our_service_account_by_its_markers_and_delete_removes_its_grants_first():
    from gpucluster.infra.gcp.component_access import account_description

    google = FakeProject(project=PROJECT)
    ours = "gpuc-demo@proj-one.iam.gserviceaccount.com"
    account(google, ours, account_description("demo", "r20261125-010101-abcdef", ["data-bkt", "out-bkt"]), uid="11")
    account(google, "gpuc-other@proj-one.iam.gserviceaccount.com", account_description("other", None, []))
    account(google, "gpuc-lookalike@proj-one.iam.gserviceaccount.com", "a person's account, gpucluster-cluster=demo")
    account(google, "ci@proj-one.iam.gserviceaccount.com", account_description("demo", None, []))  # not gpuc-
    google.policies["data-bkt"] = {"etag": "CAE=", "bindings": [
        {"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{ours}"],
         "condition": {"title": "gpucluster read gs://data-bkt/x", "expression": "true"}},
        {"role": "roles/storage.admin", "members": ["user:alice@example.com", f"serviceAccount:{ours}"]}]}
    google.policies["out-bkt"] = {"etag": "CAE=", "bindings": [
        {"role": "roles/storage.objectCreator", "members": [f"deleted:serviceAccount:{ours}?uid=11"]}]}
    gke = SlowGke(Clock(), delete_seconds=0)
    gke.deleting_since = -1  # the cluster went already; only the account is left (a failed destroy)
    scope = scope_of({"project": PROJECT, "gke_client": gke, "google": google})
    (lo,) = leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope).leftovers
    assert lo.kind == "service-account" and lo.id == ours and "gs://data-bkt, gs://out-bkt" in lo.detail
    assert [f.leftover.id for f in leftovers.scan(_plugin("gcp").provisioner, run_id="r20261125-010101-abcdef",
                                                     scope=scope).found] == [ours]
    assert leftovers.delete_leftovers(_plugin("gcp").provisioner, [lo], scope) == []
    assert ours not in google.accounts and "gpuc-other@proj-one.iam.gserviceaccount.com" in google.accounts
    assert google.policies["data-bkt"]["bindings"] == [  # only our member went; alice's grant stays
        {"role": "roles/storage.admin", "members": ["user:alice@example.com"]}]
    assert google.policies["out-bkt"]["bindings"] == []  # a deleted principal's binding is ours too
    assert leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope).verified


def test_a_scan_that_cannot_list_service_accounts_is_not_verified():
    from gpucluster.infra.gcp.preflight import api_error

    class Refusing(FakeProject):
        def get(self, url, params=None):
            raise api_error(403, {"error": {"code": 403, "message": "Permission 'iam.serviceAccounts.list' denied"}})

    gke = SlowGke(Clock(), delete_seconds=0)
    gke.deleting_since = -1
    check = leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo",
                                     scope=scope_of({"project": PROJECT, "gke_client": gke, "google": Refusing()}))
    assert not check.verified and check.leftovers == ()
    assert any("service accounts in proj-one: not checked" in s and "iam.serviceAccounts.list" in s for s in check.unchecked)


def test_the_description_keeps_its_markers_within_256_characters():
    from gpucluster.infra.gcp.component_access import account_description
    from gpucluster.infra.gcp.leftovers import markers

    many = [f"bucket-{i:02d}-" + "x" * 40 for i in range(8)]
    text = account_description("demo", "r20261125-010101-abcdef", many)
    marks = markers(text)
    assert len(text) <= 256 and marks["managed-by"] == "gpucluster" and marks["gpucluster-cluster"] == "demo"
    assert marks["gpucluster-run"] == "r20261125-010101-abcdef"
    assert all(b in many for b in marks["buckets"].split(","))  # whole names only
