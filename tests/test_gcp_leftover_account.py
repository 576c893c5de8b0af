"""A second `gpucluster up --name demo` after a destroy that left the cluster's Google service account
(`gpuc-demo`, issue 26 item 8), end to end through the CLI: the real preflight and leftover scan
against tests/google_fake.py (IAM, Cloud Storage, quotas), the real Automation API driver on the fake
Pulumi CLI running the real gcp program (tests/gke_fake.py, with IAM: the program's account is created
in the fake project as `up` reaches it).

The stand-in's behaviour, with its source:
- IAM's `projects.serviceAccounts.create` answers 409 ALREADY_EXISTS for an account id already taken in
  the project (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/create:
  the id "is unique within a project"; the answer as users meet it through terraform-provider-google:
  "Error creating service account: googleapi: Error 409: Service account X already exists within
  project projects/P., alreadyExists", GoogleCloudPlatform/marketing-analytics-jumpstart#200).
  pulumi-gcp's `serviceaccount.Account` fails the update with it: the bridged provider returns the
  create's error unless `create_ignore_already_exists` is set (terraform-provider-google
  resource_google_service_account.go), which the program does not set: adopting the old account would
  keep its old identity and grants and its old run's marks.

What the run does (infra/pulumi/provider.py `_remove_orphans`): our own leftover account of that name,
with no cluster of ours and no Pulumi stack under the name, is removed first (its grants first), with
a line saying so, before Pulumi runs. Checked once by hand (2026-11-26): with `_remove_orphans` not
called, the first test fails: `up` stops with "creating cluster 'demo' failed: Error creating service
account: googleapi: Error 409: Service account gpuc-demo already exists within project
projects/my-proj-42., alreadyExists; what was created has been destroyed" (exit 1), after the GKE
cluster had been created and destroyed again.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("pulumi.automation")
pytest.importorskip("pulumi_gcp")
pytest.importorskip("kubernetes")

from google_fake import Bucket, FakeProject  # noqa: E402

PROJECT = "my-proj-42"
EMAIL = f"gpuc-demo@{PROJECT}.iam.gserviceaccount.com"
OLD_RUN = "r20261125-010101-abcdef"
ARGS = ["--cloud", "gcp", "--name", "demo", "--project", PROJECT, "--nodes", "1",
        "--option", 'gcsWrite=["gs://out-bkt/runs"]', "--yes"]


class Gke:
    """FAKE ClusterManagerClient for the scan: the fake GKE cluster while it exists, labelled as ours."""

    def __init__(self, gke):
        self.gke = gke

    def list_clusters(self, parent):
        from gpucluster.ownership import installation_id

        if self.gke.current is None:
            return NS(clusters=[])
        labels = {"managed-by": "gpucluster", "gpucluster-cluster": "demo", "gpucluster-owner": installation_id()}
        return NS(clusters=[NS(name="demo", location="us-central1-a", resource_labels=labels,
                               status=NS(name="RUNNING"))])


def left_project():
    """A ready project where a destroy of cluster demo left its pods' account, with its grant on out-bkt."""
    from gpucluster.infra.gcp.component_access import account_description
    from gpucluster.ownership import installation_id

    project = FakeProject(project=PROJECT).ready()
    project.buckets["out-bkt"] = Bucket()
    project.accounts[EMAIL] = {"uniqueId": "111", "displayName": "gpucluster demo pods", "description":
                               account_description("demo", OLD_RUN, ["out-bkt"],
                                                   {"gpucluster-owner": installation_id()})}
    project.policies["out-bkt"] = {"etag": "CAE=", "bindings": [
        {"role": "roles/storage.objectCreator", "members": [f"serviceAccount:{EMAIL}"],
         "condition": {"title": "gpucluster write gs://out-bkt/old", "expression": "true"}},
        {"role": "roles/storage.admin", "members": ["user:alice@example.com"]}]}
    return project


def provider(project, monkeypatch):
    from gke_fake import GkeLike

    from gpucluster.cli import common
    from gpucluster.infra.gcp import preflight

    gke = GkeLike(nodes=1, iam=project)
    p, fake = gke.provider("demo", provider_kw=dict(
        find=None, delete=None,  # the real scan and delete, on the fake project
        scan_options={"project": PROJECT, "gke_client": Gke(gke), "google": project},
        credentials=lambda *a: [{"check": "gcp application-default credentials", "ok": True, "detail": "x"}],
        cloud_checks=lambda s: preflight.preflight(s, google=project, billing=project)))
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: p.scoped(**scope))
    return gke, fake


def test_up_after_a_destroy_that_left_the_account_removes_it_first_and_creates_the_cluster(home, monkeypatch, capsys):
    from gpucluster.cli import up
    from gpucluster.ledger.store import Ledger

    project = left_project()
    gke, fake = provider(project, monkeypatch)
    try:
        up.up.main(ARGS, standalone_mode=False)
        out = capsys.readouterr()
        text = " ".join((out.out + out.err).split())
        assert f"service-account {EMAIL}" in text and "removing it first" in text, text
        assert "gpucluster down demo" in text
        # the old account went with its grant (alice's stays), before Pulumi made the new one
        assert project.calls.index(("DELETE", f"https://iam.googleapis.com/v1/projects/-/serviceAccounts/{EMAIL}")) \
            < project.calls.index(("create account", "gpuc-demo"))
        assert fake.verbs().count("up") == 1 and "destroy" not in fake.verbs()
        new = project.accounts[EMAIL]
        assert new["uniqueId"] != "111" and OLD_RUN not in new["description"]  # a new identity, this run's marks
        members = [m for b in project.policies["out-bkt"]["bindings"] for m in b["members"]]
        assert members == ["user:alice@example.com"]  # no stale grant of the old account, live or deleted
        (row,) = Ledger.open_default().list_runs()
        assert row.status == "succeeded"
    finally:
        gke.stop()


def test_an_account_that_cannot_be_removed_stops_the_run_before_pulumi_naming_it(home, monkeypatch):
    """IAM refuses the delete (403, the caller lacks iam.serviceAccounts.delete): nothing is created, the
    error names the account and `gpucluster down demo`; the teardown's own check still finds the account,
    so the verdict is not 'clean' (exit 3)."""
    from gpucluster.cli import up
    from gpucluster.errors import ExitCode, TeardownIncomplete
    from gpucluster.infra.gcp.preflight import api_error

    project = left_project()

    def refuse(url):
        project.calls.append(("DELETE", url))
        raise api_error(403, {"error": {"code": 403, "message": "Permission 'iam.serviceAccounts.delete' denied"}})

    project.delete = refuse
    gke, fake = provider(project, monkeypatch)
    try:
        with pytest.raises(TeardownIncomplete) as err:
            up.up.main(ARGS, standalone_mode=False)
    finally:
        gke.stop()
    msg = err.value.message
    assert err.value.exit_code == ExitCode.LEFTOVERS, err.value.exit_code
    assert f"cannot remove what an earlier cluster 'demo' left (service account {EMAIL}" in msg, msg
    assert "iam.serviceAccounts.delete" in msg and EMAIL in project.accounts
    assert "gpucluster down demo" in err.value.hint
    assert "up" not in fake.verbs() and ("create account", "gpuc-demo") not in project.calls


def test_a_stack_that_holds_the_name_is_left_to_its_update():
    """With a stack of that name (its own resources are its update's), nothing is removed first."""
    from gpucluster.infra.pulumi.provider import PulumiProvider

    p = PulumiProvider.__new__(PulumiProvider)
    removed = []
    p.driver = NS(outputs=lambda name: {"cluster_name": "demo"})
    check = NS(leftovers=(NS(region="global", deleting=False, kind="service-account", id=EMAIL, detail="x"),))
    p._prechecked = {"demo": check}
    p._delete_fn = lambda: removed.append
    p._remove_orphans("demo", NS(message=lambda text: None))
    assert removed == []
    p.driver = NS(outputs=lambda name: None)
    p._remove_orphans("demo", NS(message=lambda text: None))
    assert removed == []  # no preflight scan to act on (it was used): nothing is scanned or removed here
    p._prechecked = {"demo": check}
    p._remove_orphans("demo", NS(message=lambda text: None))
    assert [lo.id for lo in removed[0]] == [EMAIL]
