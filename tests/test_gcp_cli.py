"""gcp on the command line: --project, --dry-run (no credentials, nothing created), doctor's gcp checks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpucluster.infra.gcp import access as gcp_access
from gpucluster.infra.gcp import doctor as gcp_doctor

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi_gcp")
pytest.importorskip("kubernetes")


def gpucluster(*args, env_extra=None, tmp_path=None):
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in gcp_access.PROJECT_ENV_VARS and k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.update({"GPUCLUSTER_HOME": str(tmp_path / "home"), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-such-key.json"), **(env_extra or {})})
    return subprocess.run([sys.executable, "-m", "gpucluster.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)


def test_dry_run_of_a_default_two_node_run_needs_no_credentials(tmp_path):
    out = gpucluster("run", "--cloud", "gcp", "--nodes", "2", "--dry-run", "--project", "my-proj-42", "--json",
                     tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["project"] == "my-proj-42" and result["project_source"] == "--project"
    by_type = {}
    for r in result["resources"]:
        by_type.setdefault(r["type"], []).append(r)
    (cluster,) = by_type["gcp:container/cluster:Cluster"]
    assert cluster["project"] == "my-proj-42" and cluster["location"] == "us-central1-a"
    assert cluster["deletion_protection"] is False and cluster["labels"]["managed-by"] == "gpucluster"
    pools = {p["pool"]: p for p in by_type["gcp:container/nodePool:NodePool"]}
    assert pools["gpu"]["machine_type"] == "n1-standard-4" and pools["gpu"]["accelerators"] == "1 x nvidia-tesla-v100"
    assert pools["gpu"]["nodes"] == "autoscaling 0..2 (starts at 2)"
    assert pools["system"]["machine_type"] == "n1-standard-2"
    kinds = [m["kind"] for m in result["manifests"]]
    assert kinds == ["ConfigMap", "Service", "Job"]
    job = result["manifests"][2]["spec"]
    assert job["activeDeadlineSeconds"] == 240 * 60 and job["template"]["spec"]["initContainers"][0]["name"] == \
        "wait-for-peers"
    assert any(n.startswith("image: pytorch/pytorch:") for n in result["plan"])
    assert "$5.58/h" in result["estimate_line"]
    # nothing was recorded or created: the gpucluster home (ledger, Pulumi state) was never made
    assert not (tmp_path / "home").exists()


def test_dry_run_text_without_any_project_says_so(tmp_path):
    out = gpucluster("up", "--cloud", "gcp", "--dry-run", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no GCP project resolved here" in out.stdout and "gcp:container/nodePool:NodePool" in out.stdout
    assert "after the max lifetime" in out.stdout


def test_project_for_another_cloud_and_a_bad_project_are_usage_errors(tmp_path):
    out = gpucluster("run", "--cloud", "local", "--project", "my-proj-42", tmp_path=tmp_path)
    assert out.returncode == 2 and "--project does not apply to --cloud local" in out.stderr
    assert "Traceback" not in out.stderr
    out = gpucluster("up", "--cloud", "gcp", "--project", "Bad_Project", "--dry-run", tmp_path=tmp_path)
    assert out.returncode == 2 and "'Bad_Project'" in out.stderr and "Traceback" not in out.stderr


def test_project_from_the_gcloud_config_file_reaches_the_program(tmp_path):
    conf = tmp_path / "gcloud" / "configurations"
    conf.mkdir(parents=True)
    (conf / "config_default").write_text("[core]\nproject = from-gcloud-file\n")
    out = gpucluster("up", "--cloud", "gcp", "--dry-run", "--json", tmp_path=tmp_path)
    result = json.loads(out.stdout)
    assert result["project"] == "from-gcloud-file" and "gcloud config" in result["project_source"]
    cluster = next(r for r in result["resources"] if r["type"] == "gcp:container/cluster:Cluster")
    assert cluster["project"] == "from-gcloud-file"


class Creds:
    token, valid, service_account_email = "tok", True, "runner@my-proj-42.iam.gserviceaccount.com"


def test_doctor_gcp_checks_adc_project_quota_and_kubernetes_auth(monkeypatch, tmp_path):
    from google_fake import FakeProject

    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    for var in gcp_access.PROJECT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    project = FakeProject().ready()
    checks = gcp_doctor.doctor_checks("my-proj-42", "us-central1", credentials=Creds(), google=project,
                                      billing=project)
    assert all(c["ok"] is True for c in checks), checks
    by = {c["check"]: c for c in checks}
    assert "my-proj-42 (from --project)" in by["gcp project"]["detail"]
    assert "0 used of 8" in by["gcp quota NVIDIA_V100_GPUS (us-central1)"]["detail"]
    assert "no gcloud" in checks[-1]["detail"]
    project.regions["us-central1"]["NVIDIA_V100_GPUS"] = (1.0, 0.0)
    checks = gcp_doctor.doctor_checks("my-proj-42", "us-central1", credentials=Creds(), google=project, billing=project)
    (quota,) = [c for c in checks if c["ok"] is False]
    assert "needs 2" in quota["detail"] and "--region" in quota["fix"]
    assert "europe-west4" in quota["fix"]


def test_doctor_gcp_without_adc_fails_each_check_with_a_fix(monkeypatch, tmp_path):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**kw):
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    for var in gcp_access.PROJECT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    checks = gcp_doctor.doctor_checks(None, None)
    assert [c["ok"] for c in checks] == [False, False, None, False]  # the prerequisites: not checked
    assert all(c["fix"] for c in checks if c["ok"] is False)
    assert "application-default login" in checks[0]["fix"]


def test_sweep_and_cost_report_take_project_and_refuse_it_elsewhere(tmp_path):
    out = gpucluster("sweep", "--cloud", "local", "--project", "my-proj-42", "--nodes", "1", tmp_path=tmp_path)
    # refused as `run` refuses it (sweep checks the cloud's flags the same way)
    assert out.returncode == 2 and "--project does not apply to --cloud local" in out.stderr
    out = gpucluster("cost", "report", "--project", "my-proj-42", "--json", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    out = gpucluster("cost", "report", "--project", "X", tmp_path=tmp_path)
    assert out.returncode == 2 and "'X'" in out.stderr and "Traceback" not in out.stderr
    for cmd in (("run",), ("up",), ("down",), ("gc",), ("doctor",), ("sweep",), ("cost", "report")):
        assert "--project" in gpucluster(*cmd, "--help", tmp_path=tmp_path).stdout, cmd


def test_down_project_is_checked_before_anything_is_deleted(tmp_path):
    out = gpucluster("down", "some-aws-cluster", "--cloud", "aws", "--project", "my-proj-42", "--yes",
                     tmp_path=tmp_path)
    assert out.returncode == 2 and "not allowed for some-aws-cluster" in out.stderr
    out = gpucluster("down", "c1", "--cloud", "gcp", "--project", "Nope", "--yes", tmp_path=tmp_path)
    assert out.returncode == 2 and "'Nope'" in out.stderr and "Traceback" not in out.stderr
