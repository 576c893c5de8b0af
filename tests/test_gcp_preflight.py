"""What a new or half-set-up GCP project lacks, said before anything is created (issue 26 item 5):
`infra/gcp/preflight.py` against tests/google_fake.py, a FAKE project answering as Service Usage,
Compute Engine, Cloud Storage and Cloud Billing do (the sources are in that file)."""

from __future__ import annotations

import pytest

from google_fake import Bucket, FakeProject

from gpucluster.errors import ExitCode
from gpucluster.infra.gcp import access, doctor, preflight
from gpucluster.infra.gcp.preflight import PreflightError, checks
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def spec(**kw):
    base = dict(cloud="gcp", nodes=2, name="v100", zone="us-central1-a", project="my-proj-42")
    base.update(kw)
    return ClusterSpec(**base)


def run_preflight(project, s=None):
    return preflight.preflight(s or spec(), google=project, billing=project)


def failed(found):
    return [c for c in found if c["ok"] is False]


def test_a_new_project_is_refused_naming_the_api_and_the_command_that_enables_it():
    project = FakeProject()
    with pytest.raises(PreflightError) as err:
        run_preflight(project)
    msg = err.value.message
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in msg
    assert "container.googleapis.com is DISABLED in my-proj-42" in msg
    assert "gcloud services enable container.googleapis.com --project my-proj-42" in msg
    assert "nothing was created" in msg
    found = checks(spec(), google=project, billing=project)
    # both APIs named; the quotas are not read from a disabled Compute API (not taken as passed either)
    assert [c["check"] for c in failed(found)] == ["gcp Kubernetes Engine API", "gcp Compute Engine API"]
    assert any(c["ok"] is None and "quotas" in c["check"] for c in found)
    assert not any(u.startswith(preflight.COMPUTE) for u, _ in project.calls)


def test_compute_answers_service_disabled_as_google_does():
    """The fake's 403 for a disabled API reaches the check as a reason and message, not a crash."""
    project = FakeProject()
    project.enabled.add("container.googleapis.com")
    project.enabled.add("compute.googleapis.com")
    project.enabled.discard("compute.googleapis.com")
    with pytest.raises(preflight.ApiError) as err:
        project.get(f"{preflight.COMPUTE}/projects/my-proj-42")
    assert err.value.status == 403 and err.value.reason == "SERVICE_DISABLED"
    assert err.value.service == "compute.googleapis.com"


def test_global_gpu_quota_of_zero_is_named_without_another_region():
    project = FakeProject()
    project.enabled |= {"container.googleapis.com", "compute.googleapis.com"}
    with pytest.raises(PreflightError) as err:
        run_preflight(project)
    msg = err.value.message
    assert msg.startswith("gcp quota GPUS_ALL_REGIONS (all regions): 0 used of 0 in all regions: 2 V100 needs 2")
    assert "global: another region does not help" in msg and "--region" not in msg
    assert "iam-admin/quotas?project=my-proj-42" in msg and "gpus_all_regions" in msg
    assert "free-trial" in msg


def test_regional_v100_quota_names_need_and_other_regions():
    project = FakeProject().ready()
    project.regions["us-central1"]["NVIDIA_V100_GPUS"] = (4.0, 3.0)
    with pytest.raises(PreflightError) as err:
        run_preflight(project, spec(gpus_per_node=2))
    msg = err.value.message
    assert "NVIDIA_V100_GPUS (us-central1): 3 used of 4 in us-central1: 2 x n1-standard-8 + 2 V100 needs 4" in msg
    assert "request at least 7" in msg and "region us-central1" in msg
    assert "--region asia-east1 / europe-west4 / us-east1 / us-west1" in msg


def test_spot_draws_on_preemptible_quota_where_the_project_has_it_else_on_the_standard_one():
    project = FakeProject().ready()
    project.regions["us-central1"]["NVIDIA_V100_GPUS"] = (0.0, 0.0)
    project.regions["us-central1"]["PREEMPTIBLE_NVIDIA_V100_GPUS"] = (8.0, 0.0)
    assert not failed(checks(spec(spot=True), google=project, billing=project))
    with pytest.raises(PreflightError, match="NVIDIA_V100_GPUS \\(us-central1\\)"):  # on-demand: none
        run_preflight(project)
    project.regions["us-central1"]["PREEMPTIBLE_NVIDIA_V100_GPUS"] = (0.0, 0.0)
    project.regions["us-central1"]["NVIDIA_V100_GPUS"] = (8.0, 0.0)
    found = checks(spec(spot=True), google=project, billing=project)  # no preemptible quota: standard one
    assert not failed(found) and any("NVIDIA_V100_GPUS (us-central1)" in c["check"] for c in found)


def test_cpus_count_every_node_the_cluster_starts_and_addresses_one_per_node():
    project = FakeProject().ready()
    project.regions["us-central1"]["CPUS"] = (35.0, 0.0)
    s = spec(instance_type="n1-standard-16", gpus_per_node=4)
    need = preflight.needs(s)
    # 2 x 16 vCPU GPU nodes + the n1-standard-2 system node + GKE's default e2-medium while it is made
    assert need["gpu_vcpus"] + need["other_vcpus"] == 36 and need["addresses"] == 4
    with pytest.raises(PreflightError, match="gcp quota CPUS \\(us-central1\\): 0 used of 35.*needs 36"):
        run_preflight(project, s)
    project.regions["us-central1"]["CPUS"] = (36.0, 0.0)
    project.regions["us-central1"]["IN_USE_ADDRESSES"] = (8.0, 5.0)
    with pytest.raises(PreflightError, match="IN_USE_ADDRESSES \\(us-central1\\): 5 used of 8.*needs 4"):
        run_preflight(project, s)


def test_a_quota_the_api_does_not_list_is_not_checked_rather_than_zero():
    project = FakeProject().ready()
    del project.regions["us-central1"]["IN_USE_ADDRESSES"]
    found = checks(spec(), google=project, billing=project)
    (note,) = [c for c in found if "IN_USE_ADDRESSES" in c["check"]]
    assert note["ok"] is None and "lists no IN_USE_ADDRESSES" in note["detail"]
    run_preflight(project)  # not a failure


def test_billing_disabled_is_refused_and_an_unreadable_billing_is_only_noted():
    project = FakeProject().ready()
    project.billing_enabled = False
    with pytest.raises(PreflightError) as err:
        run_preflight(project)
    assert "billing is not enabled for my-proj-42" in err.value.message
    assert "gcloud billing projects link my-proj-42" in err.value.message
    project.billing_enabled, project.billing_readable = True, False
    found = checks(spec(), google=project, billing=project)
    (billing,) = [c for c in found if c["check"] == "gcp billing"]
    assert billing["ok"] is None and "not checked" in billing["detail"]
    run_preflight(project)


def test_buckets_need_uniform_access_for_a_prefix_and_the_right_to_set_their_policy():
    project = FakeProject().ready()
    project.buckets = {"data-bkt": Bucket(ubla=False), "out-bkt": Bucket(ubla=False)}
    whole = spec(reads=("gs://data-bkt",))
    run_preflight(project, whole)  # the whole bucket: a binding without a condition, no UBLA needed
    prefixed = spec(reads=("gs://data-bkt/train",))
    with pytest.raises(PreflightError) as err:
        run_preflight(project, prefixed)
    assert "gs://data-bkt has no uniform bucket-level access" in err.value.message
    assert "gcloud storage buckets update gs://data-bkt --uniform-bucket-level-access" in err.value.message
    project.buckets["data-bkt"] = Bucket(ubla=True, may_set_policy=False)
    with pytest.raises(PreflightError, match="may not change the IAM policy of gs://data-bkt"):
        run_preflight(project, prefixed)
    missing = spec(writes=("gs://gone-bkt/runs",))
    with pytest.raises(PreflightError, match="gs://gone-bkt does not exist"):
        run_preflight(project, missing)
    project.buckets["data-bkt"] = Bucket(ubla=True, may_get=False)
    found = checks(prefixed, google=project, billing=project)
    (b,) = [c for c in found if "data-bkt" in c["check"]]
    assert b["ok"] is None and "not checked whether it has uniform" in b["detail"]


def test_a_ready_project_passes_every_check():
    project = FakeProject().ready()
    found = checks(spec(), google=project, billing=project)
    assert all(c["ok"] is True for c in found), found
    assert {c["check"] for c in found} >= {"gcp Kubernetes Engine API", "gcp billing",
                                           "gcp quota GPUS_ALL_REGIONS (all regions)",
                                           "gcp quota NVIDIA_V100_GPUS (us-central1)", "gcp quota CPUS (us-central1)",
                                           "gcp quota IN_USE_ADDRESSES (us-central1)"}


def test_doctor_checks_the_shape_given(monkeypatch, tmp_path):
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))

    class Creds:
        token, valid, service_account_email = "tok", True, "runner@my-proj-42.iam.gserviceaccount.com"

    project = FakeProject().ready()
    found = doctor.doctor_checks("my-proj-42", "us-central1", nodes=4, instance_type="n1-standard-8", spot=False,
                                 credentials=Creds(), google=project, billing=project)
    shape = next(c for c in found if c["check"] == "gcp run shape")
    assert "4 x n1-standard-8 + 1 V100 in us-central1" in shape["detail"]
    assert all(c["ok"] is not False for c in found), found
    project.regions["us-central1"]["NVIDIA_V100_GPUS"] = (2.0, 0.0)
    found = doctor.doctor_checks("my-proj-42", "us-central1", nodes=4, credentials=Creds(), google=project,
                                 billing=project)
    (bad,) = failed(found)
    assert "needs 4" in bad["detail"] and "--region" in bad["fix"]
    (odd,) = failed(doctor.doctor_checks("my-proj-42", None, instance_type="g5.xlarge", credentials=Creds(),
                                         google=project, billing=project))
    assert "g5.xlarge" in odd["detail"]


# -- the classifier: what GKE and GCE say when a quota runs out mid-`pulumi up` ---------------------
# GKE's node-pool error (the words of the GKE API's operation error, as reported by the provider)
GKE_REGIONAL = ('googleapi: Error 403: Insufficient regional quota to satisfy request: resource "NVIDIA_V100_GPUS": '
                "request requires '8.0' and is short '8.0'. project has a quota of '0.0' with '0.0' available. View "
                "and manage quotas at https://console.cloud.google.com/iam-admin/quotas?usage=USED&project=my-proj-42.")
GCE_GLOBAL = ("[QUOTA_EXCEEDED]: Instance 'gke-v100-gpu-1' creation failed: Quota 'GPUS_ALL_REGIONS' exceeded.  "
              "Limit: 0.0 globally.")


def test_gke_insufficient_regional_quota_is_classified_with_other_regions():
    err = access.classify_quota(GKE_REGIONAL, spec())
    assert err is not None and err.quota == "NVIDIA_V100_GPUS" and err.region == "us-central1"
    assert "limit 0.0" in err.message and "needs 8.0" in err.message
    assert "iam-admin/quotas?project=my-proj-42" in err.hint and "europe-west4" in err.hint


def test_a_global_quota_is_never_told_to_use_another_region():
    for text in (GCE_GLOBAL, GKE_REGIONAL.replace("regional", "global").replace("NVIDIA_V100_GPUS",
                                                                                "GPUS_ALL_REGIONS")):
        err = access.classify_quota(text, spec())
        assert err is not None and err.quota == "GPUS_ALL_REGIONS" and err.region is None, text
        assert "(all regions)" in err.message
        assert "another region does not help" in err.hint and "--region" not in err.hint
        assert err.regions == []


def test_up_stops_at_the_gcp_preflight_with_exit_2_before_pulumi_or_the_ledger(home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand

    from gpucluster.cli import common, up
    from gpucluster.errors import UsageError
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger

    project = FakeProject()
    fake = FakePulumiCommand()
    p = PulumiProvider(plugin("gcp"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                       credentials=lambda: [{"check": "gcp application-default credentials", "ok": True, "detail": "x"}],
                       cloud_checks=lambda s: preflight.preflight(s, google=project, billing=project))
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: p.scoped(**scope))
    with pytest.raises(UsageError, match="container.googleapis.com is DISABLED") as err:
        up.up.main(["--cloud", "gcp", "--name", "demo", "--project", "my-proj-42", "--yes"], standalone_mode=False)
    assert err.value.exit_code == ExitCode.USAGE
    assert "up" not in fake.verbs() and fake.stacks == {}
    assert Ledger.open_default().list_runs() == []


def test_run_stops_at_the_gcp_preflight_with_exit_2_before_pulumi_or_the_ledger(home, monkeypatch):
    """`run` goes through the same preflight as `up` (issue 26 item 5): a new project is refused, one line,
    exit 2, before the Pulumi program, a ledger row or any Kubernetes object."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand

    from gpucluster.lifecycle import prepare
    from gpucluster.cli import run
    from gpucluster.errors import UsageError
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger

    project = FakeProject()
    project.enabled.update({"container.googleapis.com", "compute.googleapis.com"})  # the APIs are on; no GPU quota
    fake = FakePulumiCommand()
    p = PulumiProvider(plugin("gcp"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                       credentials=lambda: [{"check": "gcp application-default credentials", "ok": True, "detail": "x"}],
                       cloud_checks=lambda s: preflight.preflight(s, google=project, billing=project))
    real_make = prepare._make
    made = []

    def make(req, backend, spec, provider, ready):
        _, launcher = real_make(req, backend, spec, provider, ready)  # the real Kubernetes launcher
        made.append(launcher)
        return p, launcher

    monkeypatch.setattr(prepare, "_make", make)
    with pytest.raises(UsageError) as err:
        run.run.main(["--cloud", "gcp", "--name", "demo", "--project", "my-proj-42", "--nodes", "2", "--yes"],
                     standalone_mode=False)
    msg = err.value.message
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in msg
    assert "GPUS_ALL_REGIONS" in msg and "another region does not help" in msg, msg
    assert made and "up" not in fake.verbs() and fake.stacks == {}
    assert Ledger.open_default().list_runs() == []


def test_the_boot_disks_regional_quota_is_checked_before_anything_is_created():
    """pd-balanced and pd-ssd boot disks draw on the region's SSD_TOTAL_GB, pd-standard on DISKS_TOTAL_GB
    (Compute Engine docs, "Allocation quotas"); new projects often have 250-500 GB, so five 100 GB
    GPU nodes fail at node-pool creation, after the cluster took 5-10 minutes to build."""
    project = FakeProject().ready()
    project.regions["us-central1"]["SSD_TOTAL_GB"] = (500.0, 0.0)
    with pytest.raises(PreflightError) as err:
        run_preflight(project, spec(nodes=5, disk_gb=100))
    msg = err.value.message
    # 5 x 100 GB GPU nodes + the 50 GB system node + GKE's 100 GB default node
    assert "SSD_TOTAL_GB (us-central1)" in msg and "needs 650" in msg, msg
    run_preflight(project, spec(nodes=2, disk_gb=100))  # 350 GB fits
    project.regions["us-central1"]["DISKS_TOTAL_GB"] = (100.0, 0.0)
    with pytest.raises(PreflightError) as err:
        run_preflight(project, spec(nodes=2, disk_gb=100, disk_type="pd-standard"))
    assert "DISKS_TOTAL_GB (us-central1)" in err.value.message and "needs 200" in err.value.message
