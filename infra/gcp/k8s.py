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
  `JOB_COMPLETION_INDEX` (the node rank) and runs torchrun (see Outputs below).
  `activeDeadlineSeconds` (the job's
  time limit + 10 min) and `ttlSecondsAfterFinished` make the cluster clean up even if this
  machine disappears.

With the option `launcher: pytorchjob` a Kubeflow **PyTorchJob** (`kubeflow.org/v1`, needs the
training operator, as in seed 003) replaces the Job and Service: Master + Workers, the same pod
template and entry script; the rank comes from the operator's `RANK` variable and the rendezvous
is on `<name>-master-0`, the Service the operator makes for the master.

The launcher lists the job's pods every `poll_interval` seconds, streams each pod's log as soon as
its container runs, feeds every line (node rank attached) to `gpucluster.supervisor.NodeSupervisor`
(the same metrics parser, tails, fail-fast and deadline as the local and ssh launchers), and when
the run ends, fails, times out or is interrupted deletes everything it created (Job with
Foreground propagation, so its pods go too; Service; ConfigMap).

Outputs (when the job has an output folder, as every lifecycle run does): each pod gets an emptyDir
at /gpucluster-run; GPUCLUSTER_OUTPUT_DIR is its `outputs/`. The entry script runs torchrun as a
child, prints a `job_end` record with its exit code (the node's end, read from the log) and keeps
the container running; stopping the run asks the pods to stop torchrun instead of deleting them;
`collect_outputs` copies every folder out through the exec API (`infra.gcp.k8s_outputs`, as a tar
stream unpacked safely here) and only then deletes the Job, Service and ConfigMap.

With `--setup` each rank's argv is the setup wrapper (`infra.gcp.k8s_plan.SETUP_GO_FILE`): the run
opens in the `setup` phase; once every pod's `setup_end` record says rc 0 (the supervisor counts
them) `release` makes the go file in every pod through exec (`k8s_outputs.release_pods`) and the
rendezvous phase begins; a pod whose setup failed fails the run (node, exit code, last lines).

With `--data`/`--resume` each rank's argv first waits for a `staged` file: the run opens in the
`stage` phase, and `infra.gcp.k8s_stage.PodStager` sends each pod its folders through exec as soon
as it runs (local folders through a cache on the node; `gs://` pulled by the pod itself, as the
Kubernetes service account the component binds to a Google service account). `--output gs://`:
each pod uploads its folder instead of it being copied here.

The `kubernetes` package is imported lazily (`gpucluster --help` must not import it); tests pass
an in-memory fake through `KubeApi`. The plan (argv, files, names) is `infra.gcp.k8s_plan`; the
manifests built from it are `infra.gcp.k8s_manifests`; this module runs and watches them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from gpucluster.errors import LaunchError, UsageError, not_allowed
from gpucluster.events import RunEvents
from gpucluster.launch import JobResult, JobSpec, Launcher
from gpucluster.staging import staged_mounts
from gpucluster.supervisor import NodeSupervisor

from .k8s_stage import PodStager, ensure_service_account, object_account, object_transfer, uses_objects

from .k8s_api import KubeApi, _is_api_error, _status  # noqa: F401 - KubeApi: part of this module's API
from .k8s_manifests import kube_models, config_map_manifest, job_manifest, pytorchjob_manifest, rank_of, service_manifest
from .k8s_plan import (CONTAINER, DEFAULT_COLLECT_WAIT_S, DEFAULT_NAMESPACE, DEFAULT_START_DEADLINE_S, JOB_END_KIND,
                       KUBEFLOW_GROUP, KUBEFLOW_PLURAL, KUBEFLOW_VERSION, MODES, Plan, plan_job)

MAX_LIST_ERRORS = 5  # consecutive failed pod listings before the run is given up
# Container waiting reasons that will not fix themselves: fail now rather than at the deadline.
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff")


def _job_end(line: bytes) -> int | None:
    """The exit code in the entry script's `job_end` record, or None for any other line."""
    from gpucluster.workloads.protocol import PREFIX

    text = line.decode("utf-8", "replace").strip()
    if not text.startswith(PREFIX) or JOB_END_KIND not in text:
        return None
    import json

    try:
        record = json.loads(text[len(PREFIX):])
        return int(record["exit_code"]) if record.get("kind") == JOB_END_KIND else None
    except (ValueError, KeyError, TypeError):
        return None


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
            except Exception:  # noqa: BLE001 - best-effort release of a stream that may already be broken
                pass


class _Pods:
    """The job's pods by node rank, refreshed at most every `poll_interval` seconds."""

    def __init__(self, api: KubeApi, plan: Plan, supervisor: NodeSupervisor, poll_interval: float):
        self.api, self.plan, self.supervisor = api, plan, supervisor
        self.poll_interval = poll_interval
        self.exit_codes: dict[int, int] = {}
        self.ended: dict[int, int] = {}  # rank -> torchrun's exit code (the entry script's job_end record)
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
        except Exception as exc:  # ApiException lives in the lazily imported SDK: non-API errors re-raise
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
            self.supervisor.attach(rank, self._log_stream(pod.metadata.name, rank))
        self.pending.pop(rank, None)
        for cond in getattr(status, "conditions", None) or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                self.pending[rank] = f"pod {pod.metadata.name} not scheduled: {cond.reason}: {cond.message}"
        if rank in self.exit_codes:
            return
        if rank in self.ended:  # torchrun ended; the pod waits (Running) for its outputs to be copied
            self.exit_codes[rank] = self.ended[rank]
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
        except Exception as exc:  # ApiException lives in the lazily imported SDK: non-API errors re-raise
            if not _is_api_error(exc):
                raise
            return None
        warnings = [e for e in events if getattr(e, "type", None) == "Warning"] or list(events)
        if not warnings:
            return None
        last = max(warnings, key=lambda e: str(getattr(e, "last_timestamp", None) or getattr(e, "event_time", None)
                                                or ""))
        return f"{last.reason}: {last.message}"

    def _log_stream(self, pod_name: str, rank: int) -> Iterable[bytes]:
        try:
            response = self.api.core.read_namespaced_pod_log(
                pod_name, self.plan.namespace, container=CONTAINER, follow=True, _preload_content=False
            )
        except Exception as exc:  # e.g. 400 when the container never started: no log to show
            return [f"[gpucluster] no log for pod {pod_name}: {exc}\n".encode()]
        return self._until_job_end(_lines(response), rank) if self.plan.collects else _lines(response)

    def _until_job_end(self, lines: Iterator[bytes], rank: int) -> Iterator[bytes]:
        """The log up to the entry script's job_end record, which gives the node's exit code; the
        stream is closed there (the container keeps running until its outputs are copied)."""
        try:
            for line in lines:
                code = _job_end(line)
                if code is not None:
                    self.ended[rank] = code
                    return
                yield line
        finally:
            lines.close()


class _PodHandle:
    """Popen-like view of one node's pod, for NodeSupervisor.run."""

    def __init__(self, pods: _Pods, rank: int):
        self.pods, self.rank = pods, rank

    def poll(self) -> int | None:
        if self.rank not in self.pods.exit_codes and self.rank in self.pods.ended:
            self.pods.exit_codes[self.rank] = self.pods.ended[self.rank]
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
        k = kube_models()
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
            except Exception as exc:  # noqa: BLE001 - every kind is still deleted; the error is reported
                if _status(exc) != 404:
                    self.errors.append(f"{kind} {ns}/{name}: {exc}")


class KubernetesLauncher(Launcher):
    """`Launcher` for clusters reached through the Kubernetes API (GKE).

    With `job.output_dir` set, the pods outlive `launch`: stopping the run stops torchrun in them
    (the entry script keeps the container running), and `collect_outputs` copies every output folder
    out through the exec API (`infra.gcp.k8s_outputs`) and then deletes the Job, Service and ConfigMap.
    Without it, they are deleted before `launch` returns."""

    collects_outputs = True

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
        collect_wait_s: int = DEFAULT_COLLECT_WAIT_S,
        objects: Any = None,
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
        self._held: dict[str, tuple[KubeApi, Plan, _Pods, _Created, Any]] = {}  # run id -> for collect_outputs

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

        from gpucluster.errors import UsageError
        from gpucluster.staging import staged_mounts

        up = [m.dest for m in staged_mounts(job) if m.dest.startswith("../")]
        if up:
            raise UsageError(f"--data DEST {up[0]!r} is not supported yet with --cloud gcp: give a path under the "
                             "job's working directory")
        cluster = SimpleNamespace(name=spec.name, nodes=(), gpus_per_node=spec.gpus_per_node or 1,
                                  outputs={"nodes": spec.nodes, "max_lifetime_minutes": spec.max_lifetime_minutes})
        from .gcs import OBJECTS_KSA

        files, _ = object_transfer(self.objects, job)
        plan = plan_job(cluster, job, namespace=self.namespace, image=self.image, mode=self.mode,
                        start_deadline_s=self.start_deadline_s, collect_wait_s=self.collect_wait_s,
                        service_account=OBJECTS_KSA if uses_objects(job) else None, extra_files=files)
        return list(plan.notes)

    def launch(self, cluster: Any, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        account = object_account(cluster, job)
        files, transfer = object_transfer(self.objects, job)  # the pods' gs:// program, shipped
        plan = plan_job(cluster, job, namespace=self.namespace, image=self.image, mode=self.mode,
                        start_deadline_s=self.start_deadline_s, collect_wait_s=self.collect_wait_s,
                        service_account=account[0] if account else None, extra_files=files)
        mounts = staged_mounts(job)
        api = self.api or self._api_for(cluster)
        supervisor = NodeSupervisor(job, events, Path(log_dir), plan.hosts)
        pods = _Pods(api, plan, supervisor, self.poll_interval)
        created = _Created(api, plan)
        stager = None
        if mounts:  # hashed here, before anything is created: an unreadable file fails now
            stager = PodStager(api, plan, pods, mounts, objects=transfer)
            stager.events = events

        def stop() -> None:
            if stager is not None:
                stager.cancel()  # exec streams still sending data are closed
            if not plan.collects:
                created.delete_all()
                return
            from .k8s_outputs import stop_pods  # torchrun stops; the pods stay for the copy

            stop_pods(api, plan, {r: n for r, n in pods.pod_names.items()
                                  if r in pods.attached and r not in pods.ended})

        def release() -> None:  # --setup: every pod's setup_end said rc 0; torchrun starts in each
            from .k8s_outputs import release_pods

            errors = release_pods(api, plan, dict(pods.pod_names))
            if errors:
                raise LaunchError("; ".join(errors))

        try:
            if account:
                ensure_service_account(api, plan, *account)
            self._create(api, plan, created)
            pods.started_at = time.monotonic()
            handles = {rank: _PodHandle(pods, rank) for rank in range(plan.nodes)}
            result = supervisor.run(handles, stop=stop, release=release, stage=stager)
        finally:
            if plan.collects and pods.started_at is not None:
                self._held[job.run_id] = (api, plan, pods, created, transfer)  # deleted by collect_outputs
            else:
                created.delete_all()
                self.cleanup_errors = list(created.errors)
        if result.failed_node is not None and result.failed_node in pods.reasons:
            result.failure = f"{result.failure}: {pods.reasons[result.failed_node]}"
        if result.timed_out and pods.pending:
            result.failure = f"{result.failure}; {pods.pending[min(pods.pending)]}"
        return result

    def collect_outputs(self, job: JobSpec, events: Any) -> list:
        """Every output folder of a pod whose container ran, into `job.output_dir/node-N`, with
        its verdict (`infra.gcp.k8s_outputs.collect`); then the Job, Service and ConfigMap are
        deleted, whatever the copies did. [] when the job was started nowhere."""
        held = self._held.pop(job.run_id, None)
        if held is None:
            return []
        api, plan, pods, created, transfer = held
        try:
            from .k8s_outputs import collect

            ran = {r: n for r, n in pods.pod_names.items() if r in pods.attached}
            return collect(api, plan, ran, job.output_dir or ".", objects=transfer)
        finally:
            created.delete_all()
            self.cleanup_errors = list(created.errors)

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
            except Exception as exc:  # ApiException lives in the lazily imported SDK: non-API errors re-raise
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
