"""The fake API server's Job controller and training operator (tests/k8s_fake_jobs.py) against the
rules of the real ones, each named there with its source. Pods run real processes (tests/k8s_fake.py);
the Job's clock is scaled (`fake.time_scale`) where a deadline or a TTL has to pass.

These tests pin the mechanism the launcher's tests rely on: a controller that acts on pods by itself,
on its own thread, whatever the client does. The launcher's own behaviour on it is tested in
test_k8s_outputs.py (every node's outputs come back after a failure, a lost pod, Ctrl-C) and
test_recovery_gcp.py (a preempted node's run resumes from node 0's checkpoint)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

k = pytest.importorskip("kubernetes.client")

from k8s_fake import FakeApiException, FakeKubeApi, PodScript  # noqa: E402

FOREVER = ["python", "-c", "import time\nwhile True: time.sleep(1)"]  # the pods' clock is fast (k8s_fake_net)


def exits(code: int) -> list[str]:
    return ["python", "-c", f"import sys; sys.exit({code})"]


def indexed_job(name: str, commands: list[list[str]], **spec) -> "k.V1Job":
    """An Indexed Job whose pod of index i runs commands[i] (the pod reads its index from the env)."""
    program = ("import json, os, subprocess, sys; argv = json.loads(os.environ['CMDS'])"
               "[int(os.environ['JOB_COMPLETION_INDEX'])]; sys.exit(subprocess.call(argv))")
    import json

    container = k.V1Container(name="main", image="python", command=["python", "-c", program],
                              env=[k.V1EnvVar(name="CMDS", value=json.dumps(commands))])
    return k.V1Job(metadata=k.V1ObjectMeta(name=name, labels={"job": name}), spec=k.V1JobSpec(
        completion_mode=spec.pop("completion_mode", "Indexed"), completions=len(commands), parallelism=len(commands),
        template=k.V1PodTemplateSpec(metadata=k.V1ObjectMeta(labels={"job": name}),
                                     spec=k.V1PodSpec(restart_policy="Never", containers=[container])), **spec))


def wait_for(fake: FakeKubeApi, cond, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        fake.list_namespaced_pod("default")  # the kubelet's clock (placement, container start)
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition never held")


def pod(fake: FakeKubeApi, index: int, job: str = "j"):
    return fake.pods[f"{job}-{index}-fake{index}"]


def running(fake, index, job="j") -> bool:
    return pod(fake, index, job).phase == "Running"


@pytest.fixture
def fake():
    f = FakeKubeApi({i: PodScript() for i in range(4)}, skew=0)
    yield f
    f.controllers_off = True
    for p in list(f.pods.values()):
        p.kill()


def test_with_backoff_limit_0_one_failed_pod_fails_the_job_and_terminates_the_others(fake):
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, exits(3)], backoff_limit=0))
    assert wait_for(fake, lambda: fake.job_condition("j"))[:2] == ("Failed", "BackoffLimitExceeded")
    assert pod(fake, 0).terminating is not None  # the pod still running was deleted by the controller
    assert pod(fake, 1).phase == "Failed" and pod(fake, 1).terminating is None  # finished pods stay


def test_a_deleted_pod_counts_as_failed_without_a_pod_failure_policy(fake):
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, FOREVER], backoff_limit=0))
    wait_for(fake, lambda: running(fake, 0) and running(fake, 1))
    fake.delete_pod(1)  # `kubectl delete pod`, a drain: deletionTimestamp set, not Succeeded
    assert wait_for(fake, lambda: fake.job_condition("j"))[1] == "BackoffLimitExceeded"
    assert pod(fake, 0).terminating is not None


def test_with_backoff_limit_per_index_a_failed_or_lost_pod_fails_only_its_index(fake):
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, exits(3), FOREVER, exits(0)],
                                                      backoff_limit_per_index=0))
    wait_for(fake, lambda: pod(fake, 1).phase == "Failed" and pod(fake, 3).phase == "Succeeded")
    wait_for(fake, lambda: running(fake, 0) and running(fake, 2))
    fake.lose(2)  # its node vanished: the pod is gone without a terminal phase
    time.sleep(0.3)
    assert fake.job_condition("j") is None and running(fake, 0) and pod(fake, 0).terminating is None
    state = fake.jobs["j"]
    assert state.failed_indexes == {1, 2} and state.succeeded == {3} and state.replacements == 0
    pod(fake, 0).kill()  # the last index ends (its container killed: Failed)
    assert wait_for(fake, lambda: fake.job_condition("j"))[:2] == ("Failed", "FailedIndexes")


def test_max_failed_indexes_fails_the_job_at_once(fake):
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, exits(1), exits(1)],
                                                      backoff_limit_per_index=0, max_failed_indexes=1))
    assert wait_for(fake, lambda: fake.job_condition("j"))[1] == "MaxFailedIndexesExceeded"
    assert pod(fake, 0).terminating is not None


def test_a_failed_pod_with_retries_left_is_replaced_by_a_new_pod_of_its_index(fake):
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, exits(2)], backoff_limit=1))
    wait_for(fake, lambda: "j-1-fake1r1" in fake.pods)
    assert fake.pods["j-1-fake1r1"].index == 1
    assert wait_for(fake, lambda: fake.job_condition("j"))[1] == "BackoffLimitExceeded"  # the second failure


def test_the_active_deadline_fails_the_job_and_terminates_its_running_pods(fake):
    fake.time_scale = 600.0  # 10 minutes pass in a second
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, FOREVER], backoff_limit_per_index=0,
                                                      active_deadline_seconds=300))
    assert wait_for(fake, lambda: fake.job_condition("j"))[1] == "DeadlineExceeded"
    assert pod(fake, 0).terminating is not None and pod(fake, 1).terminating is not None


def test_ttl_after_finished_deletes_the_job_and_its_pods(fake):
    fake.time_scale = 600.0
    fake.create_namespaced_job("default", indexed_job("j", [exits(0)], ttl_seconds_after_finished=600))
    assert wait_for(fake, lambda: fake.job_condition("j"))[0] == "Complete"
    wait_for(fake, lambda: ("job", "j") not in fake.objects and "j-0-fake0" not in fake.pods)


def test_a_pod_failure_policy_fail_job_rule_on_an_exit_code(fake):
    policy = k.V1PodFailurePolicy(rules=[k.V1PodFailurePolicyRule(
        action="FailJob", on_exit_codes=k.V1PodFailurePolicyOnExitCodesRequirement(operator="In", values=[42]))])
    fake.create_namespaced_job("default", indexed_job("j", [FOREVER, exits(42)], backoff_limit_per_index=3,
                                                      pod_failure_policy=policy))
    assert wait_for(fake, lambda: fake.job_condition("j"))[1] == "PodFailurePolicy"
    assert pod(fake, 0).terminating is not None and "j-1-fake1r1" not in fake.pods


@pytest.mark.parametrize("spec, says", [
    (dict(completion_mode="NonIndexed", backoff_limit_per_index=0), "backoffLimitPerIndex"),
    (dict(max_failed_indexes=1), "maxFailedIndexes"),
    (dict(backoff_limit_per_index=0, max_failed_indexes=5), "maxFailedIndexes"),
    (dict(pod_failure_policy=k.V1PodFailurePolicy(rules=[k.V1PodFailurePolicyRule(
        action="FailIndex", on_exit_codes=k.V1PodFailurePolicyOnExitCodesRequirement(operator="In", values=[1]))])),
     "FailIndex"),
])
def test_job_validation_refuses_what_the_api_server_refuses(fake, spec, says):
    with pytest.raises(FakeApiException) as got:
        fake.create_namespaced_job("default", indexed_job("j", [FOREVER, FOREVER], **spec))
    assert got.value.status == 422 and says in str(got.value.reason), got.value.reason


@pytest.mark.parametrize("policy, workers_deleted", [("All", True), ("None", False)])
def test_the_training_operator_cleans_pods_by_clean_pod_policy_once_the_master_succeeds(fake, policy, workers_deleted):
    template = k.ApiClient().sanitize_for_serialization(k.V1PodTemplateSpec(
        metadata=k.V1ObjectMeta(labels={"job": "p"}),
        spec=k.V1PodSpec(restart_policy="Never", containers=[k.V1Container(
            name="pytorch", image="python", command=["python", "-c", "import os, sys, time; "
                                                     "sys.exit(0) if os.environ['RANK'] == '0' else [time.sleep(1) for _ in iter(int, 1)]"])])))
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p", "labels": {"job": "p"}},
            "spec": {"runPolicy": {"cleanPodPolicy": policy, "backoffLimit": 0},
                     "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                             "Worker": {"replicas": 1, "template": template}}}}
    fake.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", body)
    assert wait_for(fake, lambda: fake.job_condition("p"))[0] == "Succeeded"
    time.sleep(0.2)
    assert (fake.pods["p-worker-0"].terminating is not None) is workers_deleted
