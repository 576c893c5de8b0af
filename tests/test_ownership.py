"""Who made a resource (gpucluster/ownership.py): the installation id, the marks, what is ours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.domain import Leftover
from gpucluster.errors import UsageError
from gpucluster.ownership import (Ownership, default_name, installation_id, label_value, owner_marks,
                                  owners_of, parse_duration, run_started, stack_marks)

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ME, THEM = "0123456789abcdef", "fedcba9876543210"


def test_concurrent_first_use_agrees_on_one_id(tmp_path):
    """20 processes started together in a new home: one id, made once, read by all."""
    home = tmp_path / "home"
    code = ("import sys, time; from gpucluster.ownership import installation_id; "
            "t = float(sys.argv[1]); time.sleep(max(0.0, t - time.time())); print(installation_id())")
    import time

    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", code, str(start)], stdout=subprocess.PIPE, text=True,
                              env={"GPUCLUSTER_HOME": str(home), "PATH": "/usr/bin:/bin"}) for _ in range(20)]
    ids = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == 1 and len(next(iter(ids))) == 16
    assert (home / "installation-id").read_text().strip() in ids
    assert [p.name for p in home.iterdir() if p.name.startswith(".installation-id")] == []  # no temp files left


def test_the_id_is_stable_and_names_follow_it(home):
    first = installation_id()
    assert installation_id() == first
    assert default_name("aws", first) == f"gpucluster-aws-{first[:4]}"
    assert default_name("aws", ME) != default_name("aws", THEM)


def test_marks_are_valid_gcp_label_values(home, monkeypatch):
    monkeypatch.setenv("LOGNAME", "Alice.Smith@CORP")
    marks = dict(owner_marks(ME))
    assert marks == {"gpucluster-owner": ME, "gpucluster-user": "alice_smith_corp",
                     "gpucluster-host": label_value(__import__("socket").gethostname())}
    assert label_value("x" * 100) == "x" * 63
    marks = dict(stack_marks("gpucluster", "AWS-g5"))
    assert marks["gpucluster-stack"] == "gpucluster_aws-g5" and marks["gpucluster-user"] == "alice_smith_corp"


def test_reserved_marks_cannot_be_given_as_tags():
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec, validate

    with pytest.raises(UsageError, match="'gpucluster-owner' is reserved"):
        validate(ClusterSpec(cloud="local", nodes=1, name="abc", tags=(("gpucluster-owner", "x"),)), plugin("local"))
    with pytest.raises(UsageError, match="owner mark 'gpucluster-evil' is not allowed"):
        validate(ClusterSpec(cloud="local", nodes=1, name="abc", marks=(("gpucluster-evil", "x"),)), plugin("local"))
    with pytest.raises(UsageError, match="owner mark gpucluster-user value 'Bob Smith' is not allowed"):
        validate(ClusterSpec(cloud="local", nodes=1, name="abc", marks=(("gpucluster-user", "Bob Smith"),)),
                 plugin("local"))


def test_whose_is_it():
    mine = Leftover("instance", "i-1", "us-east-1", owner=ME)
    theirs = Leftover("instance", "i-2", "us-east-1", owner=THEM, made_by="bob@desk")
    legacy_ours = Leftover("vpc", "vpc-1", "us-east-1", run_id="r20261120-101010-aaaaaa")
    legacy_theirs = Leftover("vpc", "vpc-2", "us-east-1", run_id="r20261120-101010-bbbbbb")
    stack = Leftover("vpc", "vpc-3", "us-east-1", owner=ME, stack="gpucluster_aws-g5")
    o = Ownership(ME, frozenset({"r20261120-101010-aaaaaa"}))
    assert [o.whose(x) for x in (mine, theirs, legacy_ours, legacy_theirs, stack)] == [
        "ours", "not ours", "ours", "not ours", "stack"]
    assert o.split([mine, theirs, stack]) == ([mine], [theirs, stack])
    admin = Ownership(ME, any_owner=True)
    assert [admin.whose(x) for x in (theirs, legacy_theirs, stack)] == ["ours", "ours", "stack"]
    named = Ownership(ME, stacks=frozenset({"aws-g5"}))
    assert named.whose(stack) == "ours" and named.scan_owner is None and o.scan_owner == ME
    assert owners_of([theirs, legacy_theirs]) == [f"{THEM} (bob@desk)", "unknown"]


def test_durations_and_run_times():
    assert [parse_duration(x) for x in ("0s", "90m", "12h", "7d", "1.5h")] == [0, 5400, 43200, 604800, 5400]
    for bad in ("", "7", "3 weeks", "-1d", "1y"):
        with pytest.raises(UsageError, match="--older-than"):
            parse_duration(bad)
    assert run_started("r20261125-100203-abcdef") == 1795600923.0
    assert run_started("not-a-run") is None


def test_processes_are_matched_by_run_id_and_owner():
    from gpucluster.watch.procs import is_run_env

    run = "r20261125-100203-abcdef"
    assert is_run_env({"GPUCLUSTER_RUN_ID": run, "GPUCLUSTER_OWNER": ME}, run, ME)
    assert not is_run_env({"GPUCLUSTER_RUN_ID": run, "GPUCLUSTER_OWNER": THEM}, run, ME)
    assert is_run_env({"GPUCLUSTER_RUN_ID": run}, run, ME)  # started before owner marks: by run id
    assert not is_run_env({"GPUCLUSTER_RUN_ID": "r-other", "GPUCLUSTER_OWNER": ME}, run, ME)
    assert is_run_env({"GPUCLUSTER_RUN_ID": run, "GPUCLUSTER_OWNER": THEM}, run, None)  # any owner


def test_the_service_account_description_carries_the_marks():
    from gpucluster.infra.gcp.component_access import description_marks, marks_from_description

    labels = {"gpucluster-owner": ME, "gpucluster-user": "alice", "gpucluster-host": "laptop",
              "gpucluster-run": "r20261125-100203-abcdef", "team": "ml"}
    text = description_marks("lab", labels) + ": what the cluster's pods read and write"
    assert text.startswith(f"managed-by=gpucluster, gpucluster-cluster=lab, gpucluster-owner={ME}, ")
    assert marks_from_description(text) == {"managed-by": "gpucluster", "gpucluster-cluster": "lab",
                                            "gpucluster-owner": ME, "gpucluster-run": "r20261125-100203-abcdef",
                                            "gpucluster-user": "alice", "gpucluster-host": "laptop"}


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_two_owners_on_one_kubernetes_api_server(tmp_path):
    """Alice's Job, Service and ConfigMap (made by her launcher, labelled with her owner) stay
    while bob's launcher runs and cleans up its own run on the same API server."""
    pytest.importorskip("kubernetes")
    sys.path.insert(0, str(Path(__file__).parent))
    from k8s_fake import FakeKubeApi
    from test_k8s_launcher import Events, cluster, healthy

    from gpucluster.infra.kubernetes import launcher as k8s
    from gpucluster.infra.kubernetes.plan import plan_job
    from gpucluster.watch.launch import JobSpec

    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    api = k8s.KubeApi(fake, fake, fake)
    hers = JobSpec(run_id="r20261125-100000-a11ce0", workload="digits", nproc_per_node=1, owner=ME)
    plan = plan_job(cluster(2), hers, namespace="default")
    assert plan.label_dict["gpucluster-owner"] == ME
    from gpucluster.infra.kubernetes.objects import Created

    Created(api, plan).objects()  # her run, mid-flight
    before = {k for k in fake.objects if k[1] == plan.name}
    assert before == {("configmap", plan.name), ("service", plan.name), ("job", plan.name)}

    his = JobSpec(run_id="r20261125-100500-b0b000", workload="digits", nproc_per_node=1, owner=THEM)
    result = k8s.KubernetesLauncher(api=api, poll_interval=0, mode="job").launch(cluster(2), his, Events(),
                                                                                   tmp_path / "logs")
    assert result.ok
    fake.settle()
    assert {k for k in fake.objects if k[1] == plan.name} == before  # hers: all still there
    assert not [k for k in fake.objects if "b0b000" in k[1]]  # his: gone
