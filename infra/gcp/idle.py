"""The idle stop of a kept GKE cluster (`up --idle-minutes N`, `run --keep --idle-minutes N`).

Why this shape (docs/gcp.md, "Idle stop"): nothing of gpucluster pins a kept cluster's GPU nodes (the
launcher deletes each job's Job, Service and ConfigMap), so with autoscaling on (the default) the
cluster autoscaler already removes them about 10 minutes after the last job's pods end. What
`--idle-minutes N` adds is the count: the GPU nodes stay for N minutes after the last job (the next
`exec` finds them warm), then go. So, once the stack is up, the program installs in the job
namespace, through the Kubernetes API (there is no Kubernetes provider in the Pulumi program):

- a Job `gpucluster-hold`: parallelism = the node count, pods that request nothing (they never
  take room from a training pod), tolerate the GPU taint, run only on the GPU pool, spread over the
  nodes (preferred anti-affinity: never a pending hold pod, which would make the autoscaler add a
  node) and carry `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, which keeps the
  autoscaler from removing their node (kubernetes/autoscaler cluster-autoscaler/FAQ.md, "What types
  of pods can prevent CA from removing a node?"; GKE docs, "About cluster autoscaling"). Its
  `activeDeadlineSeconds` is the max lifetime: past it the Job fails and its pods go, even if
  the watcher is gone;
- the watcher (`pod_idle.py`, in a ConfigMap) as a one-replica Deployment on the system pool, with a
  ServiceAccount whose Role allows only listing pods in the namespace and getting and patching the
  hold Job by name; after N minutes without a gpucluster job pod it sets the hold's parallelism to 0.

GCP bills afterwards: the cluster fee and the system pool (and `minNodes` GPU nodes when set), until
`gpucluster down`, which deletes the cluster and everything in it. No Google IAM is involved.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpucluster.errors import LaunchError

from gpucluster.infra.kubernetes.api import KubeApi, Retry, _is_api_error, _status
from gpucluster.infra.kubernetes.manifests import kube_models
from gpucluster.infra.kubernetes.plan import DEFAULT_NAMESPACE, GPU_TAINT_KEY
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.domain import Cluster
    from gpucluster.spec import ClusterSpec

NAME = "gpucluster-idle"  # ServiceAccount, Role, RoleBinding, ConfigMap and Deployment
HOLD = "gpucluster-hold"  # the Job whose pods pin the GPU nodes
PROGRAM = "idle.py"
WATCHER = (Path(__file__).parent / "pod_idle.py").read_text()  # the watcher's text, shipped in the ConfigMap
IMAGE = "python:3.12-slim"  # standard library only; Docker Hub's official image
LAST_ANNOTATION = "gpucluster.io/idle-last-job"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # the placeholder container of the autoscaler's own overprovisioning example
POLL_S = 30
PARTS = ("serviceaccount", "role", "rolebinding", "configmap", "job", "deployment")


def labels(cluster: str, part: str) -> dict[str, str]:
    # never the job label (JOB_LABEL): the watcher counts the pods that carry it as jobs
    return {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-cluster": cluster, "gpucluster-part": part}


def namespace_of(options: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> str:
    return str(dict(options or {}).get("namespace") or DEFAULT_NAMESPACE)


def manifests(*, cluster: str, namespace: str, minutes: int, nodes: int, deadline: float,
              gpu_pool: str = "gpu", system_pool: str = "system", now: float | None = None) -> JsonObject:
    """The six objects, by kind, built with the client's typed models."""
    k = kube_models()
    now = time.time() if now is None else now
    meta = lambda name, part, **kw: k.V1ObjectMeta(name=name, namespace=namespace,  # noqa: E731
                                                   labels=labels(cluster, part), **kw)
    role = k.V1Role(api_version="rbac.authorization.k8s.io/v1", kind="Role", metadata=meta(NAME, "idle"), rules=[
        k.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"]),
        k.V1PolicyRule(api_groups=["batch"], resources=["jobs"], resource_names=[HOLD], verbs=["get", "patch"]),
    ])
    binding = k.V1RoleBinding(
        api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding", metadata=meta(NAME, "idle"),
        role_ref=k.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=NAME),
        subjects=[k.RbacV1Subject(kind="ServiceAccount", name=NAME, namespace=namespace)])
    hold_pod = k.V1PodTemplateSpec(
        metadata=k.V1ObjectMeta(labels=labels(cluster, "hold"), annotations={SAFE_TO_EVICT: "false"}),
        spec=k.V1PodSpec(
            restart_policy="Never",
            automount_service_account_token=False,
            termination_grace_period_seconds=1,
            node_selector={"cloud.google.com/gke-nodepool": gpu_pool},
            tolerations=[k.V1Toleration(key=GPU_TAINT_KEY, operator="Exists", effect="NoSchedule")],
            affinity=k.V1Affinity(pod_anti_affinity=k.V1PodAntiAffinity(
                preferred_during_scheduling_ignored_during_execution=[k.V1WeightedPodAffinityTerm(
                    weight=100, pod_affinity_term=k.V1PodAffinityTerm(
                        topology_key="kubernetes.io/hostname",
                        label_selector=k.V1LabelSelector(match_labels=labels(cluster, "hold"))))])),
            # requests of zero, given (not left to a namespace LimitRange's default): a training pod that
            # asks for all of a node's CPU and memory still fits beside it
            containers=[k.V1Container(name="hold", image=PAUSE_IMAGE, resources=k.V1ResourceRequirements(
                requests={"cpu": "0", "memory": "0"}))]))
    hold = k.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=meta(HOLD, "hold", annotations={LAST_ANNOTATION: f"{now:.3f}"}),
        spec=k.V1JobSpec(parallelism=nodes, backoff_limit=6, active_deadline_seconds=max(60, int(deadline - now)),
                         template=hold_pod))
    env = {"GPUCLUSTER_NAMESPACE": namespace, "GPUCLUSTER_HOLD_JOB": HOLD, "GPUCLUSTER_IDLE_MINUTES": str(minutes),
           "GPUCLUSTER_NODES": str(nodes), "GPUCLUSTER_DEADLINE": f"{deadline:.0f}", "GPUCLUSTER_POLL": str(POLL_S)}
    watcher = k.V1Deployment(
        api_version="apps/v1", kind="Deployment", metadata=meta(NAME, "idle"),
        spec=k.V1DeploymentSpec(
            replicas=1, strategy=k.V1DeploymentStrategy(type="Recreate"),  # never two watchers at once
            selector=k.V1LabelSelector(match_labels=labels(cluster, "idle")),
            template=k.V1PodTemplateSpec(
                metadata=k.V1ObjectMeta(labels=labels(cluster, "idle")),
                spec=k.V1PodSpec(
                    service_account_name=NAME,
                    node_selector={"cloud.google.com/gke-nodepool": system_pool},
                    containers=[k.V1Container(
                        name="idle", image=IMAGE, command=["python", f"/gpucluster/{PROGRAM}"],
                        env=[k.V1EnvVar(name=key, value=value) for key, value in env.items()],
                        resources=k.V1ResourceRequirements(requests={"cpu": "10m", "memory": "32Mi"},
                                                           limits={"memory": "64Mi"}),
                        volume_mounts=[k.V1VolumeMount(name="program", mount_path="/gpucluster", read_only=True)])],
                    volumes=[k.V1Volume(name="program", config_map=k.V1ConfigMapVolumeSource(
                        name=NAME, items=[k.V1KeyToPath(key=PROGRAM, path=PROGRAM)]))]))))
    return {
        "serviceaccount": k.V1ServiceAccount(api_version="v1", kind="ServiceAccount", metadata=meta(NAME, "idle")),
        "role": role,
        "rolebinding": binding,
        "configmap": k.V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=meta(NAME, "idle"),
                                   data={PROGRAM: WATCHER}),
        "job": hold,
        "deployment": watcher,
    }


def install(api: KubeApi, objects: JsonObject, namespace: str, *, retry: Retry | None = None) -> list[str]:
    """Create the objects (the namespace first when it is not there). One that exists (a later `up` of the
    same stack) is replaced; the hold Job is raised to its parallelism again and its count restarts.
    Returns what was created or replaced ("kind name")."""
    retry = retry or Retry()
    k = kube_models()
    _namespace(api, namespace, retry, k)
    creates = {
        "serviceaccount": (api.core.create_namespaced_service_account, api.core.replace_namespaced_service_account),
        "role": (api.rbac.create_namespaced_role, api.rbac.replace_namespaced_role),
        "rolebinding": (api.rbac.create_namespaced_role_binding, api.rbac.replace_namespaced_role_binding),
        "configmap": (api.core.create_namespaced_config_map, api.core.replace_namespaced_config_map),
        "job": (api.batch.create_namespaced_job, None),
        "deployment": (api.apps.create_namespaced_deployment, api.apps.replace_namespaced_deployment),
    }
    done = []
    for kind in PARTS:
        body, (create, replace) = objects[kind], creates[kind]
        name = body.metadata.name
        try:
            retry.call(create, namespace, body)
        except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
            if not _is_api_error(exc) or _status(exc) != 409:
                raise _refused(kind, namespace, name, exc) from None
            try:
                if replace is None:  # the Job's pod template cannot change: its parallelism and count can
                    retry.call(api.batch.patch_namespaced_job, name, namespace, {
                        "metadata": {"annotations": dict(body.metadata.annotations)},
                        "spec": {"parallelism": body.spec.parallelism}})
                else:
                    retry.call(replace, name, namespace, body)
            except Exception as again:  # noqa: BLE001 - one line naming the object
                if not _is_api_error(again):
                    raise
                raise _refused(kind, namespace, name, again) from None
        done.append(f"{kind} {namespace}/{name}")
    return done


def _namespace(api: KubeApi, namespace: str, retry: Retry, k: ModuleType) -> None:
    """The job namespace exists (made here, before any run, so that no run's cleanup deletes it)."""
    if namespace == DEFAULT_NAMESPACE:
        return
    try:
        retry.call(api.core.read_namespace, namespace)
        return
    except Exception as exc:  # noqa: BLE001 - 404: create it
        if not _is_api_error(exc) or _status(exc) != 404:
            raise _refused("namespace", namespace, namespace, exc) from None
    body = k.V1Namespace(metadata=k.V1ObjectMeta(name=namespace, labels={"app.kubernetes.io/managed-by": "gpucluster"}))
    try:
        retry.call(api.core.create_namespace, body)
    except Exception as exc:  # noqa: BLE001 - 409: made meanwhile
        if not _is_api_error(exc) or _status(exc) != 409:
            raise _refused("namespace", namespace, namespace, exc) from None


def _refused(kind: str, namespace: str, name: str, exc: BaseException) -> LaunchError:
    hint = ("the application-default account needs roles/container.admin (creating a Role needs the permissions "
            "it grants)" if _status(exc) == 403 else None)
    return LaunchError(f"cannot install the idle stop: {kind} {namespace}/{name}: {_status(exc)} "
                       f"{getattr(exc, 'reason', exc)}", hint=hint)


def after_up(spec: ClusterSpec, cluster: Cluster, events: Any, api: KubeApi | None = None) -> None:
    # events: Any, as `Provisioner.after_up` hands them on typed `object`; they are ProvisionEvents
    """After `up` of a gcp stack: the idle stop installed when the spec asks for one (option idleMinutes)."""
    from .catalog import idle_minutes

    minutes = idle_minutes(spec)
    if not minutes:
        return
    outputs = dict(cluster.outputs or {})
    namespace = namespace_of(spec.options)
    deadline = time.time() + int(spec.max_lifetime_minutes) * 60  # the hold Job's activeDeadlineSeconds too
    objects = manifests(cluster=spec.name, namespace=namespace, minutes=minutes, nodes=int(spec.nodes),
                        deadline=deadline, gpu_pool=str(outputs.get("node_pool_name") or "gpu"),
                        system_pool=str(outputs.get("system_pool_name") or "system"))
    if api is None:
        from .gke import api_from_gke

        api = api_from_gke(str(cluster.kubeconfig or ""))
    install(api, objects, namespace)
    events.message(f"idle stop: the GPU nodes are released after {minutes} min without a gpucluster job "
                   f"(watcher {namespace}/{NAME} on the system pool); the cluster fee and the system pool "
                   f"bill until `gpucluster down {spec.name}`")

