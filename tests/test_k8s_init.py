"""Init containers in FakeKubeApi as Kubernetes runs them, and what the launcher makes of them.

Source for every behaviour: Kubernetes docs, "Init Containers",
https://kubernetes.io/docs/concepts/workloads/pods/init-containers/ : init containers run one by one,
each to completion, before any app container starts; the pod is Pending meanwhile (kubectl shows
`Init:N/M`), `status.initContainerStatuses` says where it is and the app container waits in
`PodInitializing`; with restartPolicy Never a failed init container fails the pod, otherwise the kubelet
restarts it with a back-off (`Init:CrashLoopBackOff`). Their output is their log (`kubectl logs -c`).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeApiException, FakeKubeApi, PodScript  # noqa: E402
from test_k8s_launcher import NAME, cluster, healthy, job, launch  # noqa: E402

from gpucluster.infra.kubernetes import plan as k8s_plan  # noqa: E402
from gpucluster.infra.kubernetes.api import KubeApi  # noqa: E402
from gpucluster.infra.kubernetes.manifests import config_map_manifest, job_manifest, service_manifest  # noqa: E402
from gpucluster.infra.kubernetes.pods import _Pods  # noqa: E402


def create(fake, plan, init_command=None, restart_policy="Never"):
    fake.create_namespaced_config_map("default", config_map_manifest(plan))
    fake.create_namespaced_service("default", service_manifest(plan))
    body = job_manifest(plan)
    if init_command is not None:
        body.spec.template.spec.init_containers[0].command = init_command
    body.spec.template.spec.restart_policy = restart_policy
    fake.create_namespaced_job("default", body)


def ticks_until(fake, plan, cond, limit_s=30.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        fake.list_namespaced_pod("default", label_selector=plan.selector)
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition never held")


def pod(fake, index):
    return next(p for p in fake.pods.values() if p.index == index)


def test_init_containers_run_before_the_app_container_and_the_pod_is_pending_meanwhile():
    fake = FakeKubeApi({0: healthy(0), 1: PodScript(start_after=10**6)})  # node 1 is never placed
    plan = k8s_plan.plan_job(cluster(2), job())
    create(fake, plan)
    ticks_until(fake, plan, lambda: pod(fake, 0).init_proc is not None)
    head = pod(fake, 0)
    view = head.view()
    assert view.status.phase == "Pending" and head.status_text() == "Init:0/1"
    assert view.status.init_container_statuses[0].state.running is not None
    assert view.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    # the app container has no log yet; the init container's log is readable
    with pytest.raises(FakeApiException, match="PodInitializing"):
        fake.read_namespaced_pod_log(head.name, "default", container="pytorch")
    time.sleep(1.0)
    for _ in range(20):
        fake.list_namespaced_pod("default", label_selector=plan.selector)
    assert head.phase == "Pending"  # still waiting for node 1's DNS record
    text = fake.read_namespaced_pod_log(head.name, "default", container="wait-for-peers")
    assert f"dns {plan.hosts[0]}: ok" in text and plan.hosts[1] not in text
    for p in fake.pods.values():
        p.kill()


def test_a_failing_init_container_crash_loops_with_restart_policy_on_failure():
    fake = FakeKubeApi({0: healthy(0)})
    plan = k8s_plan.plan_job(cluster(1), job())
    create(fake, plan, ["python", "-c", "print('checking the mount'); raise SystemExit(3)"], "OnFailure")
    ticks_until(fake, plan, lambda: pod(fake, 0).status_text() == "Init:CrashLoopBackOff")
    st = pod(fake, 0).view().status.init_container_statuses[0]
    assert st.state.waiting.reason == "CrashLoopBackOff" and st.last_state.terminated.exit_code == 3
    ticks_until(fake, plan, lambda: pod(fake, 0).init_restarts.get(0, 0) >= 2)  # restarted, fails again
    assert pod(fake, 0).phase == "Pending" and pod(fake, 0).app_age is None
    pod(fake, 0).kill()


def test_the_launcher_names_a_failed_init_container_with_its_last_log_lines():
    fake = FakeKubeApi({0: healthy(0)})
    plan = k8s_plan.plan_job(cluster(1), job())
    create(fake, plan, ["python", "-c", "print('checking the mount'); print('argv.json is missing'); "
                                        "raise SystemExit(3)"])
    supervisor = SimpleNamespace(attach=lambda *a: (_ for _ in ()).throw(AssertionError("no app log to attach")))
    pods = _Pods(KubeApi(fake, fake, fake, stream=fake.stream), plan, supervisor, 0)
    end = time.monotonic() + 30
    while 0 not in pods.exit_codes and time.monotonic() < end:
        pods.refresh()
        time.sleep(0.05)
    assert pods.exit_codes[0] == 3
    why = pods.reasons[0]
    assert f"pod {NAME}-0-fake0 init container wait-for-peers Error: exit code 3" in why
    assert "checking the mount" in why and "argv.json is missing" in why
    assert pod(fake, 0).status_text() == "Init:Error"


def test_an_image_without_python_ends_the_run_at_once_naming_the_init_container(tmp_path):
    fake = FakeKubeApi({0: PodScript(no_python=True), 1: healthy(1)})
    t0 = time.monotonic()
    result, _, _ = launch(fake, tmp_path)
    assert time.monotonic() - t0 < 30
    assert not result.ok and result.failed_node == 0
    assert "init container wait-for-peers StartError: exit code 128" in result.failure
    assert 'exec: "python": executable file not found' in result.failure


def test_an_oom_killed_app_container_is_named(tmp_path):
    """The kernel's OOM killer ends node 1's training container (SIGKILL, reason OOMKilled, exit code 137:
    Kubernetes docs, "Assign Memory Resources to Containers and Pods")."""
    fake = FakeKubeApi({0: healthy(0), 1: PodScript(lines=["allocating"], exit_code=None, oom_after_s=1.0)})
    result, _, _ = launch(fake, tmp_path)
    assert not result.ok and result.failed_node == 1
    assert "container pytorch ended with exit code 137 (OOMKilled): container exceeded its memory limit" in \
        result.failure


def test_an_oom_killed_init_container_is_named_with_its_reason():
    """An init container over its memory limit is killed by the kernel's OOM killer: terminated, reason
    OOMKilled, exit code 137 (Kubernetes docs, "Assign Memory Resources to Containers and Pods"); with
    restartPolicy Never the pod fails (docs, "Init Containers"). The status is built as the API gives it."""
    fake = FakeKubeApi({})
    plan = k8s_plan.plan_job(cluster(1), job())
    pods = _Pods(KubeApi(fake, fake, fake, stream=fake.stream), plan, SimpleNamespace(attach=lambda *a: None), 0)
    name = f"{NAME}-0-abcde"
    init = SimpleNamespace(name="wait-for-peers", state=SimpleNamespace(
        waiting=None, running=None, terminated=SimpleNamespace(exit_code=137, reason="OOMKilled", message=None)))
    app = SimpleNamespace(name="pytorch", state=SimpleNamespace(
        waiting=SimpleNamespace(reason="PodInitializing", message=None), running=None, terminated=None))
    pod = SimpleNamespace(metadata=SimpleNamespace(name=name, deletion_timestamp=None, labels={}),
                          status=SimpleNamespace(phase="Failed", init_container_statuses=[init],
                                                 container_statuses=[app], conditions=[], reason=None, message=None))
    code, why = pods._init_failure(pod)
    assert code == 137 and why == f"pod {name} init container wait-for-peers OOMKilled: exit code 137"
