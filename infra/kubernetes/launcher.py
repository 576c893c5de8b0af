"""The Kubernetes launcher: torchrun across a cluster's GPU nodes, one pod per node.

What the cluster's provider adds (how its API is reached, node selector, pod requests, the pods'
object-storage identity) is the `Platform` it is given (`infra.kubernetes.platform`; gcp's is
`infra.gcp.gke.GKE`); nothing here imports a cloud's package.

Model (the `job` launcher, the default):

- a **ConfigMap** `<name>` carries the built-in workloads (`gpucluster/workloads/*.py`), a tiny
  standard-library entry script and `argv.json`, the torchrun argv of every node rank built with
  `gpucluster.watch.launch.torchrun_argv` (so the c10d flags, `is_host` on rank 0 and the run id are the
  same as on the other backends). It is mounted read-only at `/gpucluster`.
- a **headless Service** `<name>` (clusterIP None, `publishNotReadyAddresses`) gives every pod a
  stable DNS name `<name>-<index>.<name>`; pod 0's name is the rendezvous endpoint.
- an **Indexed Job** `<name>`: completions = parallelism = nodes, `completionMode: Indexed`,
  `backoffLimitPerIndex: 0` (a failed pod fails its index only), `restartPolicy: Never`, `subdomain` = the Service. Each pod requests all the
  node's GPUs (`nvidia.com/gpu` limits), tolerates the GPU taint, avoids sharing a node with
  another pod of the job, and runs `python /gpucluster/entry.py`, which picks its argv by
  `JOB_COMPLETION_INDEX` (the node rank) and runs torchrun (see Outputs below).
  `activeDeadlineSeconds` (the job's time limit + stop grace + copy window + 60 s, plan.run_limits)
  and `ttlSecondsAfterFinished` make the cluster clean up even if this machine disappears.

With the option `launcher: pytorchjob` a Kubeflow **PyTorchJob** (`kubeflow.org/v1`, needs the
training operator, as in seed 003) replaces the Job and Service: Master + Workers, the same pod
template and entry script; the rank comes from the operator's `RANK` variable and the rendezvous
is on `<name>-master-0`, the Service the operator makes for the master. With `launcher: trainjob` a
Kubeflow Trainer v2 **TrainJob** on the `torch-distributed` ClusterTrainingRuntime replaces them (the
Trainer makes a JobSet, the JobSet an Indexed Job and a headless Service; see `infra.kubernetes.trainjob`).

The launcher lists the job's pods every `poll_interval` seconds, streams each pod's log as soon as
its container runs, feeds every line (node rank attached) to `gpucluster.watch.supervisor.NodeSupervisor`
(the same metrics parser, tails, fail-fast and deadline as the local and ssh launchers), and when
the run ends, fails, times out or is interrupted deletes everything it created (Job with
Foreground propagation, so its pods go too; Service; ConfigMap).

Outputs (when the job has an output folder, as every lifecycle run does): each pod gets an emptyDir
at /gpucluster-run; GPUCLUSTER_OUTPUT_DIR is its `outputs/`. The entry script runs torchrun as a
child, prints a `job_end` record with its exit code (the node's end, read from the log) and keeps
the container running; stopping the run asks the pods to stop torchrun instead of deleting them;
`collect_outputs` copies every folder out through the exec API (`infra.kubernetes.outputs`, as a tar
stream unpacked safely here) and only then deletes the Job, Service and ConfigMap.

With `--setup` each rank's argv is the setup wrapper (`infra.kubernetes.plan.SETUP_GO_FILE`): the run
opens in the `setup` phase; once every pod's `setup_end` record says rc 0 (the supervisor counts
them) `release` makes the go file in every pod through exec (`outputs.release_pods`) and the
rendezvous phase begins; a pod whose setup failed fails the run (node, exit code, last lines).

With `--data`/`--resume` each rank's argv first waits for a `staged` file: the run opens in the
`stage` phase, and `infra.kubernetes.stage.PodStager` sends each pod its folders through exec as soon
as it runs (local folders through a cache on the node; object-storage URLs pulled by the pod itself,
with the identity the platform gives it: gcp's `gs://`, as the Kubernetes service account the component
binds to a Google service account). `--output gs://`: each pod uploads its folder instead of it being
copied here.

The `kubernetes` package is imported lazily (`gpucluster --help` must not import it); tests pass
an in-memory fake through `KubeApi`. The plan (argv, files, names) is `infra.kubernetes.plan`; the
manifests built from it are `infra.kubernetes.manifests`; this module runs and watches them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpucluster.domain import Cluster, Leftover
from gpucluster.errors import LaunchError, UsageError, not_allowed
from gpucluster.events import RunEvents
from gpucluster.states import JsonMapping
from gpucluster.watch.launch import Forward, JobResult, JobSpec, Launcher
from gpucluster.watch.sequence import Runs, Transport, launch_sequence
from gpucluster.watch.staging import staged_mounts
from gpucluster.watch.supervisor import NodeSupervisor

from .platform import GENERIC, ObjectTransfer, Platform
from .stage import PodStager, ensure_service_account, object_transfer, uses_objects

from .api import API_RETRY_S, KubeApi, Retry  # noqa: F401 - KubeApi: part of this module's API
from .objects import Created
from .notices import DEFAULT_INTERVAL_S as NOTICE_INTERVAL_S
from .plan import DEFAULT_COLLECT_WAIT_S, DEFAULT_NAMESPACE, DEFAULT_START_DEADLINE_S, MODES, Plan, plan_job
from .pods import _lines, _PodHandle, _Pods  # noqa: F401 - _lines: tests use it

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.outputs import NodeOutputs

    from .check import PodChecker


def require_operator(api: KubeApi, plan: Plan, retry: Retry) -> None:
    """The PyTorchJob resource type exists on the cluster (the training operator's CRD is installed), else a
    LaunchError naming how to install it; asked by listing PyTorchJobs (404: the type is not served)."""
    from .api import _is_api_error, _status
    from .plan import KUBEFLOW_GROUP, KUBEFLOW_PLURAL, KUBEFLOW_VERSION

    try:
        retry.call(api.custom.list_namespaced_custom_object, KUBEFLOW_GROUP, KUBEFLOW_VERSION, plan.namespace,
                   KUBEFLOW_PLURAL)
    except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
        if not _is_api_error(exc) or _status(exc) != 404:
            raise
        raise LaunchError(f"launcher pytorchjob needs the PyTorchJob resource ({KUBEFLOW_PLURAL}.{KUBEFLOW_GROUP}/"
                          f"{KUBEFLOW_VERSION}), which this cluster does not serve: install Kubeflow's training operator "
                          "v1 (kubectl apply --server-side -k \"github.com/kubeflow/training-operator.git/manifests/"
                          "overlays/standalone?ref=v1.9.2\"), or use the default launcher (an Indexed Job, no "
                          "operator); nothing was created") from None


def _stager(api: KubeApi, plan: Plan, pods: _Pods, job: JobSpec, transfer: ObjectTransfer | None,
            events: RunEvents, retry: Retry, log_dir: Path) -> PodStager | PodChecker | None:
    """What runs in the pods before the job: the health check (check), then the --data/--resume staging."""
    mounts = staged_mounts(job)
    stager: PodStager | None = None
    if mounts:  # hashed here, before anything is created: an unreadable file fails now
        lay_back = None
        if job.resume_files and job.resume is not None and plan.code:  # --resume: the script's own files
            from gpucluster.watch.launch import resume_record

            from .plan import RUN_DIR, staged_rel

            lay_back = (f"{RUN_DIR}/{staged_rel(job.resume.dest, plan.code)}/{job.resume_files[0]}",
                        lambda files, nbytes: resume_record(job, files, nbytes))
        stager = PodStager(api, plan, pods, mounts, objects=transfer, lay_back=lay_back)
        stager.events = events
    if job.check is not None:  # the health check in every pod goes first (check)
        from .check import PodChecker

        checker = PodChecker(api, plan, pods, job.check, then=stager, log_dir=log_dir, retry=retry)
        checker.events = events
        return checker
    return stager


def _stop_for_copy(api: KubeApi, plan: Plan, pods: _Pods, grace: float | None) -> None:
    """torchrun stopped in the pods, which stay for the outputs copy; with a grace (a notice, a money guard),
    the ranks' time to save is waited for."""
    from .outputs import stop_pods

    running = {r: n for r, n in pods.pod_names.items() if r in pods.attached and r not in pods.ended}
    stop_pods(api, plan, running, grace=grace)
    if grace:  # a notice (or a money guard): the ranks' time to save, then the copy
        end = time.monotonic() + grace + 5
        while time.monotonic() < end and any(r not in pods.ended and r not in pods.lost for r in running):
            pods.refresh()
            time.sleep(0.2)


def _explain(result: JobResult, pods: _Pods, lifetime_limit: bool) -> None:
    """The failure said with the pods' own reason, the lifetime's time limit, and a pod's scheduling."""
    if result.failed_node is not None and result.failed_node in pods.reasons and \
            pods.reasons[result.failed_node] not in (result.failure or ""):
        result.failure = f"{result.failure}: {pods.reasons[result.failed_node]}"
    if result.timed_out and lifetime_limit:
        result.failure = (f"{result.failure} (no --max-minutes: the cluster's lifetime less the time to stop and "
                          "copy the outputs before the Job's own deadline; set --max-minutes or --max-lifetime)")
    if result.timed_out and pods.pending:
        result.failure = f"{result.failure}; {pods.pending[min(pods.pending)]}"


class KubernetesLauncher(Launcher):
    """`Launcher` for clusters reached through the Kubernetes API (gcp: GKE, its `Platform` given).

    With `job.output_dir` set, the pods outlive `launch`: stopping the run stops torchrun in them
    (the entry script keeps the container running), and `collect_outputs` copies every output folder
    out through the exec API (`infra.kubernetes.outputs`) and then deletes the Job, Service and ConfigMap.
    Without it, they are deleted before `launch` returns."""

    collects_outputs = checks_nodes = True

    def __init__(
        self,
        *,
        api: KubeApi | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        image: str | None = None,
        mode: str = "job",
        poll_interval: float = 2.0,
        start_deadline_s: int = DEFAULT_START_DEADLINE_S,
        credentials: object = None,
        collect_wait_s: int = DEFAULT_COLLECT_WAIT_S,
        objects: ObjectTransfer | None = None,
        api_retry_s: float = API_RETRY_S,
        platform: Platform = GENERIC,
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
        self.collect_wait_s = int(collect_wait_s)
        self.objects = objects  # --data/--output URLs: the pods' node transfer program (gcp: gcs.GcsTransfer)
        self.api_retry_s = api_retry_s  # how long API calls are retried while the control plane is away
        self.platform = platform  # the provider's parts: API access, node selector, requests, identity
        self._runs: Runs[_KubeHeld] = Runs()  # run id -> what collect_outputs copies from, then deletes
        self.notice_interval_s = NOTICE_INTERVAL_S  # how often the job's nodes are read for a provider's notice
        self.wall_clock = time.time  # the time a notice's label is compared with (tests: a fake's scaled clock)

    @classmethod
    def from_options(cls, options: JsonMapping, **kw: Any) -> "KubernetesLauncher":  # Any: passed on to __init__
        """From a spec's options: `launcher` (job|pytorchjob|trainjob), `image`, `namespace`."""
        mode = str(options.get("launcher") or "job").strip().lower()
        return cls(mode=mode, image=options.get("image") or None,
                   namespace=options.get("namespace") or DEFAULT_NAMESPACE, **kw)

    def describe(self, spec: ClusterSpec, job: JobSpec) -> list[str]:
        """The plan's Kubernetes lines (image, data, what is shipped, deadlines), computed from the
        spec before anything exists; raises the same errors `launch` would (a missing data file, a
        script folder over the ConfigMap limit) so they come before anything is created."""
        cluster = Cluster(name=spec.name, cloud=spec.cloud, nodes=(), gpus_per_node=spec.gpus_per_node or 1,
                          outputs={"nodes": spec.nodes, "max_lifetime_minutes": spec.max_lifetime_minutes,
                                   "machine_type": spec.instance_type})
        files, _ = object_transfer(self.objects, job)
        plan = plan_job(cluster, job, namespace=self.namespace, image=self.image, mode=self.mode,
                        start_deadline_s=self.start_deadline_s, collect_wait_s=self.collect_wait_s,
                        service_account=self.platform.account_name if uses_objects(job) else None,
                        extra_files=files, platform=self.platform)
        return list(plan.notes)

    def launch(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        """The launch sequence (gpucluster.watch.sequence) through the Kubernetes API (`_KubeTransport`):
        the run's objects created, their pods watched (the health check and the staging run in them,
        as the supervisor's stage), then deleted, or held for `collect_outputs`."""
        transport = _KubeTransport(self, cluster, job, events, Path(log_dir))
        return launch_sequence(transport, transport.job, events)

    def _create(self, api: KubeApi, plan: Plan, created: Created, retry: Retry, account: tuple[str, str] | None,
                secrets: dict[str, str]) -> None:
        """The run's objects created, after the resource types its mode needs are known to be served."""
        if plan.mode == "pytorchjob":  # before anything is created: the operator's resource type is served
            require_operator(api, plan, retry)
        elif plan.mode == "trainjob":  # Trainer's and JobSet's resource types, and the torch runtime
            from .trainjob import require_trainer

            require_trainer(api, retry)
        created.namespace()  # made for the run when missing (the API refuses objects in a missing one)
        if account:
            ensure_service_account(api, plan, account[0], self.platform.account_annotations(account[1]))
        created.objects(secrets)

    def collect_outputs(self, job: JobSpec, events: RunEvents) -> list[NodeOutputs]:
        """Every output folder of a pod whose container ran, into `job.output_dir/node-N`, with
        its verdict (`infra.kubernetes.outputs.collect`); then the Job, Service and ConfigMap are
        deleted, whatever the copies did. [] when the job was started nowhere."""
        held = self._runs.take(job.run_id)
        if held is None:
            return []
        api, plan, pods, created, transfer = held.api, held.plan, held.pods, held.created, held.transfer
        try:
            from .outputs import collect

            ran = {r: n for r, n in pods.pod_names.items() if r in pods.attached}
            return collect(api, plan, ran, job.output_dir or ".", objects=transfer, job=job)
        finally:
            self._deleted(created, events)

    def _deleted(self, created: Created, events: RunEvents) -> None:
        """Delete the run's objects, read them back (their ledger rows closed when confirmed gone);
        what is not is in `cleanup_errors`, which makes the run's verdict "not verified"."""
        created.delete_all()
        self.cleanup_errors = list(created.errors)
        if created.going:
            events.message("deleted, still terminating in the cluster (their deletion is accepted and "
                           "finishes there): " + ", ".join(created.going))

    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        """The objects labelled with run `run_id` still in the namespace, deletion not under way
        (`infra.kubernetes.gone`); None without a run id (objects are found by their run's label). With
        `remove` (a killed run's objects), deleted first by the same label, then read back."""
        if not run_id:
            return None
        from .gone import delete_run_objects, run_leftovers

        api, retry = self.api or self._api_for(cluster), Retry(self.api_retry_s)
        if remove:
            delete_run_objects(api, self.namespace, run_id, retry=retry)
        return run_leftovers(api, self.namespace, run_id, retry=retry)

    def connect(self, cluster: Cluster, rank: int, command: Sequence[str], forwards: Sequence[Forward],
                opening: Callable[[], None] = lambda: None) -> int:
        """`gpucluster ssh`: a shell or a command in node `rank`'s pod of the job running on the cluster
        (the exec API), local ports forwarded to it (the portforward API): `infra.kubernetes.connect`.
        Refused first: the -L hosts, a terminal for a shell, and node `rank`'s pod of a running job."""
        from .connect import check, connect

        api = self.api or self._api_for(cluster)
        check(api, self.namespace, self.mode, cluster, rank, command, forwards, platform=self.platform)
        opening()
        return connect(api, self.namespace, self.mode, cluster, rank, command, forwards, platform=self.platform)

    def _api_for(self, cluster: Cluster) -> KubeApi:
        """The cluster's API, as its platform reaches it (gcp: the stack's kubeconfig, Google credentials)."""
        return self.platform.api(cluster, self.credentials)


@dataclass
class _KubeHeld:
    """A run held for `collect_outputs`: its API, plan, pods, created objects and the pods' object transfer."""

    api: KubeApi
    plan: Plan
    pods: _Pods
    created: Created
    transfer: ObjectTransfer | None


class _KubeTransport(Transport):
    """The launch sequence's steps through the Kubernetes API: the run's objects created (`start`),
    the Job controller's pods watched (`watch`: the health check and the staging are the node
    supervisor's stage, in the pods), the objects deleted (`clean`) or held (`hold`). No rendezvous
    port of its own to retry (pod 0's name is the endpoint), no connection to release."""

    def __init__(self, launcher: KubernetesLauncher, cluster: Cluster, job: JobSpec, events: RunEvents,
                 log_dir: Path) -> None:
        """The plan, the API and the watch of the pods, before anything is created."""
        from gpucluster.plan.jobenv import secret_values

        self.launcher, self.events = launcher, events
        self.secrets = secret_values(job)  # read now, sent only in the run's Secret: never kept here
        self.account = launcher.platform.object_account(cluster, job)
        files, self.transfer = object_transfer(launcher.objects, job)  # the pods' object-storage program, shipped
        plan = plan_job(cluster, job, namespace=launcher.namespace, image=launcher.image, mode=launcher.mode,
                        start_deadline_s=launcher.start_deadline_s, collect_wait_s=launcher.collect_wait_s,
                        service_account=self.account[0] if self.account else None, extra_files=files,
                        platform=launcher.platform)
        self.api = api = launcher.api or launcher._api_for(cluster)
        self.lifetime_limit = False
        if not job.max_seconds and plan.run_limit_s is not None:  # the lifetime's: stopped and copied before the Job's deadline
            import dataclasses

            job, self.lifetime_limit = dataclasses.replace(job, max_seconds=float(plan.run_limit_s)), True
        self.job = job
        self.supervisor = NodeSupervisor(job, events, log_dir, plan.hosts)
        self.retry = retry = Retry(launcher.api_retry_s)
        if plan.requests:  # the pool's nodes exist: their real allocatable less their DaemonSets (sizing.py)
            from .sizing import fitted

            plan = fitted(api, plan, retry, say=events.message)
        self.plan = plan
        self.pods = pods = _Pods(api, plan, self.supervisor, launcher.poll_interval, retry)
        if launcher.platform.node_notice is not None:  # GKE: a GPU node's host maintenance, acted on as a spot notice
            from .notices import NodeNotices

            pods.notices = NodeNotices(api, launcher.platform.node_notice, launcher.notice_interval_s,
                                       launcher.wall_clock, say=events.message)
        self.created = Created(api, plan, retry, events=events, shape=launcher.platform.shape)
        self.stager = _stager(api, plan, pods, job, self.transfer, events, retry, log_dir)

    def start(self, job: JobSpec) -> None:
        self.launcher._create(self.api, self.plan, self.created, self.retry, self.account, self.secrets)
        self.pods.started_at = time.monotonic()

    def _stop_pods(self) -> None:
        """The supervisor's stop: the pods' torchrun stopped (kept for the copy), or everything deleted."""
        self.pods.close()  # the run is over: a log stream that ends now is not reattached
        if self.stager is not None:
            self.stager.cancel()  # exec streams still sending data are closed
        if not self.plan.collects:
            self.created.delete_all()
            return
        _stop_for_copy(self.api, self.plan, self.pods, self.supervisor.stop_grace)

    def _release_pods(self) -> None:
        """--setup: every pod's setup_end said rc 0; torchrun starts in each."""
        from .outputs import release_pods

        errors = release_pods(self.api, self.plan, dict(self.pods.pod_names))
        if errors:
            raise LaunchError("; ".join(errors))

    def watch(self, job: JobSpec) -> JobResult:
        pods = self.pods
        handles = {rank: _PodHandle(pods, rank) for rank in range(self.plan.nodes)}
        return self.supervisor.run(handles, stop=self._stop_pods, release=self._release_pods, stage=self.stager,
                                   lost=lambda rank, code: pods.lost.get(rank))

    def started(self, job: JobSpec) -> bool:
        return self.plan.collects and self.pods.started_at is not None

    def hold(self, job: JobSpec) -> None:
        self.launcher._runs.put(job.run_id, _KubeHeld(self.api, self.plan, self.pods, self.created,
                                                      self.transfer))  # deleted by collect_outputs

    def clean(self, job: JobSpec) -> None:
        self.launcher._deleted(self.created, self.events)

    def explain(self, result: JobResult) -> None:
        _explain(result, self.pods, self.lifetime_limit)
