"""The plan of a Kubernetes run: what each pod runs and what the ConfigMap carries.

`plan_job(cluster, job, ...) -> Plan`: the torchrun argv of every node rank (built with
`gpucluster.watch.launch.torchrun_argv`, so the c10d flags, `is_host` on rank 0 and the run id are the
same as on the other backends, with c10d timeouts above the start deadline), the files mounted at
`/gpucluster` (the built-in workloads, the user's script folder, built-in data, the standard-library
entry script `pod_entry.py` that picks its argv by node rank and runs torchrun, waiting for the
outputs copy, and `pod_wait.py`), and
the names, image, namespace, mode and deadlines. Refused here, before anything is created: a bad
mode, a ConfigMap over the API server's 1 MiB. What the cluster's provider adds (node selector, pod
requests, object-storage identity, wording) comes from the `Platform` given (gcp: `infra.gcp.gke`).
The model is described in `infra.kubernetes.launcher`; the manifests built from a plan are in
`infra.kubernetes.manifests`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gpucluster.domain import Cluster
from gpucluster.errors import LaunchError, UsageError, not_allowed
from gpucluster.spec import dns_label
from gpucluster.states import JsonMapping
from gpucluster.watch.launch import PG_HOOK_DIR, JobSpec, node_env, pg_hook_file, program_args, torchrun_argv
from gpucluster.node import workdir as workdir_module
from gpucluster.watch.staging import GO_FILE, DataMount, setup_wrapped, staged_env, staged_mounts

from .platform import GENERIC, Platform
from .pod_entry import STOP_GRACE_S  # noqa: F401 - SIGTERM to torchrun's group, then SIGKILL

# A public PyTorch image (docker.io/pytorch/pytorch, Python 3.11) whose CUDA 12.4 build still
# targets the V100 (compute capability 7.0) and runs on the driver GKE installs (LATEST/DEFAULT).
# Tag chosen 2026-11-22; the option `image` replaces it.
DEFAULT_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
DEFAULT_NAMESPACE = "default"
MODES = ("job", "pytorchjob", "trainjob")
MOUNT = "/gpucluster"
WORKLOAD_DIR = f"{MOUNT}/workloads"
CONTAINER = "pytorch"  # the name the Kubeflow operator requires; used by both modes
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_GROUP, KUBEFLOW_VERSION, KUBEFLOW_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
# Kubeflow Trainer v2 (kubeflow/trainer v2.3.0, pkg/apis/trainer/v1alpha1): a TrainJob on the torch
# ClusterTrainingRuntime of Trainer's manifests (manifests/base/runtimes/torch_distributed.yaml), whose
# one trainer ReplicatedJob and container are both named "node" (pkg/constants/constants.go `Node`);
# the Trainer makes a JobSet of it (JobSet v1alpha2, kubernetes-sigs/jobset).
TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
RUNTIME_PLURAL, TORCH_RUNTIME, TRAINER_NODE = "clustertrainingruntimes", "torch-distributed", "node"
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
CONFIGMAP_LIMIT = 1_000_000  # bytes; the API server refuses ConfigMaps over 1 MiB
JOB_LABEL = "gpucluster-job"
CLUSTER_LABEL = "gpucluster-cluster"  # a shared namespace (Platform.shared): the cluster a run is on
TTL_AFTER_FINISHED_S = 3600
# How long every pod of the job may take to be running (GPU node creation by the autoscaler, driver
# installation, image pull); past it the run fails with the scheduler's reason. `--start-deadline`.
DEFAULT_START_DEADLINE_S = 20 * 60
# c10d timeouts, set explicitly above the start deadline (torchrun's defaults: join_timeout 600 s,
# read_timeout 60 s; a non-head agent gave up after 77-121 s in our measurements).
RDZV_MARGIN_S = 300
DEFAULT_MAX_LIFETIME_S = 240 * 60
# Outputs (collected when the job has an output folder): an emptyDir per pod holds the node's
# output folder (GPUCLUSTER_OUTPUT_DIR) and the control folder of the entry script's handshake.
RUN_DIR = "/gpucluster-run"
OUTPUT_DIR = f"{RUN_DIR}/outputs"
CONTROL_DIR = f"{RUN_DIR}/control"
STOP_FILE, COLLECTED_FILE = f"{CONTROL_DIR}/stop", f"{CONTROL_DIR}/collected"
EXIT_CODE_FILE = f"{CONTROL_DIR}/exit_code"  # torchrun's exit code, written by the entry script as it ends
# A shipped user script runs from a writable copy of its folder in the run folder, as on ssh (the
# ConfigMap volume is read-only): what the job writes beside it (newer than SHIPPED_MARK) comes back.
CODE_DIR, SHIPPED_MARK = f"{RUN_DIR}/code", f"{RUN_DIR}/shipped"
# The pod's second container (pod_keeper.py): keeps the pod running for exec once torchrun has ended,
# so the training container's status gives the node's exit code; every exec goes to it.
KEEPER = "gpucluster"
# --setup: each rank's argv is `gpucluster.watch.staging.setup_wrapped` around torchrun (the same wrapper,
# records and wording as on ssh/local); it waits for this file, made by the launcher through exec
# once every pod's setup_end record said rc 0. The emptyDir at RUN_DIR is mounted for it.
SETUP_GO_FILE = f"{CONTROL_DIR}/{GO_FILE}"
# --data / --resume: staged into each pod by the launcher through exec while the pod runs
# (`infra.kubernetes.stage`): a folder DEST lands at RUN_DIR/DEST (the emptyDir); local folders go
# through a content-addressed cache on the GPU node itself (a hostPath volume, so a rerun on a kept
# cluster sends only what that node lacks); each rank's argv waits for STAGED_FILE first.
STAGED_FILE = f"{CONTROL_DIR}/staged"
# the health check (gpucluster/node/node_check.py), shipped in the ConfigMap as MOUNT/CHECK_FILE (check)
CHECK_FILE = "node_check.py"
CACHE_MOUNT = "/gpucluster-cache"
CACHE_HOST_PATH = "/var/lib/gpucluster/data-cache"  # on the node's boot disk (COS: /var is writable)
JOB_END_KIND = "job_end"  # the entry script's metric record: torchrun ended, with its exit code
DEFAULT_COLLECT_WAIT_S = 1800  # how long a pod whose torchrun ended waits to be copied from
DATA_DIR = f"{MOUNT}/data"
# One file of the ConfigMap: (its key, its path under MOUNT, its text or bytes)
ShippedFile = tuple[str, str, str | bytes]

# The programs the pods run are files of this package, shipped by content in the ConfigMap: the app
# container's entry script (`pod_entry.py`, as /gpucluster/entry.py: picks this node's argv by rank and
# runs it, with the outputs handshake) and `pod_wait.py` (as /gpucluster/wait.py: the init container's
# wait for every pod's DNS record, and, before torchrun on the other ranks, the wait for the head's
# rendezvous port).
def program_text(name: str) -> str:
    """The text of one of the pods' programs (a file beside this module)."""
    return Path(__file__).with_name(name).read_text()


ENTRYPOINT = program_text("pod_entry.py")
WAITER = program_text("pod_wait.py")
KEEPER_PROGRAM = program_text("pod_keeper.py")


def dns_name(text: str, limit: int = 52) -> str:
    """A DNS-1035 label from `text`, short enough that `<name>-<index>` and `<name>-worker-<index>`
    stay within 63 characters."""
    return dns_label(text, limit, prefix="g-")


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
    files: tuple[ShippedFile, ...]  # (ConfigMap key, path under MOUNT, text or bytes)
    labels: tuple[tuple[str, str], ...]
    node_selector: tuple[tuple[str, str], ...] = ()
    rdzv_port: int = 29400
    active_deadline_s: int | None = None
    start_deadline_s: int = DEFAULT_START_DEADLINE_S
    run_limit_s: int | None = None  # when the launcher stops the training itself (--max-minutes, or the lifetime's)
    notes: tuple[str, ...] = ()  # what the plan tells the user (image, data, what is shipped)
    collects: bool = False  # outputs are copied out of the pods (the entry script waits for it)
    setup: bool = False  # --setup: each argv is the setup wrapper, released by SETUP_GO_FILE
    stages: bool = False  # --data/--resume: each argv waits for STAGED_FILE (stage)
    cache: bool = False  # a local folder is staged: the node's cache is mounted (hostPath)
    service_account: str | None = None  # pods run as this Kubernetes service account (object storage)
    secrets: tuple[str, ...] = ()  # --secret names: env from the run's own Secret `<name>` (values never here)
    requests: tuple[tuple[str, str], ...] = ()  # the training container's CPU and memory requests
    code: bool = False  # a user's script folder is shipped: the job runs from its copy at CODE_DIR
    keeper_env: tuple[tuple[str, str], ...] = ()  # the keeper container's environment
    checks: bool = False  # the health check runs in every pod first: each argv waits for STAGED_FILE (check)

    @property
    def run_dir(self) -> bool:
        """Whether each pod gets the emptyDir at RUN_DIR (outputs, control files, staged data, the
        script's working copy), and with it the keeper container."""
        return self.collects or self.setup or self.stages or self.code or self.checks or self.mode == "trainjob"

    @property
    def app_container(self) -> str:
        """The training container: the runtime's `node` for a TrainJob (its container must keep that name)."""
        return TRAINER_NODE if self.mode == "trainjob" else CONTAINER

    @property
    def exec_container(self) -> str:
        """The container exec calls go to: the keeper when there is one (it outlives torchrun); a
        TrainJob's pod has only the runtime's container (a runtime patch may not add one), which keeps
        itself running (pod_entry.py, GPUCLUSTER_SELF_KEEP)."""
        return KEEPER if self.run_dir and self.mode != "trainjob" else self.app_container

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


def _size(files: Iterable[ShippedFile]) -> int:
    return sum(len(c if isinstance(c, bytes) else c.encode()) for _, _, c in files)


def _folder_files(folder: Path) -> tuple[list[Path], int, int]:
    """The script folder's files that go into the ConfigMap (`gpucluster.plan.shipping`: .gitignore and
    .gpuclusterignore honoured; here also hidden files and links left out), how many the ignore
    files left out, and their size in bytes as listed."""
    from gpucluster.plan.shipping import shipment

    ship = shipment(folder, skip_hidden=True)
    kept = [e for e in ship.entries if not e.link]
    return [folder / e.rel for e in kept], ship.ignored, sum(e.size for e in kept)


def _too_big(folder: Path, size: int) -> LaunchError:
    return LaunchError(
        f"the script folder {folder} takes {size} bytes, over the {CONFIGMAP_LIMIT} bytes one Kubernetes "
        "ConfigMap holds (1 MiB): put the script in a folder of its own, keep data out of it (download it "
        "on the nodes), or build an image with it and set the option image")


def _ship_user_script(program: list[str], workdir: Path
                      ) -> tuple[list[str], list[ShippedFile], int]:
    """Ship the command's script folder when the script is a local .py file below `workdir`: every
    file of the script's folder (hidden files, caches and virtualenvs left out) goes into the
    ConfigMap under /gpucluster/user/; the entry script copies it to CODE_DIR (writable) and the
    command runs from there, with the script's path rewritten. The listed sizes are checked
    against the ConfigMap's bound before any file is read (a script in a large folder is refused,
    not read into memory); a file gone since the listing is left out, one that cannot be read
    refused in one line."""
    if not program or program[0] in ("-m", "--no-python"):
        return program, [], 0
    script = Path(program[0])
    if script.is_absolute() or ".." in script.parts or script.suffix != ".py":
        return program, [], 0
    local = workdir / script
    if not local.is_file():
        return program, [], 0
    folder = local.parent
    files: list[ShippedFile] = []
    paths, ignored, listed = _folder_files(folder)
    if listed > CONFIGMAP_LIMIT:
        raise _too_big(folder, listed)
    for i, path in enumerate(paths):
        rel = path.relative_to(workdir).as_posix()
        try:
            with open(path, "rb") as f:
                data = f.read(CONFIGMAP_LIMIT + 1)  # a file that grew since the listing stays bounded
        except FileNotFoundError:
            continue  # removed since the listing: nothing to ship
        except OSError as exc:
            raise LaunchError(f"the script folder's file {path} cannot be read ({exc.strerror or exc}): "
                              "make it readable, or leave it out with .gpuclusterignore") from None
        try:
            content: str | bytes = data.decode()
        except UnicodeDecodeError:
            content = data
        # ConfigMap keys: [-._a-zA-Z0-9]+, at most 253 characters; the path is in the volume item
        key = f"u{i:04d}." + re.sub(r"[^-._a-zA-Z0-9]", "_", path.name)[:200]
        files.append((key, f"user/{rel}", content))
    size = _size(files)
    if size > CONFIGMAP_LIMIT:
        raise _too_big(folder, size)
    return [f"{CODE_DIR}/{script.as_posix()}", *program[1:]], files, ignored


def _builtin_data(job: JobSpec) -> tuple[list[str], list[ShippedFile], list[str]]:
    """(extra workload arguments, files, notes) so a built-in workload runs on an image that has only
    torch: digits gets the digits.csv.gz shipped in gpucluster.workloads (57 KB) in the ConfigMap;
    mnist downloads its IDX files on each node."""
    args = list(job.workload_args)
    if job.command or not job.workload:
        return [], [], []
    if job.workload == "digits" and "--data-file" not in args:
        from gpucluster.workloads.digits_data import local_digits_file

        found = local_digits_file()
        if found is None:
            raise UsageError("the digits workload's data file is missing from this gpucluster install (reinstall "
                             "it), or pass --workload-args '--data-file PATH-IN-THE-IMAGE'")
        path = Path(found)
        return (["--data-file", f"{DATA_DIR}/digits.csv.gz"],
                [("d.digits.csv.gz", "data/digits.csv.gz", path.read_bytes())],
                [f"data: digits.csv.gz ({path.stat().st_size} bytes, shipped with gpucluster) sent in the ConfigMap"])
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


@dataclass(frozen=True)
class _Options:
    """What `plan_job` was asked for, beside the cluster and the job."""

    namespace: str
    mode: str
    python: str
    start_deadline_s: int
    collect_wait_s: int
    service_account: str | None
    platform: Platform


@dataclass
class _Parts:
    """What the steps of `plan_job` build, in the order they build it."""

    name: str
    hosts: tuple[str, ...]
    mounts: tuple[DataMount, ...]
    checks: bool  # the health check runs in every pod before the job (check)
    collects: bool
    user_files: list[ShippedFile]
    ignored: int
    notes: list[str]
    argv: tuple[tuple[str, ...], ...] = ()

    @property
    def code(self) -> bool:
        return bool(self.user_files)


def _cluster_size(cluster: Cluster, outputs: JsonMapping) -> tuple[int, int]:
    """(nodes, GPUs per node) of the cluster: its nodes, else its provider's outputs."""
    nodes = len(cluster.nodes) if cluster.nodes else int(outputs.get("nodes") or 0)
    if nodes < 1:
        raise LaunchError(f"cluster {cluster.name!r} has no nodes to run on")
    return nodes, int(cluster.gpus_per_node or outputs.get("gpus_per_node") or 0)


def _hosts(name: str, nodes: int, mode: str) -> tuple[str, ...]:
    """The pods' stable DNS names, node rank order."""
    if mode == "job":
        return tuple(f"{name}-{i}.{name}" for i in range(nodes))
    if mode == "trainjob":  # JobSet: child Job <jobset>-<replicatedJob>-<index>, subdomain <jobset> (its Service)
        return tuple(f"{name}-{TRAINER_NODE}-0-{i}.{name}" for i in range(nodes))
    return (f"{name}-master-0",) + tuple(f"{name}-worker-{i}" for i in range(nodes - 1))


def _argv(job: JobSpec, opts: _Options, parts: _Parts, program: list[str]) -> tuple[tuple[str, ...], ...]:
    """Every node rank's argv: torchrun (c10d timeouts above the start deadline), behind the waits for
    the head's rendezvous port and the DNS records, and the setup/staging wrapper."""
    hosts, python, deadline = parts.hosts, opts.python, opts.start_deadline_s
    argv = tuple(
        tuple(_rdzv_timeouts(torchrun_argv(job, python=python, nnodes=len(hosts), node_rank=r, rdzv_host=hosts[0],
                                           local_addr=hosts[r], program=program), deadline))
        for r in range(len(hosts))
    )
    if opts.mode in ("job", "trainjob"):  # off the head: torchrun starts once the head's rendezvous port answers
        argv = tuple(a if r == 0 else (python, f"{MOUNT}/wait.py", "rendezvous", hosts[0], str(job.rdzv_port),
                                       str(int(deadline)), "--", *a) for r, a in enumerate(argv))
    if opts.mode == "trainjob":  # no init container can be added to the runtime's pod: every DNS record first, here
        argv = tuple((python, f"{MOUNT}/wait.py", "dns", ",".join(hosts), str(job.rdzv_port),
                      str(int(deadline)), "--", *a) for a in argv)
    staged = parts.mounts or parts.checks
    if job.setup or staged:
        argv = tuple(tuple(setup_wrapped(a, job.setup, SETUP_GO_FILE, STAGED_FILE if staged else None))
                     for a in argv)
    return argv


def _env(job: JobSpec, opts: _Options, parts: _Parts, gpus: int) -> tuple[dict[str, str], dict[str, str]]:
    """(the training container's environment, the keeper container's)."""
    env = node_env(job, node_rank=0, node_ips=parts.hosts, gpus_per_node=gpus,
                   output_dir=OUTPUT_DIR if parts.collects else None, pg_hook=f"{MOUNT}/{PG_HOOK_DIR}")
    env.pop("GPUCLUSTER_NODE_RANK")  # per pod: from the completion index (and set by entry.py)
    env.update(staged_env(job, [f"{RUN_DIR}/{staged_rel(m.dest, parts.code)}" for m in parts.mounts]))
    keeper_env: dict[str, str] = {}
    if (parts.collects or job.setup or parts.mounts or parts.code or parts.checks
            or opts.mode == "trainjob"):  # the run folder, and the keeper
        env.update(GPUCLUSTER_CONTROL_DIR=CONTROL_DIR)
        keeper_env = {"GPUCLUSTER_CONTROL_DIR": CONTROL_DIR,
                      "GPUCLUSTER_COLLECT_WAIT_S": str(int(opts.collect_wait_s)),
                      "GPUCLUSTER_COLLECTING": "1" if parts.collects else "0"}
    if opts.mode == "trainjob":  # the JobSet webhook makes the pods restartPolicy OnFailure (jobset_webhook.go
        # Default): a container that exits non-zero is rerun in place, torchrun with it; so the entry script
        # keeps the container itself, as the keeper would, and exits 0 (the node's code is its job_end record)
        env.update({k: v for k, v in keeper_env.items() if k != "GPUCLUSTER_CONTROL_DIR"}, GPUCLUSTER_SELF_KEEP="1")
    if parts.code:
        env.update(GPUCLUSTER_CODE_DIR=CODE_DIR, GPUCLUSTER_SHIPPED_MARK=SHIPPED_MARK)
    return env, keeper_env


def _files(job: JobSpec, opts: _Options, parts: _Parts, keeper: bool, data_files: list[ShippedFile],
           extra_files: Iterable[ShippedFile]) -> list[ShippedFile]:
    """The ConfigMap's files, refused over its 1 MiB."""
    files: list[ShippedFile] = [
        ("entry.py", "entry.py", ENTRYPOINT), ("wait.py", "wait.py", WAITER),
        ("argv.json", "argv.json", json.dumps([list(a) for a in parts.argv]))]
    if keeper and opts.mode != "trainjob":  # a TrainJob's pod has no keeper: its entry script keeps it
        files.append(("keeper.py", "keeper.py", KEEPER_PROGRAM))
    # chooses what the job wrote (copy back); --resume's lay-back
    if parts.code and (parts.collects or job.resume_files):
        files.append(("workdir.py", "workdir.py", Path(workdir_module.__file__).read_text()))
    if parts.checks:
        from gpucluster.watch.health import PROGRAM as CHECK_PROGRAM

        files.append((CHECK_FILE, CHECK_FILE, CHECK_PROGRAM.read_text()))
    if job.command:  # whether a rank joined a process group (gpucluster/node/node_pghook.py, found first by the workers)
        files.append(("pghook.sitecustomize.py", f"{PG_HOOK_DIR}/sitecustomize.py", pg_hook_file().read_text()))
    files += _workload_files() + data_files + parts.user_files + list(extra_files)
    size = _size(files)
    if size > CONFIGMAP_LIMIT:
        raise LaunchError(f"the files to ship take {size} bytes, over the {CONFIGMAP_LIMIT} bytes one Kubernetes "
                          "ConfigMap holds (1 MiB); build an image with them and set the option image")
    return files


def _shipped_note(job: JobSpec, parts: _Parts) -> str:
    """What the plan says of a shipped script folder."""
    left = f", {parts.ignored} left out by .gitignore/.gpuclusterignore" if parts.ignored else ""
    back = ""
    if parts.collects:
        back = (" and what it writes there is uploaded to OUTPUT/RUN_ID/workdir/node-N"
                if "://" in str(job.output_dir) else " and what it writes there comes back to OUTPUT/workdir/node-N")
    return (f"shipped: the script folder ({len(parts.user_files)} file(s), {_size(parts.user_files)} bytes{left}) "
            f"as {MOUNT}/user; the job runs from a writable copy at {CODE_DIR}" + back)


def _labels(job: JobSpec, cluster: Cluster, opts: _Options, name: str) -> dict[str, str]:
    """The labels of every object of the run."""
    labels = {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": dns_name(job.run_id, 63),
              JOB_LABEL: name}
    if job.owner:  # the home that started it (gpucluster.ownership), as on every cloud resource
        labels["gpucluster-owner"] = job.owner
    if opts.platform.shared:  # others use the namespace too: `ssh` finds this cluster's pods by it (connect.py)
        labels[CLUSTER_LABEL] = dns_name(str(cluster.name), 63)
    return labels


def _image_note(image: str) -> str:
    return f"image: {image}" + (" (torch only; the built-in workloads need nothing else)"
                                if image == DEFAULT_IMAGE or "pytorch/pytorch:" in image else "")


def _output_notes(job: JobSpec, opts: _Options, parts: _Parts) -> list[str]:
    """Where the outputs go, and the launcher mode's own note."""
    notes = []
    identity = f" ({opts.platform.identity})" if opts.platform.identity else ""
    if parts.collects and "://" in str(job.output_dir):
        notes.append(f"outputs: each pod uploads its {OUTPUT_DIR} (GPUCLUSTER_OUTPUT_DIR) to "
                     f"{str(job.output_dir).rstrip('/')}/{job.run_id}/node-N with its own write-only access"
                     f"{identity} before the Job is deleted; nothing is copied back here")
    elif parts.collects:
        notes.append(f"outputs: each pod's {OUTPUT_DIR} (GPUCLUSTER_OUTPUT_DIR) is copied back through the "
                     f"Kubernetes exec API before the Job is deleted; a pod whose torchrun ended waits up to "
                     f"{int(opts.collect_wait_s)} s for that copy")
    if opts.mode == "trainjob":
        notes.append(f"launcher trainjob: a Kubeflow Trainer v2 TrainJob ({TRAINER_GROUP}/{TRAINER_VERSION}) on the "
                     f"ClusterTrainingRuntime {TORCH_RUNTIME}; the Trainer makes a JobSet ({JOBSET_GROUP}) of it")
    if opts.mode == "pytorchjob":
        notes.append("launcher pytorchjob is deprecated: it needs Kubeflow's training operator v1 (kubeflow.org/v1), "
                     "which Kubeflow Trainer v2 replaced (v1 is kept only on its release-1.9 branch); the default "
                     "launcher (an Indexed Job) needs no operator")
    return notes


def _pod_notes(job: JobSpec, opts: _Options, parts: _Parts) -> list[str]:
    """The namespace, the service account, the data, the setup, the check and the secrets."""
    notes = []
    platform, namespace = opts.platform, opts.namespace
    identity = f" ({platform.identity})" if platform.identity else ""
    if namespace != DEFAULT_NAMESPACE:
        notes.append(f"namespace {namespace}: made for the run if it is missing, and then removed after it")
    if opts.service_account:
        bound = f", bound to {platform.account_bound_to}" if platform.account_bound_to else ""
        notes.append(f"pods run as the Kubernetes service account {namespace}/{opts.service_account}{bound} "
                     "(created once if missing, kept with the cluster)")
    for m in parts.mounts:
        how = (f"pulled by each pod with its own read-only access{identity}" if m.remote else
               f"sent through the exec API into each pod, through a cache on its node ({CACHE_HOST_PATH}) that "
               "keeps what an earlier run sent")
        notes.append(f"data: {m.src} -> {RUN_DIR}/{m.dest}, {how}")
    if job.setup:
        notes.append(f"setup: {len(job.setup)} command(s) run in each pod before torchrun; torchrun starts once "
                     f"every pod's setup succeeded (the launcher creates {SETUP_GO_FILE} in each pod)")
    if parts.checks:
        notes.append(f"check: {MOUNT}/{CHECK_FILE} in every pod (exec, its training container) once all run, before "
                     "anything of the job; a pod that fails it fails the run, named")
    if job.secrets:
        notes.append(f"secrets: {', '.join(job.secrets)} from the run's own Kubernetes Secret {namespace}/"
                     f"{parts.name}, created before the pods and deleted with them")
    return notes


def _limit_notes(job: JobSpec, opts: _Options, lifetime: int, limit: int, deadline: int) -> list[str]:
    """The time limit and the deadlines."""
    notes = []
    if not job.max_seconds:
        notes.append(f"time limit: without --max-minutes the run is stopped after {limit // 60} minutes (the "
                     f"cluster's {lifetime // 60}-minute lifetime less the time to stop and copy), outputs copied")
    notes.append(f"pods must run within {opts.start_deadline_s} s (--start-deadline); the Job stops itself after "
                 f"{deadline} s (activeDeadlineSeconds: the time limit and the time to stop "
                 "and copy), even without this machine")
    return notes


def plan_job(
    cluster: Cluster,
    job: JobSpec,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    image: str | None = None,
    mode: str = "job",
    python: str = "python",
    workdir: str | Path | None = None,
    start_deadline_s: int = DEFAULT_START_DEADLINE_S,
    max_lifetime_s: int | None = None,
    collect_wait_s: int = DEFAULT_COLLECT_WAIT_S,
    service_account: str | None = None,
    extra_files: Iterable[ShippedFile] = (),
    platform: Platform = GENERIC,
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
    opts = _Options(namespace, mode, python, start_deadline_s, collect_wait_s, service_account, platform)
    outputs = dict(cluster.outputs or {})
    nodes, gpus = _cluster_size(cluster, outputs)
    name = dns_name(f"gpucluster-{job.run_id}")
    data_args, data_files, notes = _builtin_data(job)
    program, user_files, ignored = _ship_user_script(program_args(job, workload_dir=WORKLOAD_DIR), Path(workdir or "."))
    parts = _Parts(name=name, hosts=_hosts(name, nodes, mode), mounts=staged_mounts(job), checks=job.check is not None,
                   collects=bool(job.output_dir), user_files=user_files, ignored=ignored, notes=notes)
    parts.argv = _argv(job, opts, parts, program + data_args)
    env, keeper_env = _env(job, opts, parts, gpus)
    files = _files(job, opts, parts, bool(keeper_env), data_files, extra_files)
    if user_files:
        notes.append(_shipped_note(job, parts))
    selector = platform.node_selector(outputs)  # gcp: the GPU pool's GKE node labels
    labels = _labels(job, cluster, opts, name)
    lifetime = int(max_lifetime_s or int(outputs.get("max_lifetime_minutes") or 0) * 60 or DEFAULT_MAX_LIFETIME_S)
    limit, deadline = run_limits(job.max_seconds, lifetime, int(collect_wait_s))
    image = image or platform.default_image(outputs) or DEFAULT_IMAGE
    notes.insert(0, _image_note(image))
    notes += _output_notes(job, opts, parts) + _pod_notes(job, opts, parts)
    notes += _limit_notes(job, opts, lifetime, limit, deadline)
    return Plan(
        name=name, namespace=namespace, mode=mode, nodes=nodes, gpus_per_node=gpus,
        image=image, run_id=job.run_id, hosts=parts.hosts, argv_by_rank=parts.argv,
        env=tuple(env.items()), files=tuple(files), labels=tuple(labels.items()),
        node_selector=tuple(selector.items()), rdzv_port=job.rdzv_port, active_deadline_s=deadline, run_limit_s=limit,
        start_deadline_s=int(start_deadline_s), notes=tuple(notes), collects=parts.collects, setup=bool(job.setup),
        stages=bool(parts.mounts), cache=any(not m.remote for m in parts.mounts), service_account=service_account,
        secrets=tuple(job.secrets),
        requests=tuple(platform.pod_requests(outputs.get("machine_type") or cluster.instance_type).items()),
        code=parts.code, keeper_env=tuple(keeper_env.items()), checks=parts.checks,
    )


def run_limits(max_seconds: float | None, lifetime_s: int, collect_wait_s: int) -> tuple[int, int]:
    """(when the launcher stops the training, the Job's activeDeadlineSeconds), both in seconds.

    Kubernetes counts activeDeadlineSeconds from the Job's start and, once reached, terminates every
    running pod (Kubernetes docs, "Jobs", "Job termination and cleanup"): whatever is still being copied
    out then is lost. So the Job's deadline comes after everything the launcher does before it deletes
    the Job: the training (the time limit, counted by the launcher from the Job's creation, so the pods'
    start is inside it), the stop (torchrun's grace) and the copy (as long as a pod waits for it), with
    a minute for the API's own delays. Without --max-minutes the launcher stops the training itself that
    much before the cluster's lifetime ends, so the copy still fits."""
    window = STOP_GRACE_S + collect_wait_s + 60
    if max_seconds:
        return int(max_seconds), int(max_seconds) + window
    return max(60, lifetime_s - window), lifetime_s


def staged_rel(dest: str, code: bool) -> str:
    """Where a --data/--resume DEST lands, relative to RUN_DIR: beside a shipped script it is relative
    to the job's working folder CODE_DIR (`../data` is RUN_DIR/data, as on ssh), else to RUN_DIR."""
    import posixpath

    if not code and dest.startswith("../"):
        raise UsageError(f"--data DEST {dest!r} is not allowed here: a path above the job's working folder needs a "
                         "shipped script (python SCRIPT.py), whose folder is the working folder; give a path under it")
    rel = posixpath.normpath(posixpath.join("code", dest)) if code else dest
    taken = rel.split("/")[0]
    if dest.startswith("../") and taken in ("code", "outputs", "control", "shipped"):
        raise UsageError(f"--data DEST {dest!r} is not allowed: the pod's run folder ({RUN_DIR}) already holds "
                         f"{taken!r}; give another name")
    return rel
