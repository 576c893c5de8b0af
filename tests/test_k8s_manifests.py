"""Kubernetes launcher manifests, built with the client's typed models, checked field by field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from gpucluster.infra.gcp import gke  # noqa: E402
from gpucluster.infra.gcp.gke import GKE, LEGACY_GPU_IMAGE  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s, manifests as k8s_manifests, plan as k8s_plan  # noqa: E402
from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.domain import Cluster, Node  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402

RUN = "r20261122-031500-abc123"
NAME = "gpucluster-r20261122-031500-abc123"


def cluster(nodes=2, gpus=4, with_nodes=False):
    node_list = tuple(Node(rank=i, host=f"gke-node-{i}", private_ip=f"10.0.0.{i + 2}") for i in range(nodes))
    return Cluster(
        name="v100", cloud="gcp", nodes=node_list if with_nodes else (), zone="us-central1-a",
        instance_type="n1-standard-16", gpus_per_node=gpus, kubeconfig="{}",
        outputs={"nodes": nodes, "gpus_per_node": gpus, "accelerator_type": "nvidia-tesla-v100",
                 "node_pool_name": "gpu"},
    )


def job(**kw):
    base = dict(run_id=RUN, workload="digits", workload_args=("--epochs", "2"), nproc_per_node=4,
                max_seconds=1200, env=(("EXTRA", "1"),))
    base.update(kw)
    return JobSpec(**base)


@pytest.fixture
def plan():
    return k8s_plan.plan_job(cluster(), job(), platform=GKE)  # gcp's: the GPU pool's labels, N1 requests


def serial(obj):
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def test_plan_names_hosts_and_argv_per_rank(plan):
    assert plan.name == NAME and plan.nodes == 2 and plan.gpus_per_node == 4
    assert plan.hosts == (f"{NAME}-0.{NAME}", f"{NAME}-1.{NAME}")
    for rank, argv in enumerate(plan.argv_by_rank):
        if rank:  # off the head, torchrun starts once the head's rendezvous port answers (pod_wait.py)
            assert argv[:7] == ("python", "/gpucluster/wait.py", "rendezvous", plan.hosts[0], "29400", "1200", "--")
            argv = argv[7:]
        assert argv[:3] == ("python", "-m", "torch.distributed.run")
        assert "--nnodes=2" in argv and "--nproc-per-node=4" in argv
        assert f"--rdzv-endpoint={NAME}-0.{NAME}:29400" in argv
        assert f"--rdzv-id={RUN}" in argv
        assert f"--local-addr={plan.hosts[rank]}" in argv
        # the digits data is shipped, so an image with only torch runs it
        assert argv[-5:] == ("/gpucluster/workloads/digits.py", "--epochs", "2",
                             "--data-file", "/gpucluster/data/digits.csv.gz")
    # rendezvous timeouts explicitly above the 1200 s start deadline (torchrun defaults: 600 / 60 s)
    assert "--rdzv-conf=is_host=true,join_timeout=1800,read_timeout=1500" in plan.argv_by_rank[0]
    assert "--rdzv-conf=is_host=false,join_timeout=1800,read_timeout=1500" in plan.argv_by_rank[1]


def test_nodes_counted_from_cluster_nodes_when_present():
    p = k8s_plan.plan_job(cluster(nodes=3, with_nodes=True), job())
    assert p.nodes == 3 and len(p.argv_by_rank) == 3


def test_job_manifest_indexed_backoff_restart_and_deadline(plan):
    m = k8s_manifests.job_manifest(plan)
    assert (m.api_version, m.kind, m.metadata.name, m.metadata.namespace) == ("batch/v1", "Job", NAME, "default")
    s = m.spec
    assert s.completion_mode == "Indexed"
    assert s.completions == 2 and s.parallelism == 2
    assert s.backoff_limit is None and s.backoff_limit_per_index == 0 and s.max_failed_indexes is None
    # the time limit, then torchrun's stop grace, the copy (as long as a pod waits for it) and a minute
    assert s.active_deadline_seconds == 1200 + k8s_plan.STOP_GRACE_S + k8s_plan.DEFAULT_COLLECT_WAIT_S + 60
    assert s.ttl_seconds_after_finished == 3600
    pod = s.template.spec
    assert pod.restart_policy == "Never"
    assert pod.subdomain == NAME  # with the headless Service: <job>-<index>.<service>
    assert s.template.metadata.labels == {"app.kubernetes.io/managed-by": "gpucluster",
                                          "gpucluster-run": RUN, "gpucluster-job": NAME}
    assert serial(m)["spec"]["completionMode"] == "Indexed"


def test_pod_requests_all_gpus_tolerates_taint_and_spreads(plan):
    pod = k8s_manifests.job_manifest(plan).spec.template.spec
    (c,) = pod.containers
    # GKE's V100 pool: the CUDA 12.6 build by the GPU's generation (issue 42; gcp/gke.py default_image)
    assert c.name == "pytorch" and c.image == LEGACY_GPU_IMAGE
    assert c.resources.limits == {"nvidia.com/gpu": "4"}
    assert c.command == ["python", "/gpucluster/entry.py"]
    (t,) = pod.tolerations
    assert (t.key, t.operator, t.effect) == ("nvidia.com/gpu", "Exists", "NoSchedule")
    assert pod.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-tesla-v100",
                                 "cloud.google.com/gke-nodepool": "gpu"}
    (term,) = pod.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert term.topology_key == "kubernetes.io/hostname"
    assert term.label_selector.match_labels == {"gpucluster-job": NAME}
    assert [p.container_port for p in c.ports] == [29400]


def test_pod_environment_matches_the_gpucluster_contract(plan):
    (c,) = k8s_manifests.job_manifest(plan).spec.template.spec.containers
    env = {e.name: e for e in c.env}
    assert env["GPUCLUSTER_RUN_ID"].value == RUN
    assert env["GPUCLUSTER_NUM_NODES"].value == "2"
    assert env["GPUCLUSTER_NODE_IPS"].value == f"{NAME}-0.{NAME},{NAME}-1.{NAME}"
    assert env["GPUCLUSTER_GPUS_PER_NODE"].value == "4"
    assert env["PYTHONUNBUFFERED"].value == "1" and env["EXTRA"].value == "1"
    rank = env["GPUCLUSTER_NODE_RANK"]
    assert rank.value is None
    assert rank.value_from.field_ref.field_path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_configmap_carries_entry_argv_and_workloads_mounted(plan):
    cm = k8s_manifests.config_map_manifest(plan)
    assert cm.metadata.name == NAME
    assert json.loads(cm.data["argv.json"]) == [list(a) for a in plan.argv_by_rank]
    assert cm.data["entry.py"] == k8s_plan.ENTRYPOINT
    assert "w.protocol.py" in cm.data and "PREFIX" in cm.data["w.protocol.py"]
    pod = k8s_manifests.job_manifest(plan).spec.template.spec
    vol = {v.name: v for v in pod.volumes}
    items = {i.key: i.path for i in vol["gpucluster"].config_map.items}
    assert vol["gpucluster"].config_map.name == NAME
    assert items["entry.py"] == "entry.py" and items["w.protocol.py"] == "workloads/protocol.py"
    assert vol["dshm"].empty_dir.medium == "Memory"
    mounts = {m.name: m for m in pod.containers[0].volume_mounts}
    assert mounts["gpucluster"].mount_path == "/gpucluster" and mounts["gpucluster"].read_only is True


def test_headless_service(plan):
    svc = k8s_manifests.service_manifest(plan)
    assert svc.metadata.name == NAME
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.selector == {"gpucluster-job": NAME}
    assert svc.spec.publish_not_ready_addresses is True
    assert [(p.name, p.port) for p in svc.spec.ports] == [("rdzv", 29400)]


def test_image_option_and_user_command(tmp_path):
    p = k8s_plan.plan_job(cluster(), job(workload=None, command=("python", "train.py", "--lr", "0.1")),
                     image="registry.example/me/train:1", workdir=tmp_path)
    assert k8s_manifests.job_manifest(p).spec.template.spec.containers[0].image == "registry.example/me/train:1"
    assert json.loads(p.argv_by_rank[0][-1])[-3:] == ["train.py", "--lr", "0.1"]  # the announcer's JSON argument


def test_pytorchjob_manifest_master_and_workers():
    p = k8s_plan.plan_job(cluster(nodes=3), job(), mode="pytorchjob")
    assert p.hosts == (f"{NAME}-master-0", f"{NAME}-worker-0", f"{NAME}-worker-1")
    assert all(f"--rdzv-endpoint={NAME}-master-0:29400" in a for a in p.argv_by_rank)
    m = k8s_manifests.pytorchjob_manifest(p)
    assert (m["apiVersion"], m["kind"], m["metadata"]["name"]) == ("kubeflow.org/v1", "PyTorchJob", NAME)
    specs = m["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    assert specs["Master"]["restartPolicy"] == "Never"
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "subdomain" not in specs["Master"]["template"]["spec"]
    assert m["spec"]["runPolicy"]["backoffLimit"] == 0 and m["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert "Worker" not in k8s_manifests.pytorchjob_manifest(k8s_plan.plan_job(cluster(nodes=1), job(), mode="pytorchjob"))["spec"]["pytorchReplicaSpecs"]


def test_rank_of_pods_in_both_modes(plan):
    from types import SimpleNamespace as NS

    pod = NS(metadata=NS(annotations={k8s_plan.INDEX_ANNOTATION: "1"}, labels={}))
    assert k8s_manifests.rank_of(pod, plan) == 1
    pj = k8s_plan.plan_job(cluster(nodes=3), job(), mode="pytorchjob")
    worker = NS(metadata=NS(annotations={}, labels={"training.kubeflow.org/replica-type": "worker",
                                                    "training.kubeflow.org/replica-index": "1"}))
    master = NS(metadata=NS(annotations={}, labels={"training.kubeflow.org/replica-type": "master",
                                                    "training.kubeflow.org/replica-index": "0"}))
    assert (k8s_manifests.rank_of(master, pj), k8s_manifests.rank_of(worker, pj)) == (0, 2)


def test_unknown_mode_refused():
    with pytest.raises(UsageError, match="'mpijob'.*job, pytorchjob"):
        k8s.KubernetesLauncher(mode="mpijob")
    assert k8s.KubernetesLauncher.from_options({"launcher": "PyTorchJob", "image": "x:1"}).mode == "pytorchjob"


def test_dns_name_rules():
    assert k8s_plan.dns_name("GPUcluster_R1") == "gpucluster-r1"
    assert k8s_plan.dns_name("9abc") == "g-9abc"
    assert len(k8s_plan.dns_name("a" * 100)) == 52


def test_entry_script_execs_the_argv_of_its_completion_index(tmp_path, plan):
    # The real entry script, run here: it must pick argv.json[JOB_COMPLETION_INDEX] and exec it.
    (tmp_path / "entry.py").write_text(k8s_plan.ENTRYPOINT)
    argv = [[sys.executable, "-c", f"print('rank{i}', __import__('os').environ['GPUCLUSTER_NODE_RANK'])"]
            for i in range(2)]
    (tmp_path / "argv.json").write_text(json.dumps(argv))
    for var, value in (("JOB_COMPLETION_INDEX", "1"), ("RANK", "0")):
        env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "RANK")}
        env[var] = value
        out = subprocess.run([sys.executable, str(tmp_path / "entry.py")], env=env, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [f"rank{value}", value]
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "RANK")}
    out = subprocess.run([sys.executable, str(tmp_path / "entry.py")], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "JOB_COMPLETION_INDEX" in out.stderr


def test_local_user_script_is_shipped_in_the_configmap(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("print('hi')\n")
    p = k8s_plan.plan_job(cluster(), job(workload=None, command=("python", "jobs/train.py", "--lr", "0.1")),
                     workdir=tmp_path)
    # it runs from its writable copy in the run folder (the entry script lays the ConfigMap's copy down there)
    assert json.loads(p.argv_by_rank[1][-1])[-3:] == ["/gpucluster-run/code/jobs/train.py", "--lr", "0.1"]
    assert p.code and p.run_dir and dict(p.env)["GPUCLUSTER_CODE_DIR"] == k8s_plan.CODE_DIR
    cm = k8s_manifests.config_map_manifest(p)
    items = {i.path: i.key for i in k8s_manifests.job_manifest(p).spec.template.spec.volumes[0].config_map.items}
    assert cm.data[items["user/jobs/train.py"]] == "print('hi')\n"
    # beside the training container, the keeper (for exec once torchrun has ended), on the same run folder
    containers = serial(k8s_manifests.pod_template(p))["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pytorch", "gpucluster"]
    assert containers[1]["command"] == ["python", "/gpucluster/keeper.py"]
    assert {m["mountPath"] for m in containers[1]["volumeMounts"]} == {"/gpucluster", "/gpucluster-run"}
    assert p.exec_container == "gpucluster"
    # a module, a missing file, or a path outside the folder stays as given (it must be in the image)
    for command in (("python", "-m", "mypkg.train"), ("python", "missing.py"), ("python", "../x.py")):
        q = k8s_plan.plan_job(cluster(), job(workload=None, command=command), workdir=tmp_path)
        assert not any(path.startswith("user/") for _, path, _ in q.files)


def test_the_whole_script_folder_is_shipped_binary_files_included(tmp_path):
    folder = tmp_path / "proj"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("import helpers\n")
    (folder / "helpers.py").write_text("X = 1\n")
    (folder / "pkg" / "model.py").write_text("Y = 2\n")
    (folder / "labels.bin").write_bytes(b"\xff\x00\xfe")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"\x00" * 10)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref")
    p = k8s_plan.plan_job(cluster(), job(workload=None, command=("python", "proj/train.py")), workdir=tmp_path)
    shipped = {path: content for _, path, content in p.files if path.startswith("user/")}
    assert shipped == {"user/proj/train.py": "import helpers\n", "user/proj/helpers.py": "X = 1\n",
                       "user/proj/pkg/model.py": "Y = 2\n", "user/proj/labels.bin": b"\xff\x00\xfe"}
    cm = serial(k8s_manifests.config_map_manifest(p))
    keys = {path: key for key, path, _ in p.files}
    import base64
    assert base64.b64decode(cm["binaryData"][keys["user/proj/labels.bin"]]) == b"\xff\x00\xfe"
    assert all(len(k) <= 253 and all(c.isalnum() or c in "-._" for c in k) for k in cm["data"])
    assert any("script folder (4 file(s)" in n for n in p.notes)


def test_script_folder_over_the_configmap_limit_is_refused_with_what_to_do(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "train.py").write_text("pass\n")
    (folder / "data.npy").write_bytes(b"\x01" * (k8s_plan.CONFIGMAP_LIMIT + 1))
    from gpucluster.errors import LaunchError
    with pytest.raises(LaunchError, match="over the 1000000 bytes one Kubernetes ConfigMap holds.*folder of its own"):
        k8s_plan.plan_job(cluster(), job(workload=None, command=("python", "big/train.py")), workdir=tmp_path)


def test_builtin_workloads_get_their_data_and_the_plan_names_the_image():
    p = k8s_plan.plan_job(cluster(), job())
    (digits,) = [c for _, path, c in p.files if path == "data/digits.csv.gz"]
    import gzip
    assert gzip.decompress(digits).count(b"\n") == 1797  # scikit-learn's 1,797 digits
    assert p.notes[0] == f"image: {k8s_plan.DEFAULT_IMAGE} (torch only; the built-in workloads need nothing else)"
    m = k8s_plan.plan_job(cluster(), job(workload="mnist", workload_args=()))
    assert m.argv_by_rank[0][-3:] == ("--data-dir", "/tmp/mnist", "--download")
    # a user-given data file is left alone
    u = k8s_plan.plan_job(cluster(), job(workload_args=("--data-file", "/data/d.csv.gz")))
    assert not any(path.startswith("data/") for _, path, _ in u.files)


def test_init_container_waits_for_every_pods_dns_record_only(plan):
    # only the DNS records: the head's port opens when its torchrun starts, after --setup's release, which
    # needs every pod's app container; a port wait here deadlocks --setup on 2+ nodes (issue 26)
    pod = k8s_manifests.job_manifest(plan).spec.template.spec
    (init,) = pod.init_containers
    assert init.image == plan.image
    assert init.command == ["python", "/gpucluster/wait.py", "dns", ",".join(plan.hosts), "29400", "1200"]
    assert [e.name for e in init.env] == ["GPUCLUSTER_NODE_RANK"]
    # the operator adds its own init container in pytorchjob mode
    pj = k8s_plan.plan_job(cluster(), job(), mode="pytorchjob")
    assert k8s_manifests.pod_template(pj).spec.init_containers is None


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_waiter_script_waits_for_dns_then_the_head_port(tmp_path):
    import socket
    import time
    (tmp_path / "wait.py").write_text(k8s_plan.WAITER)
    # an unresolvable peer: it gives up at its limit, naming the host
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(tmp_path / "wait.py"), "dns", "localhost,no-such-host.invalid", "1", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "dns no-such-host.invalid: not ready" in out.stderr
    assert time.monotonic() - t0 < 30
    out = subprocess.run([sys.executable, str(tmp_path / "wait.py"), "dns", "127.0.0.1,localhost", "1", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "dns localhost: ok" in out.stdout
    # the head's port: closed, it gives up at its limit without running the command
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    flag = tmp_path / "ran"
    run = [sys.executable, "-c", f"open({str(flag)!r}, 'w').close()"]
    out = subprocess.run([sys.executable, str(tmp_path / "wait.py"), "rendezvous", "127.0.0.1", str(port), "3", "--",
                          *run], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "rendezvous 127.0.0.1" in out.stderr and not flag.exists()
    # it answers: the command is exec'd
    server.listen(4)
    out = subprocess.run([sys.executable, str(tmp_path / "wait.py"), "rendezvous", "127.0.0.1", str(port), "20", "--",
                          *run], capture_output=True, text=True, timeout=60)
    server.close()
    assert out.returncode == 0 and "rendezvous 127.0.0.1" in out.stdout and flag.exists()


def test_job_deadline_is_the_max_lifetime_or_the_time_limit_with_the_time_to_stop_and_copy():
    no_limit = k8s_plan.plan_job(cluster(), job(max_seconds=None))
    assert no_limit.active_deadline_s == 240 * 60  # the default max lifetime
    c = cluster()
    c.outputs["max_lifetime_minutes"] = 30
    assert k8s_plan.plan_job(c, job(max_seconds=None)).active_deadline_s == 1800
    # 30 minutes of lifetime leave less than the copy window: the launcher stops after a minute, no less
    assert k8s_plan.plan_job(c, job(max_seconds=None)).run_limit_s == 60
    assert k8s_plan.plan_job(c, job(max_seconds=600)).active_deadline_s == \
        600 + k8s_plan.STOP_GRACE_S + k8s_plan.DEFAULT_COLLECT_WAIT_S + 60


def test_log_lines_are_reassembled_from_chunks_and_the_response_released():
    class Response:
        released = False

        def stream(self):
            yield b"ab"
            yield "c\nde\n\nf"  # str chunks too
            yield b"g"
            raise ConnectionResetError("pod deleted")

        def release_conn(self):
            Response.released = True

    # a stream that broke keeps its unfinished last line back (it is read again from there)
    broken = []
    assert list(k8s._lines(Response(), broken)) == [b"abc\n", b"de\n", b"\n"]
    assert Response.released and isinstance(broken[0], ConnectionResetError)
    gen = k8s._lines(Response())
    next(gen)
    gen.close()  # a reader that stops early: no RuntimeError, the connection is still released


def test_training_pods_request_the_nodes_cpu_and_memory_less_what_gke_keeps(plan):
    """Not a BestEffort pod (the first the kubelet evicts under memory pressure, Kubernetes docs
    "Node-pressure Eviction"): the container requests the node's allocatable, by GKE's documented
    reservations, less a margin for GKE's own pods on the node, so it always fits."""
    container = serial(k8s_manifests.pod_template(plan))["spec"]["containers"][0]
    # n1-standard-16: 16 vCPU, 60 GB. CPU kept: 0.06 + 0.01 + 2 x 0.005 + 12 x 0.0025 = 0.11 -> 15.89;
    # memory: MemTotal taken as 60 x 0.975 = 58.5, kept 1 + 0.8 + 0.8 + 44 x 0.06 + 0.1 (eviction) =
    # 5.34 GiB -> 53.16; less GKE's DaemonSets (0.5 CPU, 0.75 GiB) and a margin (0.5 CPU, 0.25 GiB)
    assert gke.allocatable(16, 60) == pytest.approx((15.89, 53.16))
    assert container["resources"]["requests"] == {"cpu": "14890m", "memory": "53411Mi"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    for machine in ("n1-standard-4", "n1-standard-8", "n1-highmem-8", "n1-highcpu-16", "n1-standard-32"):
        from gpucluster.infra.gcp.catalog import n1_shape

        req = gke.pod_requests(machine)
        cpus, gib = gke.allocatable(*map(float, n1_shape(machine)))
        assert 0 < int(req["cpu"][:-1]) / 1000 <= cpus - 1 and 0 < int(req["memory"][:-2]) / 1024 <= gib - 1
    assert gke.pod_requests("e2-weird") == {} and gke.pod_requests(None) == {}


def test_the_jobs_deadline_leaves_room_to_stop_and_copy_and_without_a_limit_the_launcher_stops_first():
    """activeDeadlineSeconds terminates every running pod (Kubernetes docs, "Jobs", "Job termination and
    cleanup"): the outputs still being copied then are lost. It must come after the time limit, the stop
    and the whole copy window; without --max-minutes the launcher itself stops the training that long
    before the cluster's lifetime (the Job's deadline) ends."""
    with_limit = k8s_plan.plan_job(cluster(), job(max_seconds=600), collect_wait_s=900)
    assert with_limit.active_deadline_s == 600 + k8s_plan.STOP_GRACE_S + 900 + 60
    assert with_limit.run_limit_s == 600
    assert with_limit.active_deadline_s - with_limit.run_limit_s >= k8s_plan.STOP_GRACE_S + 900
    no_limit = k8s_plan.plan_job(cluster(), job(max_seconds=None), collect_wait_s=900, max_lifetime_s=4 * 3600)
    assert no_limit.active_deadline_s == 4 * 3600
    assert no_limit.active_deadline_s - no_limit.run_limit_s >= k8s_plan.STOP_GRACE_S + 900
    assert any("without --max-minutes the run is stopped after" in n for n in no_limit.notes), no_limit.notes


def test_a_user_command_gets_the_process_group_hook(tmp_path):
    """Issue 46 item 2: the pods carry gpucluster/node/node_pghook.py as /gpucluster/pghook/sitecustomize.py and
    name that folder in GPUCLUSTER_PG_HOOK, which the announcer puts first on the workers' PYTHONPATH."""
    from gpucluster.watch.launch import pg_hook_file

    (tmp_path / "train.py").write_text("print(1)\n")
    p = k8s_plan.plan_job(cluster(), job(workload=None, command=("python", "train.py")), workdir=tmp_path)
    assert dict(p.env)["GPUCLUSTER_PG_HOOK"] == f"{k8s_plan.MOUNT}/pghook"
    assert [c for _, path, c in p.files if path == "pghook/sitecustomize.py"] == [pg_hook_file().read_text()]
    builtin = k8s_plan.plan_job(cluster(), job())  # a built-in workload: nothing of it
    assert "GPUCLUSTER_PG_HOOK" not in dict(builtin.env) and not any(path.startswith("pghook/") for _, path, _ in builtin.files)
