"""The Kubernetes launcher: torchrun across a GKE GPU pool, one pod per node.

Model (the `job` launcher, the default):

- a **ConfigMap** `<name>` carries the built-in workloads (`gpucluster/workloads/*.py`), a tiny
  standard-library entry script and `argv.json`, the torchrun argv of every node rank built with
  `gpucluster.launch.torchrun_argv` (so the c10d flags, `is_host` on rank 0 and the run id are the
  same as on the other backends). It is mounted read-only at `/gpucluster`.
- a **headless Service** `<name>` (clusterIP None, `publishNotReadyAddresses`) gives every pod a
  stable DNS name `<name>-<index>.<name>`; pod 0's name is the rendezvous endpoint.
- an **Indexed Job** `<name>`: completions = parallelism = nodes, `completionMode: Indexed`,
  `backoffLimit: 0`, `restartPolicy: Never`, `subdomain` = the Service. Each pod requests all the
  node's GPUs (`nvidia.com/gpu` limits), tolerates the GPU taint, avoids sharing a node with
  another pod of the job, and runs `python /gpucluster/entry.py`, which picks its argv by
  `JOB_COMPLETION_INDEX` (the node rank) and execs torchrun. `activeDeadlineSeconds` (the job's
  time limit + 10 min) and `ttlSecondsAfterFinished` make the cluster clean up even if this
  machine disappears.

With the option `launcher: pytorchjob` a Kubeflow **PyTorchJob** (`kubeflow.org/v1`, needs the
training operator, as in seed 003) replaces the Job and Service: Master + Workers, the same pod
template and entry script; the rank comes from the operator's `RANK` variable and the rendezvous
is on `<name>-master-0`, the Service the operator makes for the master.

The launcher lists the job's pods every `poll_interval` seconds, streams each pod's log as soon as
its container runs, feeds every line (node rank attached) to `gpucluster.launch.NodeSupervisor`
(the same metrics parser, tails, fail-fast and deadline as the local and ssh launchers), and when
the run ends, fails, times out or is interrupted deletes everything it created (Job with
Foreground propagation, so its pods go too; Service; ConfigMap).

The `kubernetes` package is imported lazily (`gpucluster --help` must not import it); tests pass
an in-memory fake through `KubeApi`.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from gpucluster.errors import LaunchError, UsageError, not_allowed, require
from gpucluster.launch import JobResult, JobSpec, LaunchEvents, NodeSupervisor, node_env, program_args, torchrun_argv

# A public PyTorch image (docker.io/pytorch/pytorch, Python 3.11) whose CUDA 12.4 build still
# targets the V100 (compute capability 7.0) and runs on the driver GKE installs (LATEST/DEFAULT).
# Tag chosen 2026-11-22; the option `image` replaces it.
DEFAULT_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
DEFAULT_NAMESPACE = "default"
MODES = ("job", "pytorchjob")
MOUNT = "/gpucluster"
WORKLOAD_DIR = f"{MOUNT}/workloads"
CONTAINER = "pytorch"  # the name the Kubeflow operator requires; used by both modes
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_GROUP, KUBEFLOW_VERSION, KUBEFLOW_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
CONFIGMAP_LIMIT = 1_000_000  # bytes; the API server refuses ConfigMaps over 1 MiB
JOB_LABEL = "gpucluster-job"
DEADLINE_MARGIN_S = 600
MAX_LIST_ERRORS = 5  # consecutive failed pod listings before the run is given up
TTL_AFTER_FINISHED_S = 3600
# How long every pod of the job may take to be running (GPU node creation by the autoscaler, driver
# installation, image pull); past it the run fails with the scheduler's reason. `--start-deadline`.
DEFAULT_START_DEADLINE_S = 20 * 60
# c10d timeouts, set explicitly above the start deadline (torchrun's defaults: join_timeout 600 s,
# read_timeout 60 s; a non-head agent gave up after 77-121 s in our measurements).
RDZV_MARGIN_S = 300
DEFAULT_MAX_LIFETIME_S = 240 * 60
DATA_DIR = f"{MOUNT}/data"
# What is not shipped from a user's script folder (not code, or rebuilt on the node).
SKIP_DIRS = ("__pycache__", ".git", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache")
# Container waiting reasons that will not fix themselves: fail now rather than at the deadline.
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff")

# Runs in the pod with the image's python (standard library only): pick this node's argv and exec.
ENTRYPOINT = '''\
"""gpucluster: exec torchrun with this pod's node rank (JOB_COMPLETION_INDEX or the operator's RANK)."""
import json, os, sys

rank = os.environ.get("JOB_COMPLETION_INDEX") or os.environ.get("RANK")
if rank is None:
    sys.exit("gpucluster entry: neither JOB_COMPLETION_INDEX nor RANK is set")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.json")) as f:
    argv = json.load(f)[int(rank)]
os.environ["GPUCLUSTER_NODE_RANK"] = str(int(rank))
sys.stdout.flush()
os.execvp(argv[0], argv)
'''

# Init container (job mode), standard library only: torchrun starts only when every pod of the job
# has a DNS record (it is scheduled and has an IP: the headless Service publishes not-ready
# addresses) and, on the other ranks, when the head's rendezvous port answers. The same idea as
# the init container Kubeflow's PyTorchJob puts on its workers (it waits for the master's name).
WAITER = '''\
"""gpucluster: wait until every pod resolves (and, off the head, the rendezvous port answers)."""
import os, socket, sys, time

hosts, port, limit = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3])
rank = int(os.environ.get("JOB_COMPLETION_INDEX") or os.environ.get("GPUCLUSTER_NODE_RANK") or 0)
end = time.monotonic() + limit


def wait(what, probe):
    last = None
    while time.monotonic() < end:
        try:
            probe()
            print(f"[gpucluster] {what}: ok", flush=True)
            return
        except OSError as exc:
            last = exc
            time.sleep(2)
    sys.exit(f"[gpucluster] {what}: not ready after {limit:.0f} s ({last})")


for host in hosts:
    wait(f"dns {host}", lambda h=host: socket.getaddrinfo(h, port, proto=socket.IPPROTO_TCP))
if rank != 0:
    wait(f"rendezvous {hosts[0]}:{port}", lambda: socket.create_connection((hosts[0], port), timeout=5).close())
'''


def dns_name(text: str, limit: int = 52) -> str:
    """A DNS-1035 label from `text` (lowercase, a-z0-9-, starts with a letter), short enough that
    `<name>-<index>` and `<name>-worker-<index>` stay within 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "g-" + name
    return name[:limit].rstrip("-")


@dataclass(frozen=True)
class Plan:
    """Everything the manifests need; built once from the cluster and the job."""

    name: str
    namespace: str
    mode: str
    nodes: int
    gpus_per_node: int
    image: str
    run_id: str
    hosts: tuple[str, ...]  # stable DNS names, node rank order; hosts[0] is the rendezvous host
    argv_by_rank: tuple[tuple[str, ...], ...]
    env: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str, str | bytes], ...]  # (ConfigMap key, path under MOUNT, text or bytes)
    labels: tuple[tuple[str, str], ...]
    node_selector: tuple[tuple[str, str], ...] = ()
    rdzv_port: int = 29400
    active_deadline_s: int | None = None
    start_deadline_s: int = DEFAULT_START_DEADLINE_S
    notes: tuple[str, ...] = ()  # what the plan tells the user (image, data, what is shipped)

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def selector(self) -> str:
        return f"{JOB_LABEL}={self.name}"


def _workload_files() -> list[tuple[str, str, str]]:
    import gpucluster.workloads as pkg

    folder = Path(pkg.__file__).parent
    return [(f"w.{p.name}", f"workloads/{p.name}", p.read_text()) for p in sorted(folder.glob("*.py"))]


def _size(files: Iterable[tuple[str, str, str | bytes]]) -> int:
    return sum(len(c if isinstance(c, bytes) else c.encode()) for _, _, c in files)


def _folder_files(folder: Path) -> list[Path]:
    out = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part in SKIP_DIRS for part in rel.parts):
            continue
        if path.is_file() and not path.is_symlink():
            out.append(path)
    return out


def _ship_user_script(program: list[str], workdir: Path) -> tuple[list[str], list[tuple[str, str, str | bytes]]]:
    """Ship the command's script folder when the script is a local .py file below `workdir`: every
    file of the script's folder (hidden files, caches and virtualenvs left out) goes into the
    ConfigMap under /gpucluster/user/ and the script's path is rewritten; the command runs from there."""
    if not program or program[0] in ("-m", "--no-python"):
        return program, []
    script = Path(program[0])
    if script.is_absolute() or ".." in script.parts or script.suffix != ".py":
        return program, []
    local = workdir / script
    if not local.is_file():
        return program, []
    folder = local.parent
    files: list[tuple[str, str, str | bytes]] = []
    for i, path in enumerate(_folder_files(folder)):
        rel = path.relative_to(workdir).as_posix()
        data = path.read_bytes()
        try:
            content: str | bytes = data.decode()
        except UnicodeDecodeError:
            content = data
        # ConfigMap keys: [-._a-zA-Z0-9]+, at most 253 characters; the path is in the volume item
        key = f"u{i:04d}." + re.sub(r"[^-._a-zA-Z0-9]", "_", path.name)[:200]
        files.append((key, f"user/{rel}", content))
    size = _size(files)
    if size > CONFIGMAP_LIMIT:
        raise LaunchError(
            f"the script folder {folder} takes {size} bytes, over the {CONFIGMAP_LIMIT} bytes one Kubernetes "
            "ConfigMap holds (1 MiB): put the script in a folder of its own, keep data out of it (download it "
            "on the nodes), or build an image with it and set the option image")
    return [f"{MOUNT}/user/{script.as_posix()}", *program[1:]], files


def _builtin_data(job: JobSpec) -> tuple[list[str], list[tuple[str, str, str | bytes]], list[str]]:
    """(extra workload arguments, files, notes) so a built-in workload runs on an image that has only
    torch: digits gets scikit-learn's digits.csv.gz (read here from the installed scikit-learn
    wheel, without importing it) shipped in the ConfigMap; mnist downloads its IDX files on each node."""
    args = list(job.workload_args)
    if job.command or not job.workload:
        return [], [], []
    if job.workload == "digits" and "--data-file" not in args:
        import importlib.util

        found = importlib.util.find_spec("sklearn")
        path = (Path(list(found.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
                if found and found.submodule_search_locations else None)
        if path is None or not path.is_file():
            raise UsageError("the digits workload ships its data from scikit-learn on this machine, which is not "
                             "installed: pip install scikit-learn, or pass --workload-args "
                             "'--data-file PATH-IN-THE-IMAGE'")
        return (["--data-file", f"{DATA_DIR}/digits.csv.gz"],
                [("d.digits.csv.gz", "data/digits.csv.gz", path.read_bytes())],
                [f"data: digits.csv.gz ({path.stat().st_size} bytes, from scikit-learn here) shipped in the ConfigMap"])
    if job.workload == "mnist" and "--data-dir" not in args:
        return (["--data-dir", "/tmp/mnist", "--download"], [],
                ["data: each node downloads MNIST (about 11 MB) into /tmp/mnist: the nodes need internet access"])
    return [], [], []


def _rdzv_timeouts(argv: list[str], start_deadline_s: int) -> list[str]:
    """torchrun's --rdzv-conf with join_timeout and read_timeout set above the start deadline."""
    out = []
    for arg in argv:
        if arg.startswith("--rdzv-conf="):
            conf = dict(kv.split("=", 1) for kv in arg.split("=", 1)[1].split(",") if "=" in kv)
            conf["join_timeout"] = str(start_deadline_s + 2 * RDZV_MARGIN_S)
            conf["read_timeout"] = str(start_deadline_s + RDZV_MARGIN_S)
            arg = "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items())
        out.append(arg)
    return out


def plan_job(
    cluster: Any,
    job: JobSpec,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    image: str | None = None,
    mode: str = "job",
    python: str = "python",
    workdir: str | Path | None = None,
    start_deadline_s: int = DEFAULT_START_DEADLINE_S,
    max_lifetime_s: int | None = None,
) -> Plan:
    """Names, argv per node rank, environment and files for running `job` on `cluster`.

    A user command whose script is a local file under `workdir` (default: the current directory),
    such as `python train.py`, gets its whole folder shipped in the ConfigMap and run from
    `/gpucluster/user/`; anything else in the command must be in the image. Built-in workloads get
    their data (see `_builtin_data`). The Job's `activeDeadlineSeconds` is the cluster's max lifetime
    (or the job's time limit + 10 min when that is shorter): the dead-man switch.
    """
    if mode not in MODES:
        raise UsageError(not_allowed("kubernetes launcher", mode, MODES))
    outputs = dict(getattr(cluster, "outputs", None) or {})
    nodes = len(cluster.nodes) if cluster.nodes else int(outputs.get("nodes") or 0)
    if nodes < 1:
        raise LaunchError(f"cluster {cluster.name!r} has no nodes to run on")
    gpus = int(cluster.gpus_per_node or outputs.get("gpus_per_node") or 0)
    name = dns_name(f"gpucluster-{job.run_id}")
    if mode == "job":
        hosts = tuple(f"{name}-{i}.{name}" for i in range(nodes))
    else:
        hosts = (f"{name}-master-0",) + tuple(f"{name}-worker-{i}" for i in range(nodes - 1))
    data_args, data_files, notes = _builtin_data(job)
    program, user_files = _ship_user_script(program_args(job, workload_dir=WORKLOAD_DIR), Path(workdir or "."))
    program = program + data_args
    argv = tuple(
        tuple(_rdzv_timeouts(torchrun_argv(job, python=python, nnodes=nodes, node_rank=r, rdzv_host=hosts[0],
                                           local_addr=hosts[r], program=program), start_deadline_s))
        for r in range(nodes)
    )
    env = node_env(job, node_rank=0, node_ips=hosts, gpus_per_node=gpus)
    env.pop("GPUCLUSTER_NODE_RANK")  # per pod: from the completion index (and set by entry.py)
    files: list[tuple[str, str, str | bytes]] = [
        ("entry.py", "entry.py", ENTRYPOINT), ("wait.py", "wait.py", WAITER),
        ("argv.json", "argv.json", json.dumps([list(a) for a in argv]))]
    files += _workload_files() + data_files + user_files
    size = _size(files)
    if size > CONFIGMAP_LIMIT:
        raise LaunchError(f"the files to ship take {size} bytes, over the {CONFIGMAP_LIMIT} bytes one Kubernetes "
                          "ConfigMap holds (1 MiB); build an image with them and set the option image")
    if user_files:
        notes.append(f"shipped: the script folder ({len(user_files)} file(s), {_size(user_files)} bytes) "
                     f"as {MOUNT}/user")
    selector = {}
    if outputs.get("accelerator_type"):
        selector["cloud.google.com/gke-accelerator"] = str(outputs["accelerator_type"])
    if outputs.get("node_pool_name"):
        selector["cloud.google.com/gke-nodepool"] = str(outputs["node_pool_name"])
    labels = {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": dns_name(job.run_id, 63),
              JOB_LABEL: name}
    lifetime = int(max_lifetime_s or int(outputs.get("max_lifetime_minutes") or 0) * 60 or DEFAULT_MAX_LIFETIME_S)
    deadline = min(lifetime, int(job.max_seconds) + DEADLINE_MARGIN_S) if job.max_seconds else lifetime
    image = image or DEFAULT_IMAGE
    notes.insert(0, f"image: {image}" + (" (torch only; the built-in workloads need nothing else)"
                                         if image == DEFAULT_IMAGE else ""))
    notes.append(f"pods must run within {start_deadline_s} s (--start-deadline); the Job stops itself after "
                 f"{deadline} s (activeDeadlineSeconds), even without this machine")
    return Plan(
        name=name, namespace=namespace, mode=mode, nodes=nodes, gpus_per_node=gpus,
        image=image, run_id=job.run_id, hosts=hosts, argv_by_rank=argv,
        env=tuple(env.items()), files=tuple(files), labels=tuple(labels.items()),
        node_selector=tuple(selector.items()), rdzv_port=job.rdzv_port, active_deadline_s=deadline,
        start_deadline_s=int(start_deadline_s), notes=tuple(notes),
    )


# -- manifests (the kubernetes client's typed models) ---------------------------------------
def _client():
    return require("kubernetes.client", "gcp")


def config_map_manifest(plan: Plan):
    k = _client()
    return k.V1ConfigMap(
        api_version="v1", kind="ConfigMap",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        data={key: content for key, _, content in plan.files if isinstance(content, str)},
        binary_data={key: base64.b64encode(content).decode() for key, _, content in plan.files
                     if isinstance(content, bytes)} or None,
    )


def service_manifest(plan: Plan):
    """Headless: no virtual IP, one DNS record per pod, published before the pods are ready."""
    k = _client()
    return k.V1Service(
        api_version="v1", kind="Service",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        spec=k.V1ServiceSpec(
            cluster_ip="None",
            selector={JOB_LABEL: plan.name},
            publish_not_ready_addresses=True,
            ports=[k.V1ServicePort(name="rdzv", port=plan.rdzv_port, target_port=plan.rdzv_port)],
        ),
    )


def pod_template(plan: Plan):
    k = _client()
    env = [k.V1EnvVar(name=key, value=value) for key, value in plan.env]
    if plan.mode == "job":
        env.insert(0, k.V1EnvVar(
            name="GPUCLUSTER_NODE_RANK",
            value_from=k.V1EnvVarSource(
                field_ref=k.V1ObjectFieldSelector(field_path=f"metadata.annotations['{INDEX_ANNOTATION}']")
            ),
        ))
    limits = {GPU_RESOURCE: str(plan.gpus_per_node)} if plan.gpus_per_node else None
    container = k.V1Container(
        name=CONTAINER,
        image=plan.image,
        command=["python", f"{MOUNT}/entry.py"],
        env=env,
        ports=[k.V1ContainerPort(name="rdzv", container_port=plan.rdzv_port)],
        resources=k.V1ResourceRequirements(limits=limits),
        volume_mounts=[
            k.V1VolumeMount(name="gpucluster", mount_path=MOUNT, read_only=True),
            k.V1VolumeMount(name="dshm", mount_path="/dev/shm"),  # DataLoader workers share memory
        ],
    )
    init = None
    if plan.mode == "job":  # the operator adds its own waiting init container to PyTorchJob workers
        init = [k.V1Container(
            name="wait-for-peers", image=plan.image,
            command=["python", f"{MOUNT}/wait.py", ",".join(plan.hosts), str(plan.rdzv_port),
                     str(plan.start_deadline_s)],
            env=[e for e in env if e.name == "GPUCLUSTER_NODE_RANK"],
            volume_mounts=[k.V1VolumeMount(name="gpucluster", mount_path=MOUNT, read_only=True)],
        )]
    spec = k.V1PodSpec(
        restart_policy="Never",
        init_containers=init,
        containers=[container],
        tolerations=[k.V1Toleration(key=GPU_TAINT_KEY, operator="Exists", effect="NoSchedule")],
        node_selector=dict(plan.node_selector) or None,
        affinity=k.V1Affinity(pod_anti_affinity=k.V1PodAntiAffinity(
            required_during_scheduling_ignored_during_execution=[k.V1PodAffinityTerm(
                topology_key="kubernetes.io/hostname",
                label_selector=k.V1LabelSelector(match_labels={JOB_LABEL: plan.name}),
            )]
        )),
        volumes=[
            k.V1Volume(name="gpucluster", config_map=k.V1ConfigMapVolumeSource(
                name=plan.name, items=[k.V1KeyToPath(key=key, path=path) for key, path, _ in plan.files],
            )),
            k.V1Volume(name="dshm", empty_dir=k.V1EmptyDirVolumeSource(medium="Memory")),
        ],
        termination_grace_period_seconds=15,
    )
    if plan.mode == "job":
        spec.subdomain = plan.name  # <job>-<index>.<service> resolves to the pod
    return k.V1PodTemplateSpec(metadata=k.V1ObjectMeta(labels=plan.label_dict), spec=spec)


def job_manifest(plan: Plan):
    k = _client()
    return k.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        spec=k.V1JobSpec(
            completion_mode="Indexed",
            completions=plan.nodes,
            parallelism=plan.nodes,
            backoff_limit=0,
            active_deadline_seconds=plan.active_deadline_s,
            ttl_seconds_after_finished=TTL_AFTER_FINISHED_S,
            template=pod_template(plan),
        ),
    )


def pytorchjob_manifest(plan: Plan) -> dict[str, Any]:
    """A Kubeflow PyTorchJob (training operator, kubeflow.org/v1): Master + (nodes-1) Workers."""
    k = _client()
    template = k.ApiClient().sanitize_for_serialization(pod_template(plan))
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if plan.nodes > 1:
        replicas["Worker"] = {"replicas": plan.nodes - 1, "restartPolicy": "Never", "template": template}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "All", "backoffLimit": 0,
                                  "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S}
    if plan.active_deadline_s:
        run_policy["activeDeadlineSeconds"] = plan.active_deadline_s
    return {
        "apiVersion": f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": plan.name, "namespace": plan.namespace, "labels": plan.label_dict},
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def rank_of(pod: Any, plan: Plan) -> int | None:
    """The node rank of one of the job's pods, or None for a pod that is not one of ours."""
    meta = pod.metadata
    if plan.mode == "job":
        value = (meta.annotations or {}).get(INDEX_ANNOTATION) or (meta.labels or {}).get(INDEX_ANNOTATION)
        return int(value) if value is not None and str(value).isdigit() else None
    labels = meta.labels or {}
    kind = (labels.get("training.kubeflow.org/replica-type") or "").lower()
    index = labels.get("training.kubeflow.org/replica-index")
    if index is None or not str(index).isdigit():
        return None
    return 0 if kind == "master" else int(index) + 1 if kind == "worker" else None


# -- API access --------------------------------------------------------------------------------
@dataclass
class KubeApi:
    """The three API groups the launcher calls (CoreV1Api, BatchV1Api, CustomObjectsApi or fakes)."""

    core: Any
    batch: Any
    custom: Any

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None) -> "KubeApi":
        """From a kubeconfig text (the GKE stack's secret output), else ~/.kube/config."""
        k8s = require("kubernetes", "gcp")
        import yaml

        try:
            if kubeconfig:
                api_client = k8s.config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
            else:
                api_client = k8s.config.new_client_from_config()
        except Exception as exc:  # the loaders raise ConfigException, YAMLError, OSError, ...
            raise LaunchError(f"cannot use the cluster's kubeconfig: {exc}") from None
        return cls(k8s.client.CoreV1Api(api_client), k8s.client.BatchV1Api(api_client),
                   k8s.client.CustomObjectsApi(api_client))

    @classmethod
    def from_gke(cls, kubeconfig: str, *, credentials: Any = None) -> "KubeApi":
        """From the GKE stack's kubeconfig (server and CA only) with a bearer token from Google
        application-default credentials (google-auth), refreshed before it expires. No gcloud and no
        `gke-gcloud-auth-plugin` are needed; the kubeconfig's exec entry is for kubectl users."""
        k8s = require("kubernetes", "gcp")
        import yaml

        from gpucluster.infra.gcp.access import bearer_token_hook, google_credentials

        try:
            config = yaml.safe_load(kubeconfig)
            cluster = config["clusters"][0]["cluster"]
            server, ca = cluster["server"], cluster.get("certificate-authority-data")
        except Exception as exc:  # noqa: BLE001 - YAMLError, KeyError, TypeError, ...
            raise LaunchError(f"cannot read the cluster's kubeconfig: {exc!r}") from None
        credentials = google_credentials(credentials)  # fails here, as one line, when ADC is missing
        configuration = k8s.client.Configuration()
        configuration.host = server
        if ca:
            configuration.ssl_ca_cert = _ca_file(ca)
        configuration.api_key = {"authorization": credentials.token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        configuration.refresh_api_key_hook = bearer_token_hook(credentials)
        api_client = k8s.client.ApiClient(configuration)
        return cls(k8s.client.CoreV1Api(api_client), k8s.client.BatchV1Api(api_client),
                   k8s.client.CustomObjectsApi(api_client))


_CA_FILES: list[str] = []


def _ca_file(ca_base64: str) -> str:
    """The cluster CA (base64 PEM, as in a kubeconfig) in a private temporary file, removed at exit."""
    import atexit
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix="gpucluster-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(ca_base64))
    if not _CA_FILES:
        atexit.register(lambda: [os.path.exists(p) and os.unlink(p) for p in _CA_FILES])
    _CA_FILES.append(path)
    return path


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _is_api_error(exc: BaseException) -> bool:
    """ApiException (status + reason) or a urllib3 connection error (reason)."""
    return _status(exc) is not None or hasattr(exc, "reason")


def _lines(response: Any) -> Iterator[bytes]:
    """Whole lines (with their newline) from a streamed log response that yields byte chunks."""
    buffer = b""
    try:
        try:
            for chunk in response.stream():
                if isinstance(chunk, str):
                    chunk = chunk.encode()
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield line + b"\n"
        except Exception:  # the stream breaks when the pod is deleted: the log simply ends
            pass
        if buffer:
            yield buffer
    finally:
        for method in ("release_conn", "close"):
            try:
                getattr(response, method)()
            except Exception:
                pass


class _Pods:
    """The job's pods by node rank, refreshed at most every `poll_interval` seconds."""

    def __init__(self, api: KubeApi, plan: Plan, supervisor: NodeSupervisor, poll_interval: float):
        self.api, self.plan, self.supervisor = api, plan, supervisor
        self.poll_interval = poll_interval
        self.exit_codes: dict[int, int] = {}
        self.reasons: dict[int, str] = {}
        self.pod_names: dict[int, str] = {}
        self.attached: set[int] = set()
        self.list_errors = 0
        self.pending: dict[int, str] = {}  # rank -> why its pod is not scheduled (no GPU node free, ...)
        self._last = float("-inf")
        self.started_at: float | None = None  # when the Job was created (the start deadline counts from it)

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self._last < self.poll_interval:
            return
        self._last = now
        try:
            pods = self.api.core.list_namespaced_pod(self.plan.namespace, label_selector=self.plan.selector).items
        except Exception as exc:
            if not _is_api_error(exc):
                raise
            # A control-plane blip (GKE upgrades the master in place) is not a failed run; a run of them is.
            self.list_errors += 1
            if self.list_errors >= MAX_LIST_ERRORS:
                raise LaunchError(f"lost the Kubernetes API while watching the job's pods: {exc}") from None
            return
        self.list_errors = 0
        current: dict[int, Any] = {}
        for pod in pods:
            rank = rank_of(pod, self.plan)
            if rank is not None and 0 <= rank < self.plan.nodes:
                current[rank] = pod
        for rank, pod in current.items():
            self.pod_names[rank] = pod.metadata.name
            self._observe(rank, pod)
        self._check_start_deadline(current, now)
        for rank in set(self.pod_names) - set(current):
            if rank not in self.exit_codes:
                self.exit_codes[rank] = -1
                self.reasons[rank] = (f"pod {self.pod_names[rank]} disappeared (deleted, evicted, or its "
                                      "node was preempted)")

    def _observe(self, rank: int, pod: Any) -> None:
        status = pod.status
        phase = getattr(status, "phase", None)
        state = None
        for cs in getattr(status, "container_statuses", None) or []:
            if cs.name == CONTAINER:
                state = cs.state
        running = state is not None and (state.running is not None or state.terminated is not None)
        if rank not in self.attached and (running or phase in ("Running", "Succeeded", "Failed")):
            self.attached.add(rank)
            self.supervisor.attach(rank, self._log_stream(pod.metadata.name))
        self.pending.pop(rank, None)
        for cond in getattr(status, "conditions", None) or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                self.pending[rank] = f"pod {pod.metadata.name} not scheduled: {cond.reason}: {cond.message}"
        if rank in self.exit_codes:
            return
        terminated = state.terminated if state is not None else None
        waiting = state.waiting if state is not None else None
        if phase == "Succeeded":
            self.exit_codes[rank] = 0
        elif phase == "Failed":
            code = terminated.exit_code if terminated is not None and terminated.exit_code is not None else 1
            self.exit_codes[rank] = code if code != 0 else 1
            reason = (terminated.reason if terminated is not None else None) or getattr(status, "reason", None)
            self.reasons[rank] = f"pod {pod.metadata.name} failed" + (f" ({reason})" if reason else "")
        elif waiting is not None and waiting.reason in FATAL_WAITING:
            self.exit_codes[rank] = -1
            self.reasons[rank] = f"pod {pod.metadata.name} cannot start: {waiting.reason}: {waiting.message or ''}".rstrip(": ")

    def _check_start_deadline(self, current: dict[int, Any], now: float) -> None:
        """Past the start deadline, every rank whose container is not running fails with the
        scheduler's reason, read from its pod's events (FailedScheduling, NotTriggerScaleUp, ...)."""
        if self.started_at is None or now - self.started_at < self.plan.start_deadline_s:
            return
        for rank in range(self.plan.nodes):
            if rank in self.attached or rank in self.exit_codes:
                continue
            pod = current.get(rank)
            name = pod.metadata.name if pod is not None else None
            why = self._events_reason(name) if name else "the Job made no pod for it"
            why = why or self.pending.get(rank) or "no reason reported"
            self.exit_codes[rank] = -1
            self.reasons[rank] = (f"pod {name or f'rank {rank}'} not running after the {self.plan.start_deadline_s} s "
                                  f"start deadline: {why}")

    def _events_reason(self, pod_name: str) -> str | None:
        try:
            events = self.api.core.list_namespaced_event(
                self.plan.namespace, field_selector=f"involvedObject.name={pod_name}").items
        except Exception as exc:
            if not _is_api_error(exc):
                raise
            return None
        warnings = [e for e in events if getattr(e, "type", None) == "Warning"] or list(events)
        if not warnings:
            return None
        last = max(warnings, key=lambda e: str(getattr(e, "last_timestamp", None) or getattr(e, "event_time", None)
                                                or ""))
        return f"{last.reason}: {last.message}"

    def _log_stream(self, pod_name: str) -> Iterable[bytes]:
        try:
            response = self.api.core.read_namespaced_pod_log(
                pod_name, self.plan.namespace, container=CONTAINER, follow=True, _preload_content=False
            )
        except Exception as exc:  # e.g. 400 when the container never started: no log to show
            return [f"[gpucluster] no log for pod {pod_name}: {exc}\n".encode()]
        return _lines(response)


class _PodHandle:
    """Popen-like view of one node's pod, for NodeSupervisor.run."""

    def __init__(self, pods: _Pods, rank: int):
        self.pods, self.rank = pods, rank

    def poll(self) -> int | None:
        self.pods.refresh()
        return self.pods.exit_codes.get(self.rank)

    @property
    def returncode(self) -> int | None:
        return self.pods.exit_codes.get(self.rank)


@dataclass
class _Created:
    """What the launch asked the API server to create, recorded before each request."""

    api: KubeApi
    plan: Plan
    kinds: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False

    def delete_all(self) -> None:
        if self.done:
            return
        self.done = True
        k = _client()
        ns, name = self.plan.namespace, self.plan.name
        delete = {
            "job": lambda: self.api.batch.delete_namespaced_job(
                name, ns, body=k.V1DeleteOptions(propagation_policy="Foreground")),
            "pytorchjob": lambda: self.api.custom.delete_namespaced_custom_object(
                KUBEFLOW_GROUP, KUBEFLOW_VERSION, ns, KUBEFLOW_PLURAL, name,
                body=k.V1DeleteOptions(propagation_policy="Foreground")),
            "service": lambda: self.api.core.delete_namespaced_service(name, ns),
            "configmap": lambda: self.api.core.delete_namespaced_config_map(name, ns),
        }
        for kind in reversed(self.kinds):  # the workload first, what it uses last
            try:
                delete[kind]()
            except Exception as exc:
                if _status(exc) != 404:
                    self.errors.append(f"{kind} {ns}/{name}: {exc}")


class KubernetesLauncher:
    """`Launcher` for clusters reached through the Kubernetes API (GKE)."""

    def __init__(
        self,
        *,
        api: KubeApi | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        image: str | None = None,
        mode: str = "job",
        poll_interval: float = 2.0,
        start_deadline_s: int = DEFAULT_START_DEADLINE_S,
        credentials: Any = None,
    ):
        if mode not in MODES:
            raise UsageError(not_allowed("kubernetes launcher", mode, MODES))
        if isinstance(start_deadline_s, bool) or not isinstance(start_deadline_s, (int, float)) or not (
                30 <= start_deadline_s <= 24 * 3600):
            raise UsageError(not_allowed("start deadline (seconds)", start_deadline_s, "30 to 86400"))
        self.start_deadline_s = int(start_deadline_s)
        self.credentials = credentials
        self.api = api
        self.namespace = namespace
        self.image = image
        self.mode = mode
        self.poll_interval = poll_interval
        self.cleanup_errors: list[str] = []

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **kw: Any) -> "KubernetesLauncher":
        """From a spec's options: `launcher` (job|pytorchjob), `image`, `namespace`."""
        mode = str(options.get("launcher") or "job").strip().lower()
        return cls(mode=mode, image=options.get("image") or None,
                   namespace=options.get("namespace") or DEFAULT_NAMESPACE, **kw)

    def describe(self, spec: Any, job: JobSpec) -> list[str]:
        """The plan's Kubernetes lines (image, data, what is shipped, deadlines), computed from the
        spec before anything exists; raises the same errors `launch` would (a missing data file, a
        script folder over the ConfigMap limit) so they come before anything is created."""
        from types import SimpleNamespace

        cluster = SimpleNamespace(name=spec.name, nodes=(), gpus_per_node=spec.gpus_per_node or 1,
                                  outputs={"nodes": spec.nodes, "max_lifetime_minutes": spec.max_lifetime_minutes})
        plan = plan_job(cluster, job, namespace=self.namespace, image=self.image, mode=self.mode,
                        start_deadline_s=self.start_deadline_s)
        return list(plan.notes)

    def launch(self, cluster: Any, job: JobSpec, events: LaunchEvents, log_dir: Path) -> JobResult:
        plan = plan_job(cluster, job, namespace=self.namespace, image=self.image, mode=self.mode,
                        start_deadline_s=self.start_deadline_s)
        api = self.api or self._api_for(cluster)
        supervisor = NodeSupervisor(job, events, Path(log_dir), plan.hosts)
        pods = _Pods(api, plan, supervisor, self.poll_interval)
        created = _Created(api, plan)
        try:
            self._create(api, plan, created)
            pods.started_at = time.monotonic()
            handles = {rank: _PodHandle(pods, rank) for rank in range(plan.nodes)}
            result = supervisor.run(handles, stop=created.delete_all)
        finally:
            created.delete_all()
            self.cleanup_errors = list(created.errors)
        if result.failed_node is not None and result.failed_node in pods.reasons:
            result.failure = f"{result.failure}: {pods.reasons[result.failed_node]}"
        if result.timed_out and pods.pending:
            result.failure = f"{result.failure}; {pods.pending[min(pods.pending)]}"
        return result

    def _api_for(self, cluster: Any) -> KubeApi:
        kubeconfig = getattr(cluster, "kubeconfig", None)
        if kubeconfig:  # a GKE stack's kubeconfig: a bearer token from Google credentials
            from gpucluster.infra.gcp.access import GcpAuthError

            try:
                return KubeApi.from_gke(kubeconfig, credentials=self.credentials)
            except GcpAuthError as exc:
                raise LaunchError(f"cannot authenticate to the GKE cluster: {exc.message}", hint=exc.hint) from None
        return KubeApi.from_kubeconfig(kubeconfig)

    def _create(self, api: KubeApi, plan: Plan, created: _Created) -> None:
        ns = plan.namespace
        steps = [("configmap", lambda: api.core.create_namespaced_config_map(ns, config_map_manifest(plan)))]
        if plan.mode == "job":
            steps += [
                ("service", lambda: api.core.create_namespaced_service(ns, service_manifest(plan))),
                ("job", lambda: api.batch.create_namespaced_job(ns, job_manifest(plan))),
            ]
        else:
            steps.append(("pytorchjob", lambda: api.custom.create_namespaced_custom_object(
                KUBEFLOW_GROUP, KUBEFLOW_VERSION, ns, KUBEFLOW_PLURAL, pytorchjob_manifest(plan))))
        for kind, create in steps:
            created.kinds.append(kind)  # before the request: an interrupted call may still succeed
            try:
                create()
            except Exception as exc:
                if not _is_api_error(exc):
                    raise
                if _status(exc) is None:
                    raise LaunchError(f"cannot reach the Kubernetes API to create {kind} {ns}/{plan.name}: "
                                      f"{exc}") from None
                if _status(exc) == 401:
                    raise LaunchError(
                        f"the Kubernetes API refused gpucluster's credentials creating {kind} {ns}/{plan.name} "
                        "(401 Unauthorized)",
                        hint="run `gcloud auth application-default login` (the token comes from "
                             "application-default credentials)") from None
                if _status(exc) == 403:
                    raise LaunchError(
                        f"the Kubernetes API forbade creating {kind} {ns}/{plan.name} (403 Forbidden)",
                        hint="the application-default account needs roles/container.developer on the project"
                    ) from None
                hint = (" (is the Kubeflow training operator installed?)"
                        if kind == "pytorchjob" and _status(exc) == 404 else "")
                raise LaunchError(f"kubernetes refused to create {kind} {ns}/{plan.name}: "
                                  f"{_status(exc)} {getattr(exc, 'reason', '')}{hint}") from None
