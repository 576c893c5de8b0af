"""The project's shape, said before anything is created (issue 41 items 5 and 7): the cluster's network
and subnetwork exist, and the caller may act as the nodes' service account. `infra/gcp/preflight.py`
against tests/google_fake.py's project (Compute networks, IAM serviceAccounts.get/testIamPermissions; the
sources are there). Each case passed the preflight before this check existed and failed in `pulumi up`."""

from __future__ import annotations

import pytest

from google_fake import FakeProject
from test_gcp_preflight import run_preflight, spec

from gpucluster.errors import ExitCode
from gpucluster.infra.gcp.preflight import PreflightError, checks

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ACCOUNT = "123456789012-compute@developer.gserviceaccount.com"


def refused(project, s=None) -> str:
    with pytest.raises(PreflightError) as err:
        run_preflight(project, s)
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in err.value.message
    assert "nothing was created" in err.value.message
    return err.value.message


def test_a_project_without_the_default_network_is_refused_naming_both_ways_out():
    project = FakeProject().ready()
    project.networks = {}  # made under compute.skipDefaultNetworkCreation
    msg = refused(project)
    assert "network 'default' does not exist in my-proj-42" in msg
    assert "gcloud compute networks create default --subnet-mode=auto --project my-proj-42" in msg
    assert "--option network=NAME" in msg


def test_a_named_network_and_subnetwork_must_exist_and_custom_mode_needs_the_subnetwork():
    project = FakeProject().ready()
    project.networks = {"corp": False}  # custom mode
    assert "network 'lab' does not exist" in refused(project, spec(options=(("network", "lab"),)))
    assert "custom-mode network" in refused(project, spec(options=(("network", "corp"),)))
    msg = refused(project, spec(options=(("network", "corp"), ("subnetwork", "gpus"))))
    assert "subnetwork 'gpus' does not exist in us-central1" in msg
    project.subnetworks.add(("us-central1", "gpus"))
    run_preflight(project, spec(options=(("network", "corp"), ("subnetwork", "gpus"))))


@pytest.mark.parametrize("state, said, fix", [
    ("act_as", f"you may not act as it (iam.serviceAccounts.actAs)",
     f"gcloud iam service-accounts add-iam-policy-binding {ACCOUNT} --member=user:YOU "
     "--role=roles/iam.serviceAccountUser --project my-proj-42"),
    ("disabled", f"{ACCOUNT}, which is disabled", f"gcloud iam service-accounts enable {ACCOUNT}"),
    ("deleted", f"{ACCOUNT}, which does not exist (deleted)", "gcloud beta iam service-accounts undelete"),
])
def test_the_nodes_service_account_must_be_usable_by_the_caller(state, said, fix):
    project = FakeProject().ready()
    if state == "act_as":
        project.act_as = False
    else:
        project.node_account = state
    msg = refused(project)
    assert said in msg and fix in msg, msg
    found = checks(spec(), google=project, billing=project)
    assert [c["check"] for c in found if c["ok"] is False] == ["gcp node service account"]


def test_a_ready_project_passes_and_the_account_check_asks_iam():
    project = FakeProject().ready()
    found = {c["check"]: c for c in checks(spec(), google=project, billing=project)}
    assert found["gcp network default"]["ok"] is True and found["gcp node service account"]["ok"] is True
    assert ("POST", f"https://iam.googleapis.com/v1/projects/my-proj-42/serviceAccounts/{ACCOUNT}:testIamPermissions") \
        in project.calls


def test_a_users_own_image_on_v100_is_warned_of_before_anything_is_created():
    """Issue 41 item 6: PyTorch's cu128/cu130 builds dropped sm_70 (pytorch/pytorch#172352); the plan's
    warnings (`validate_spec`, printed before the plan, dry runs included) name the fix."""
    from gpucluster.infra.gcp import catalog

    (warning,) = [w for w in catalog.validate_spec(spec(options=(("image", "me/train:cu128"),))) if "image" in w]
    assert "me/train:cu128 on V100" in warning and "no kernel image is available" in warning
    assert "cu126" in warning and "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime" in warning
    assert not [w for w in catalog.validate_spec(spec()) if "image" in w]  # the default image is a cu126 build
    l4 = spec(options=(("image", "me/train:cu128"),), accelerator="nvidia-l4", gpus_per_node=1,
              instance_type="g2-standard-8")
    assert not [w for w in catalog.validate_spec(l4) if "image" in w]
