"""The Kubernetes objects of a run, built from its `Plan` (`infra.kubernetes.plan`) with the
kubernetes client's typed models: the ConfigMap, the headless Service, the pod template (all the
node's GPUs, the GPU taint tolerated, one pod per node), the Indexed Job, the Kubeflow PyTorchJob
(a plain dict: a custom resource), and `rank_of(pod)`, the node rank of a pod of either kind.
The `kubernetes` package is imported lazily."""


from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from .api import KubeObject

from gpucluster.errors import require

from .plan import (CACHE_HOST_PATH, CACHE_MOUNT, GPU_RESOURCE, GPU_TAINT_KEY, INDEX_ANNOTATION, JOB_LABEL,
                       KEEPER, KUBEFLOW_GROUP, KUBEFLOW_VERSION, MOUNT, RUN_DIR, TTL_AFTER_FINISHED_S, Plan)


# -- manifests (the kubernetes client's typed models) ---------------------------------------
def kube_models():
    """`kubernetes.client` (its typed models), imported on first use."""
    return require("kubernetes.client", "gcp")


def config_map_manifest(plan: Plan):
    k = kube_models()
    return k.V1ConfigMap(
        api_version="v1", kind="ConfigMap",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        data={key: content for key, _, content in plan.files if isinstance(content, str)},
        binary_data={key: base64.b64encode(content).decode() for key, _, content in plan.files
                     if isinstance(content, bytes)} or None,
    )


def secret_manifest(plan: Plan, values: dict[str, str]):
    """The run's own Secret: the --secret values the pods' environment refers to (`pod_template`),
    created before the Job and deleted with it. Built at creation time and never kept."""
    k = kube_models()
    return k.V1Secret(
        api_version="v1", kind="Secret", type="Opaque",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        data={key: base64.b64encode(value.encode()).decode() for key, value in values.items()},
    )


def service_manifest(plan: Plan):
    """Headless: no virtual IP, one DNS record per pod, published before the pods are ready."""
    k = kube_models()
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
    k = kube_models()
    env = [k.V1EnvVar(name=key, value=value) for key, value in plan.env]
    env += [k.V1EnvVar(name=key, value_from=k.V1EnvVarSource(secret_key_ref=k.V1SecretKeySelector(
        name=plan.name, key=key))) for key in plan.secrets]  # the values stay in the run's Secret
    if plan.mode == "job":
        env.insert(0, k.V1EnvVar(
            name="GPUCLUSTER_NODE_RANK",
            value_from=k.V1EnvVarSource(
                field_ref=k.V1ObjectFieldSelector(field_path=f"metadata.annotations['{INDEX_ANNOTATION}']")
            ),
        ))
    limits = {GPU_RESOURCE: str(plan.gpus_per_node)} if plan.gpus_per_node else None
    requests = dict(plan.requests) or None  # CPU and memory (plan.pod_requests): not a BestEffort pod
    container = k.V1Container(
        name=plan.app_container,
        image=plan.image,
        command=["python", f"{MOUNT}/entry.py"],
        env=env,
        ports=[k.V1ContainerPort(name="rdzv", container_port=plan.rdzv_port)],
        resources=k.V1ResourceRequirements(limits=limits, requests=requests),
        volume_mounts=[
            k.V1VolumeMount(name="gpucluster", mount_path=MOUNT, read_only=True),
            k.V1VolumeMount(name="dshm", mount_path="/dev/shm"),  # DataLoader workers share memory
        ] + ([k.V1VolumeMount(name="run", mount_path=RUN_DIR)] if plan.run_dir else [])
          + ([k.V1VolumeMount(name="data-cache", mount_path=CACHE_MOUNT)] if plan.cache else []),
    )
    containers = [container]
    if plan.exec_container == KEEPER:  # keeps the pod running for exec once torchrun has ended (pod_keeper.py)
        containers.append(k.V1Container(
            name=KEEPER, image=plan.image, command=["python", f"{MOUNT}/keeper.py"],
            env=[k.V1EnvVar(name=key, value=value) for key, value in plan.keeper_env],
            resources=k.V1ResourceRequirements(requests={"cpu": "10m", "memory": "32Mi"}),
            volume_mounts=[m for m in container.volume_mounts if m.name != "dshm"]))
    init = None
    # job mode: every pod's DNS record, before the app container (the head's rendezvous port is waited for
    # in the app container, before torchrun: see pod_wait.py); the operator adds its own waiting init
    # container to PyTorchJob workers
    if plan.mode == "job":
        init = [k.V1Container(
            name="wait-for-peers", image=plan.image,
            command=["python", f"{MOUNT}/wait.py", "dns", ",".join(plan.hosts), str(plan.rdzv_port),
                     str(plan.start_deadline_s)],
            env=[e for e in env if e.name == "GPUCLUSTER_NODE_RANK"],
            volume_mounts=[k.V1VolumeMount(name="gpucluster", mount_path=MOUNT, read_only=True)],
        )]
    spec = k.V1PodSpec(
        restart_policy="Never",
        init_containers=init,
        containers=containers,
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
        ] + ([k.V1Volume(name="run", empty_dir=k.V1EmptyDirVolumeSource())] if plan.run_dir else [])
          # --data: the node's content-addressed cache outlives the pod (a kept cluster's rerun
          # sends only what the node lacks); GKE Standard allows hostPath volumes
          + ([k.V1Volume(name="data-cache", host_path=k.V1HostPathVolumeSource(
              path=CACHE_HOST_PATH, type="DirectoryOrCreate"))] if plan.cache else []),
        termination_grace_period_seconds=15,
        service_account_name=plan.service_account,
    )
    if plan.mode == "job":
        spec.subdomain = plan.name  # <job>-<index>.<service> resolves to the pod
    return k.V1PodTemplateSpec(metadata=k.V1ObjectMeta(labels=plan.label_dict), spec=spec)


def job_manifest(plan: Plan):
    k = kube_models()
    return k.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace, labels=plan.label_dict),
        spec=k.V1JobSpec(
            completion_mode="Indexed",
            completions=plan.nodes,
            parallelism=plan.nodes,
            # one failed, lost or deleted pod fails its index only: the others keep running (and keep
            # their outputs and checkpoints) until the launcher has stopped and copied them; with the
            # global `backoffLimit: 0` the Job controller would terminate them all at the first
            # (Kubernetes docs, "Jobs": "Backoff limit per index", GA in 1.33, "the Job executes all
            # indexes by default"; job_controller.go isPodFailed counts a deleted pod as failed).
            # No index is retried: a replacement pod would rejoin a rendezvous that has moved on.
            backoff_limit_per_index=0,
            active_deadline_seconds=plan.active_deadline_s,
            ttl_seconds_after_finished=TTL_AFTER_FINISHED_S,
            template=pod_template(plan),
        ),
    )


def pytorchjob_manifest(plan: Plan) -> JsonObject:
    """A Kubeflow PyTorchJob (training operator, kubeflow.org/v1): Master + (nodes-1) Workers."""
    k = kube_models()
    template = k.ApiClient().sanitize_for_serialization(pod_template(plan))
    replicas: JsonObject = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if plan.nodes > 1:
        replicas["Worker"] = {"replicas": plan.nodes - 1, "restartPolicy": "Never", "template": template}
    # cleanPodPolicy None: the operator deletes no pod when the job ends (All deletes every pod once the
    # Master completes, workers still being copied from included: kubeflow/training-operator
    # pkg/controller.v1/common/job.go, CleanupJob); the launcher deletes the PyTorchJob after the copy.
    run_policy: JsonObject = {"cleanPodPolicy": "None", "backoffLimit": 0,
                                  "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S}
    if plan.active_deadline_s:
        run_policy["activeDeadlineSeconds"] = plan.active_deadline_s
    return {
        "apiVersion": f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": plan.name, "namespace": plan.namespace, "labels": plan.label_dict},
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def trainjob_manifest(plan: Plan) -> JsonObject:
    """A Kubeflow Trainer v2 TrainJob on the torch ClusterTrainingRuntime (`infra.kubernetes.trainjob`)."""
    from .trainjob import trainjob_manifest as build

    k = kube_models()
    return build(plan, k.ApiClient().sanitize_for_serialization(pod_template(plan)))


def rank_of(pod: KubeObject, plan: Plan) -> int | None:
    """The node rank of one of the job's pods, or None for a pod that is not one of ours."""
    return rank_in(pod, plan.mode)


def rank_in(pod: KubeObject, mode: str) -> int | None:
    """The node rank of a pod of a job of launcher `mode` (job: its completion index; pytorchjob: the
    operator's replica labels), or None."""
    meta = pod.metadata
    if mode in ("job", "trainjob"):  # a TrainJob's pods are its JobSet's child Job's: Indexed as well
        value = (meta.annotations or {}).get(INDEX_ANNOTATION) or (meta.labels or {}).get(INDEX_ANNOTATION)
        return int(value) if value is not None and str(value).isdigit() else None
    labels = meta.labels or {}
    kind = (labels.get("training.kubeflow.org/replica-type") or "").lower()
    index = labels.get("training.kubeflow.org/replica-index")
    if index is None or not str(index).isdigit():
        return None
    return 0 if kind == "master" else int(index) + 1 if kind == "worker" else None
