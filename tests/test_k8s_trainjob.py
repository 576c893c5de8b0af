"""The `trainjob` launcher (Kubeflow Trainer v2) against FakeKubeApi, whose Trainer and JobSet controllers
(tests/k8s_fake_trainer.py) turn the TrainJob into a JobSet, a headless Service and an Indexed child Job
that the fake Job controller runs (tests/k8s_fake_jobs.py), pods restartPolicy OnFailure as the JobSet
webhook defaults them (a container that exits non-zero is rerun in place: tests/k8s_fake_pod.py)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from test_k8s_launcher import NAME, cluster, healthy, job  # noqa: E402
from test_k8s_outputs import Events, assert_copied, slow_copy, with_outputs  # noqa: E402

from gpucluster.errors import ConfigError, ExitCode  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s, plan as k8s_plan  # noqa: E402
from gpucluster.watch.outputs import COMPLETE  # noqa: E402

TRAINJOBS, JOBSETS = "trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io"
CHILD = f"{NAME}-node-0"  # the JobSet's child Job: <jobset>-<replicatedJob>-<index> (placement.GenJobName)


def launcher_for(fake):
    return k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                  api_retry_s=10, mode="trainjob")


def run(fake, tmp_path, nodes=2, watch=None):
    launcher = launcher_for(fake)
    spec = job(output_dir=str(tmp_path / "out"))
    result = launcher.launch(cluster(nodes), spec, Events(), tmp_path / "logs")
    assert [c[1] for c in fake.of("delete")] == []  # nothing is deleted before the copy
    if watch is not None:
        watch()
    got = launcher.collect_outputs(spec, Events())
    assert launcher.cleanup_errors == []
    return result, {o.node_rank: o for o in got}


def assert_nothing_left(fake):
    """The TrainJob deleted with Foreground propagation; what it owns goes with it (JobSet, its Service
    and child Job, their pods); the ConfigMap is deleted by the launcher."""
    deletes = fake.of("delete")
    assert [(d[1], d[4]) for d in deletes] == [(TRAINJOBS, "Foreground"), ("configmap", None)]
    fake.settle()
    assert fake.objects == {} and fake.pods == {} and fake.jobs == {} and fake.jobsets == {}


def test_a_two_node_trainjob_succeeds_with_every_output_home(tmp_path):
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    result, got = run(fake, tmp_path)
    assert result.ok, result.failure
    assert [n.host for n in result.nodes] == [f"{CHILD}-{r}.{NAME}" for r in range(2)]
    for rank in range(2):
        assert got[rank].verdict == COMPLETE, got[rank].detail
        assert_copied(tmp_path, fake, rank)
    # the client created the ConfigMap and the TrainJob only; the controllers made the rest
    assert [c[1] for c in fake.of("create")] == ["configmap", TRAINJOBS]
    assert [c[1:] for c in fake.of("ctl-create")] == [(JOBSETS, "default", NAME), ("service", "default", NAME),
                                                      ("job", "default", CHILD)]
    # the Trainer's torch plugin gave each pod its rank as the completion index, and the master's address
    for name, pod in fake.pods.items():
        assert pod.env["PET_NODE_RANK"] == str(pod.index) and pod.env["PET_NNODES"] == "2"
        assert pod.env["PET_MASTER_ADDR"] == f"{CHILD}-0.{NAME}" == result.nodes[0].host
        assert pod.restart_policy == "OnFailure"  # the JobSet webhook's default
    assert {c[4] for c in fake.of("log")} == {"node"}
    assert_nothing_left(fake)


def test_a_failed_rank_ends_with_every_node_output_home(tmp_path):
    """Rank 1 fails while rank 0 still trains. Its container must not end non-zero: restartPolicy
    OnFailure would rerun torchrun in the same pod, and the child Job fails (and the JobSet with it,
    which then deletes its active child Jobs) only once pods failed; nothing may fail before the copy."""
    scripts = {0: with_outputs(PodScript(lines=["training"], exit_code=None), 0),
               1: with_outputs(PodScript(lines=["Traceback", "RuntimeError: CUDA out of memory"], exit_code=3), 1)}
    fake = FakeKubeApi(scripts)
    slow_copy(fake, f"{CHILD}-0-fake0", 0.6)  # node 0's copy is the slower one
    seen = {}

    def watch():  # before the copy: the JobSet and its Job still stand, no container was rerun
        time.sleep(0.3)  # the controllers' turn (they act every 20 ms)
        seen["jobset"] = fake.jobsets[NAME].condition
        seen["restarts"] = [c.restarts for p in fake.pods.values() for c in p.containers]

    result, got = run(fake, tmp_path, watch=watch)
    assert not result.ok and result.failed_node == 1 and "code 3" in result.failure
    assert seen == {"jobset": None, "restarts": [0, 0]}
    assert got[0].verdict == got[1].verdict == COMPLETE
    assert_copied(tmp_path, fake, 0), assert_copied(tmp_path, fake, 1)
    assert_nothing_left(fake)


@pytest.mark.parametrize("missing", [TRAINJOBS, "clustertrainingruntimes.trainer.kubeflow.org", JOBSETS,
                                     "runtime"])
def test_missing_trainer_or_jobset_is_refused_before_anything_is_created(tmp_path, missing):
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    if missing == "runtime":
        fake.cluster_runtimes.clear()
    else:
        fake.missing_crds = {missing}
    with pytest.raises(ConfigError) as err:
        run(fake, tmp_path)
    text = str(err.value)
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in text
    assert ("torch-distributed" if missing == "runtime" else missing.split(".")[0]) in text
    assert "kubectl apply --server-side" in text and "ref=v2.3.0" in text and "nothing was created" in text
    assert fake.of("create") == [] and fake.of("ctl-create") == []


def test_the_trainjob_carries_the_run_pod_and_the_controllers_refuse_what_the_real_webhook_does():
    plan = k8s_plan.plan_job(cluster(2), job(output_dir="/tmp/out"), mode="trainjob")
    from gpucluster.infra.kubernetes.manifests import trainjob_manifest

    body = trainjob_manifest(plan)
    assert body["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                          "kind": "ClusterTrainingRuntime"}
    assert body["spec"]["trainer"]["numNodes"] == 2
    assert body["spec"]["activeDeadlineSeconds"] == plan.active_deadline_s
    assert not any(e["name"].startswith("PET_") for e in body["spec"]["trainer"]["env"])
    fake = FakeKubeApi({})
    bad = {**body, "spec": {**body["spec"], "trainer": {**body["spec"]["trainer"],
                                                        "env": [{"name": "PET_NODE_RANK", "value": "0"}]}}}
    with pytest.raises(Exception, match="reserved envs"):
        fake.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", bad)
    patch = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch["template"]["spec"]["template"]["spec"]["containers"].append({"name": "gpucluster"})  # a keeper
    with pytest.raises(Exception, match="container that doesn't exist"):
        fake.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", body)


def test_without_the_self_kept_container_a_failed_rank_is_rerun_until_the_job_and_jobset_fail_and_every_pod_goes():
    """What the design avoids, on the fake's controllers: an entry script that exits with torchrun's code
    is rerun in place (restartPolicy OnFailure), its restarts count toward the child Job's default
    backoffLimit 6, the Job fails and terminates its running pods (their outputs with them), the JobSet fails."""
    from gpucluster.infra.kubernetes.manifests import config_map_manifest, trainjob_manifest

    fake = FakeKubeApi({r: PodScript(lines=["boom"], exit_code=3) for r in range(2)})
    plan = k8s_plan.plan_job(cluster(2), job(), mode="trainjob")
    body = trainjob_manifest(plan)
    body["spec"]["trainer"]["env"] = [e for e in body["spec"]["trainer"]["env"] if e["name"] != "GPUCLUSTER_SELF_KEEP"]
    fake.create_namespaced_config_map("default", config_map_manifest(plan))
    fake.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", body)
    end = time.monotonic() + 60
    while time.monotonic() < end and NAME not in fake.trainjob_status:
        fake.list_namespaced_pod("default", label_selector=plan.selector)
        time.sleep(0.05)
    assert fake.trainjob_status[NAME] == ("Failed", "FailedJobs")
    # the failed Job terminated its running pods (a failed Job is no longer active: the JobSet deletes only
    # active child Jobs, which matters when a JobSet has more than one)
    assert fake.job_condition(CHILD)[:2] == ("Failed", "BackoffLimitExceeded")
    assert fake.pods and all(p.deleted.is_set() for p in fake.pods.values())
    assert sum(c.restarts for p in fake.pods.values() for c in p.containers) > 6


@pytest.mark.slow  # the health check's own run (as tests/test_k8s_check.py)
def test_the_health_check_and_a_data_folder_reach_every_trainjob_pod_before_training(tmp_path):
    """As with the Job launcher: the check runs in every pod (exec into the `node` container), then the
    --data folder is staged into each, then torchrun starts; outputs come home."""
    import socket

    from test_k8s_data import dataset, staged

    from gpucluster.watch.health import HealthSpec
    from gpucluster.watch.staging import parse_data

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    mounts = parse_data((str(dataset(tmp_path, n=3)),), None)
    launcher = launcher_for(fake)
    spec = job(data=tuple(mounts), output_dir=str(tmp_path / "out"), check=HealthSpec(gpus=0, timeout_s=30),
               rdzv_port=port)
    events = Events()
    result = launcher.launch(cluster(2), spec, events, tmp_path / "logs")
    got = {o.node_rank: o for o in launcher.collect_outputs(spec, Events())}
    assert result.ok, result.failure
    assert sorted(staged(events)) == [0, 1]
    assert {c.name for p in fake.pods.values() for c in p.containers} == {"node"}  # no keeper: exec went there
    assert any("node_check.py" in " ".join(c[4]) for c in fake.of("exec"))
    assert got[0].verdict == got[1].verdict == COMPLETE
    assert_nothing_left(fake)
