"""Two owners in ONE Google Cloud project (issue 24 items 2, 3, 4, 5 on gcp): bob's name check, his
`down` and his `gc` leave alice's GKE cluster and her pods' service account alone, by owner.

The project is a FAKE GKE `ClusterManagerClient` plus the IAM/Storage REST fake (tests/google_fake.py);
the scans, the ownership split, the name check and the deletes are the real ones. How the stand-in
behaves, and the public source for each behaviour:

- `list_clusters(parent=projects/P/locations/-)` lists every cluster of the project in every
  location, whoever made it ("Use '-' to match all zones/regions",
  https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters/list).
- A cluster's name is unique within its location only: two clusters called `demo` may live in two
  zones of one project ("The name must be unique within this project and location",
  https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Cluster).
- A service account ID is unique in the whole project, whatever the zone
  (projects.serviceAccounts.create returns 409 ALREADY_EXISTS for an ID in use,
  https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/create), and a
  service account takes no labels (its owner marks are in its description).
- A listed Cluster carries its node pools (`nodePools[].config.machineType`, `.accelerators`,
  `.spot`, `initialNodeCount`: the Cluster and NodePool resources of the same reference), which is
  what a foreign cluster's $/hour is priced from.
- `delete_cluster` returns a long-running operation; the cluster is listed STOPPING until the
  operation is DONE, and a second delete meanwhile fails (FAILED_PRECONDITION)
  (https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.operations).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from google_fake import FakeProject  # noqa: E402

from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.infra.gcp.component_access import account_description  # noqa: E402
from gpucluster.infra.pulumi.provider import PulumiProvider  # noqa: E402
from gpucluster.infra.registry import plugin  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

PROJECT = "proj-one"
ALICE = "a1a1a1a1a1a1a1a1"
HER_RUN = "r20261120-100000-a11ce0"


def marks(owner: str, user: str, run: str, cluster: str = "demo") -> dict[str, str]:
    return {"managed-by": "gpucluster", "gpucluster-cluster": cluster, "gpucluster-owner": owner,
            "gpucluster-user": user, "gpucluster-host": "laptop", "gpucluster-run": run}


class Gke:
    """FAKE ClusterManagerClient for one project: clusters in several zones, several owners."""

    def __init__(self):
        self.clusters: dict[str, dict] = {}  # path -> {location, labels, status, reads_left}
        self.deleted: list[str] = []

    def add(self, name: str, zone: str, labels: dict[str, str], pools: tuple = ()) -> str:
        """`pools`: (machine type, V100s per node, spot, initial node count) each."""
        path = f"projects/{PROJECT}/locations/{zone}/clusters/{name}"
        assert path not in self.clusters, "GKE: a name is unique within its location"
        node_pools = [NS(name=f"pool-{i}", initial_node_count=count, config=NS(
            machine_type=machine, spot=spot, preemptible=False,
            accelerators=[NS(accelerator_count=gpus, accelerator_type="nvidia-tesla-v100")] if gpus else []))
            for i, (machine, gpus, spot, count) in enumerate(pools)]
        self.clusters[path] = {"name": name, "location": zone, "labels": labels, "status": "RUNNING",
                               "node_pools": node_pools}
        return path

    def list_clusters(self, parent):
        assert parent == f"projects/{PROJECT}/locations/-"
        return NS(clusters=[NS(name=c["name"], location=c["location"], resource_labels=dict(c["labels"]),
                               status=NS(name=c["status"]), create_time="2026-11-20T10:00:00Z",
                               node_pools=c["node_pools"])
                            for c in self.clusters.values()])

    def delete_cluster(self, name):
        c = self.clusters[name]
        if c["status"] == "STOPPING":
            raise RuntimeError("400 FAILED_PRECONDITION: an operation is already running on the cluster")
        c["status"], c["reads_left"] = "STOPPING", 2
        self.deleted.append(name)
        return NS(name=f"operation-{len(self.deleted)}", status=NS(name="RUNNING"))

    def get_operation(self, name):
        for path, c in list(self.clusters.items()):
            if c["status"] == "STOPPING":
                c["reads_left"] -= 1
                if c["reads_left"] <= 0:
                    del self.clusters[path]
        done = not any(c["status"] == "STOPPING" for c in self.clusters.values())
        return NS(status=NS(name="DONE" if done else "RUNNING"), error=None)


class Driver:
    """FAKE PulumiDriver: bob's home has no stack of this name (nothing to destroy)."""

    def destroy(self, name, events):
        return False

    def read_meta(self, name):
        return {"spec": {"options": {"project": PROJECT}, "zone": "us-central1-b"}}

    def outputs(self, name):
        return {}


class Events:
    def __init__(self):
        self.messages: list[str] = []

    def resource_requested(self, *a, **k): ...
    def resource_created(self, *a, **k): ...
    def resource_deleted(self, *a, **k): ...
    def confirm_rest_gone(self, *a, **k): ...

    def message(self, text):
        self.messages.append(text)


@pytest.fixture
def project(home):
    """Alice's cluster `demo` (zone a) and her pods' service account, made from another home."""
    gke, google = Gke(), FakeProject(project=PROJECT)
    gke.add("demo", "us-central1-a", marks(ALICE, "alice", HER_RUN),
            pools=(("n1-standard-2", 0, False, 1), ("n1-standard-8", 1, True, 2)))  # system pool, spot GPU pool
    google.accounts["gpuc-demo@proj-one.iam.gserviceaccount.com"] = {
        "uniqueId": "11", "displayName": "gpucluster demo pods",
        "description": account_description("demo", HER_RUN, ["her-data"], marks(ALICE, "alice", HER_RUN))}
    return NS(gke=gke, google=google)


def bob(project) -> PulumiProvider:
    from gpucluster.ownership import Ownership

    return PulumiProvider(plugin("gcp"), driver=Driver(), ownership=Ownership.here(), scan_options={
        "project": PROJECT, "gke_client": project.gke, "google": project.google, "poll_seconds": 0,
        "sleep": lambda s: None})


def spec(zone: str, name: str = "demo") -> ClusterSpec:
    return ClusterSpec(cloud="gcp", nodes=1, name=name, zone=zone, region=zone.rsplit("-", 1)[0],
                       project=PROJECT)


def test_a_name_alice_holds_is_refused_in_her_zone_and_for_her_project_wide_account(project):
    with pytest.raises(UsageError, match=rf"cluster name 'demo' is already held in us-central1-a by another owner "
                                         rf"\(owner {ALICE}, alice@laptop, since 2026-11-20 10:00 UTC"):
        bob(project).check_name_free(spec("us-central1-a"))
    # another zone: the GKE name is free there, but her pods' service account (one per cluster name,
    # project-wide) is not: the name is refused before anything is created, naming her
    with pytest.raises(UsageError, match=rf"cluster name 'demo' is already held in project {PROJECT} by another "
                                         rf"owner \(owner {ALICE}, alice@laptop.*service-account gpuc-demo@"):
        bob(project).check_name_free(spec("us-central1-b"))
    # without her account (a cluster of hers that reads no bucket), another zone is free
    project.google.accounts.clear()
    bob(project).check_name_free(spec("us-central1-b"))
    bob(project).check_name_free(spec("us-central1-a", name="bobs"))


def test_bobs_down_of_the_same_name_leaves_her_cluster_and_account(project):
    events = Events()
    bob(project).down("demo", events)  # nothing of his: verified, nothing deleted
    assert project.gke.deleted == [] and "gpuc-demo@proj-one.iam.gserviceaccount.com" in project.google.accounts
    alone = [m for m in events.messages if m.startswith("left alone: ")]
    assert any(f"gke-cluster projects/{PROJECT}/locations/us-central1-a/clusters/demo: not ours (owner {ALICE}, "
               "alice@laptop, since 2026-11-20 10:00 UTC)" in m for m in alone), events.messages
    assert any("service-account gpuc-demo@proj-one.iam.gserviceaccount.com: not ours" in m for m in alone)
    check = bob(project).leftovers("demo")
    assert check.verified and check.leftovers == () and len(check.not_ours) == 2


def test_bobs_gc_deletes_his_orphan_only(project, home):
    from gpucluster.infra.leftovers import scope_of
    from gpucluster.ledger.store import Ledger
    from gpucluster.ownership import installation_id
    from gpucluster.lifecycle.teardown import Collection

    mine = project.gke.add("orphan", "us-central1-b", marks(installation_id(), "bob", "r20261126-080000-b0b000",
                                                             cluster="orphan"))
    sweep = Collection(Ledger.open_default(), {"gcp": plugin("gcp")}, project=PROJECT)
    sweep.scopes["gcp"] = scope_of({"project": PROJECT, "owner": sweep.ownership.scan_owner,
                                    "gke_client": project.gke, "google": project.google})
    found, skipped = sweep.look()
    assert [lo.id for lo in found["gcp"]] == [mine] and skipped == []
    foreign = {(lo.kind, lo.owner, lo.made_by) for lo in sweep.not_ours()}
    assert foreign == {("gke-cluster", ALICE, "alice@laptop"), ("service-account", ALICE, "alice@laptop")}
    # her cluster's $/hour at most, from the shipped catalog (us-central1 rows of 2026-11-22): the fee
    # 0.10 + the system node n1-standard-2 0.095 + 2 spot GPU nodes x (n1-standard-8 0.10446 + V100 1.0885)
    (gke,) = [lo for lo in sweep.not_ours() if lo.kind == "gke-cluster"]
    assert gke.hourly == "2.5809", gke.hourly
    result = sweep.delete(found)
    assert result.check.verified and [lo.id for lo in result.deleted] == [mine]
    assert project.gke.deleted == [mine]
    assert f"projects/{PROJECT}/locations/us-central1-a/clusters/demo" in project.gke.clusters
    assert "gpuc-demo@proj-one.iam.gserviceaccount.com" in project.google.accounts
