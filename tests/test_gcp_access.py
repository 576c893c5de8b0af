"""One GCP project resolution order, quota classification, and the Compute API quota read."""

from __future__ import annotations

import pytest

from gpucluster.errors import SpecError
from gpucluster.infra.gcp import access as gcp_access
from gpucluster.infra.gcp.access import QuotaError, classify_quota, resolve_project
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ALL_ENV = {"GOOGLE_PROJECT": "env-google-project", "GOOGLE_CLOUD_PROJECT": "env-google-cloud",
           "GCLOUD_PROJECT": "env-gcloud-project", "CLOUDSDK_CORE_PROJECT": "env-cloudsdk-core"}


def gcloud_dir(tmp_path, project="gcloud-file-proj", config="work"):
    (tmp_path / "configurations").mkdir(parents=True, exist_ok=True)
    (tmp_path / "active_config").write_text(config + "\n")
    (tmp_path / "configurations" / f"config_{config}").write_text(f"[core]\naccount = a@b.c\nproject = {project}\n")
    return str(tmp_path)


def test_order_flag_stack_env_in_pulumi_gcp_order_gcloud_file_adc(tmp_path):
    env = {**ALL_ENV, "CLOUDSDK_CONFIG": gcloud_dir(tmp_path)}
    adc = lambda: "adc-project-id"  # noqa: E731
    assert resolve_project("flag-project", "stack-project", env=env, adc=adc) == ("flag-project", "--project")
    assert resolve_project(None, "stack-project", env=env, adc=adc)[0] == "stack-project"
    # pulumi-gcp's order (its provider docs): GOOGLE_PROJECT, GOOGLE_CLOUD_PROJECT, GCLOUD_PROJECT,
    # CLOUDSDK_CORE_PROJECT
    for var in list(ALL_ENV):
        project, source = resolve_project(None, None, env=env, adc=adc)
        assert project == ALL_ENV[var] and source == f"environment variable {var}"
        del env[var]
    project, source = resolve_project(None, None, env=env, adc=adc)
    assert project == "gcloud-file-proj" and "config_work" in source
    env["CLOUDSDK_CONFIG"] = str(tmp_path / "nothing-here")
    assert resolve_project(None, None, env=env, adc=adc) == ("adc-project-id", "application-default credentials")


def test_gcloud_config_without_active_config_file_uses_default(tmp_path):
    gcloud_dir(tmp_path, project="default-conf-proj", config="default")
    (tmp_path / "active_config").unlink()
    assert resolve_project(None, None, env={"CLOUDSDK_CONFIG": str(tmp_path)}, adc=lambda: None)[0] == \
        "default-conf-proj"
    # CLOUDSDK_ACTIVE_CONFIG_NAME names another configuration (gcloud topic configurations)
    gcloud_dir(tmp_path, project="other-conf-proj", config="other")
    env = {"CLOUDSDK_CONFIG": str(tmp_path), "CLOUDSDK_ACTIVE_CONFIG_NAME": "default"}
    assert resolve_project(None, None, env=env, adc=lambda: None)[0] == "default-conf-proj"


def test_nothing_names_a_project_is_one_line_naming_every_place(tmp_path):
    with pytest.raises(SpecError) as err:
        resolve_project(None, None, env={"CLOUDSDK_CONFIG": str(tmp_path)}, adc=lambda: None)
    text = str(err.value)
    assert "\n" not in text and "--project" in text and "GOOGLE_PROJECT" in text and "gcloud config set" in text
    assert resolve_project(None, None, env={"CLOUDSDK_CONFIG": str(tmp_path)}, adc=lambda: None,
                           required=False) == (None, "none")


def test_bad_project_id_refused_with_its_source():
    with pytest.raises(SpecError, match="'My_Project' .*--project.*6-30"):
        resolve_project("My_Project", None, env={}, adc=lambda: None)


# A GCE operation error as the GKE API reports it when a node pool exceeds the region's GPU quota
# (Compute Engine docs, "Resource quotas": "Quota 'NVIDIA_V100_GPUS' exceeded. Limit: 0.0 in region
# us-central1.").
GKE_QUOTA_TEXT = ("error: googleapi: Error 403: Insufficient quota to satisfy the request: Not all instances "
                  "running in IGM after 40.1s. Expected 2, running 0, transitioning 2. Current errors: "
                  "[QUOTA_EXCEEDED]: Instance 'gke-v100-gpu-1' creation failed: Quota 'NVIDIA_V100_GPUS' "
                  "exceeded. Limit: 0.0 in region us-central1.")


def test_quota_error_classified_with_next_steps():
    spec = ClusterSpec(cloud="gcp", nodes=2, zone="us-central1-a")
    err = classify_quota(GKE_QUOTA_TEXT, spec)
    assert isinstance(err, QuotaError)
    assert err.quota == "NVIDIA_V100_GPUS" and err.region == "us-central1"
    assert "limit 0.0" in err.message
    assert "request more" in err.hint and "europe-west4" in err.hint and "us-central1 /" not in err.hint
    assert classify_quota("ZONE_RESOURCE_POOL_EXHAUSTED", spec) is None


def test_quota_error_reaches_the_user_through_the_driver():
    from gpucluster.infra.pulumi.engine import PulumiDriver

    spec = ClusterSpec(cloud="gcp", nodes=2, name="v100", zone="us-central1-a")
    driver = PulumiDriver.__new__(PulumiDriver)
    driver.zone_lister = lambda region, itype: []
    from gpucluster.infra.registry import plugin

    driver.provisioner = plugin("gcp").provisioner  # as PulumiProvider sets it
    err = driver._up_error(spec, GKE_QUOTA_TEXT, [])
    assert isinstance(err, QuotaError)
    assert err.message.startswith("creating cluster 'v100' failed: GCP quota NVIDIA_V100_GPUS exceeded in us-central1")


def test_credentials_missing_is_one_line_naming_the_fix(monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**kw):
        raise DefaultCredentialsError("Your default credentials were not found. To set up ADC, see ...\nmore")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(gcp_access.GcpAuthError) as err:
        gcp_access.google_credentials()
    assert "\n" not in err.value.message and "application-default login" in err.value.hint


def test_credentials_ask_for_the_email_scope_too(monkeypatch):
    """GKE knows the caller by email only with userinfo.email; RBAC bindings name emails (the GKE auth
    plugin and client-go's gcp provider ask for cloud-platform and userinfo.email)."""
    import google.auth

    asked = []

    class Creds:
        valid, token = True, "tok"

    monkeypatch.setattr(google.auth, "default", lambda scopes=None, **kw: asked.append(scopes) or (Creds(), "p"))
    gcp_access.google_credentials()
    assert asked == [["https://www.googleapis.com/auth/cloud-platform",
                      "https://www.googleapis.com/auth/userinfo.email"]]
