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


# -- the project as gcp's spec rules (no `Accounts` part): --project checked by `validate`, the default
# found by `prepare`, required but in a dry run -------------------------------------------------------------
@pytest.fixture
def no_ambient_project(tmp_path, monkeypatch):
    """No project anywhere: not in the environment, no gcloud config, no application-default credentials."""
    for var in ALL_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setattr(gcp_access, "adc_project", lambda: None)


def test_gcp_prepare_finds_the_project_and_refuses_none_but_in_a_dry_run(no_ambient_project, monkeypatch):
    from gpucluster.infra.registry import plugin

    rules = plugin("gcp").spec
    bare = ClusterSpec(cloud="gcp", nodes=1)
    with pytest.raises(SpecError, match="no GCP project: pass --project MY-PROJECT"):
        rules.prepare(bare)
    assert rules.prepare(bare, dry_run=True)[0].project is None  # the dry run shows a placeholder
    assert rules.prepare(bare, detect=None)[0] == bare  # `doctor`: nothing looked up
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-proj-42")
    found = rules.prepare(bare)[0]
    assert (found.project, found.project_source) == ("env-proj-42", "environment variable GOOGLE_CLOUD_PROJECT")
    given = bare.replace(project="flag-proj-42", project_source="--project")
    assert rules.prepare(given)[0] == given  # --project wins over the environment, said as given


def test_gcp_validate_checks_the_project_form_as_the_flag_was_checked():
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import resolve, validate

    gcp = plugin("gcp")
    good = resolve(ClusterSpec(cloud="gcp", nodes=1, project="my-proj-42", project_source="--project"), gcp)
    validate(good, gcp)
    with pytest.raises(SpecError, match=r"GCP project 'Bad' \(from --project\) is not allowed: a project ID is 6-30"):
        validate(good.replace(project="Bad"), gcp)


def test_project_flag_of_commands_that_create_nothing(no_ambient_project, monkeypatch):
    """`down`/`cost report` (`project_id`) and `gc`/`doctor`/`status` (`check_place`): the form checked by gcp's
    `validate`; '' is the default project, refused when there is none; other backends refuse the flag."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.registry import plugin, project_id
    from gpucluster.lifecycle.prepare import _with_project_flag, check_place

    assert project_id("my-proj-42") == "my-proj-42"
    with pytest.raises(SpecError, match=r"GCP project 'Bad' \(from --project\)"):
        check_place({"gcp": plugin("gcp")}, project="Bad")
    with pytest.raises(SpecError, match="no GCP project"):
        project_id("")
    monkeypatch.setenv("GOOGLE_PROJECT", "env-proj-42")
    assert project_id("") == "env-proj-42"
    with pytest.raises(UsageError, match="^--project my-proj-42 is not allowed with --cloud local$"):
        _with_project_flag(ClusterSpec(cloud="local", nodes=1), "my-proj-42", plugin("local"))


def test_a_quota_error_says_its_cause_which_placement_fails_over_on():
    """The cause travels with the error (`ProvisionError.cause`), not as words the core matches in its message:
    the message GKE's quota text becomes ("GCP quota NVIDIA_V100_GPUS exceeded in us-central1 ...") carries none
    of the raw markers ("QUOTA_EXCEEDED", "Quota '") the core used to look for."""
    err = classify_quota(GKE_QUOTA_TEXT, ClusterSpec(cloud="gcp", nodes=2, zone="us-central1-a"))
    assert err is not None and err.cause == "quota"
    assert "QUOTA_EXCEEDED" not in err.message and "Quota '" not in err.message
