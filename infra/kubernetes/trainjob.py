"""The `trainjob` launcher's Kubeflow Trainer v2 parts: the TrainJob built from a run's pod template,
and the check, before anything is created, that the cluster serves what it needs.

Checked against kubeflow/trainer v2.3.0 and kubernetes-sigs/jobset v0.12.0 (their sources):

- A TrainJob (`trainer.kubeflow.org/v1alpha1`, pkg/apis/trainer/v1alpha1/trainjob_types.go) names its
  runtime in `spec.runtimeRef` (kind ClusterTrainingRuntime by default); ours is the torch runtime of
  Trainer's manifests, `torch-distributed` (manifests/base/runtimes/torch_distributed.yaml: one
  ReplicatedJob `node`, labelled trainjob-ancestor-step=trainer, one container `node`).
- `spec.trainer` sets that container's image, command, env and resources and the node count
  (pkg/runtime/framework/plugins/jobset/builder.go `Trainer`; pkg/runtime/core/trainingruntime.go
  newRuntimeInfo merges resourcesPerNode); the torch plugin adds PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK (the completion index) and PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>`
  (pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy) and refuses those names in
  `spec.trainer.env`. Our torchrun argv gives the same values explicitly.
- Everything else of our pod (volumes, the `node` container's mounts, tolerations, node selector,
  anti-affinity, service account, grace period, labels) goes in `spec.runtimePatches` (a strategic
  merge patch of the runtime's JobSet template, trainingruntime.go mergeRuntimePatches); a patch may
  name only containers the runtime has and may not set the `node` container's env
  (plugins/jobset/jobset.go Validate), so there is no keeper container and no init container: the
  entry script keeps the container itself and the DNS wait runs before torchrun (plan.py).
- The JobSet the Trainer makes has the TrainJob as its controller owner (jobset.go Build), the JobSet
  owns its child Jobs and its headless Service (jobset_controller.go createJobs, createHeadlessSvcIfNecessary),
  so deleting the TrainJob with Foreground propagation removes them all (Kubernetes garbage collection).
- `spec.activeDeadlineSeconds`: the Trainer fails the TrainJob and its pods are terminated once reached
  (trainjob_types.go; pkg/controller/trainjob_controller.go reconcileDeadline).
"""

from __future__ import annotations

import copy

from gpucluster.errors import ConfigError
from gpucluster.states import JsonObject

from .api import KubeApi, Retry, _is_api_error, _status
from .plan import (JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, RUNTIME_PLURAL, TORCH_RUNTIME, TRAINER_GROUP,
                   TRAINER_NODE, TRAINER_VERSION, TRAINJOB_PLURAL, Plan)

TRAINER_RELEASE, JOBSET_RELEASE = "v2.3.0", "v0.12.0"  # the versions this launcher was checked against
PATCH_MANAGER = "gpucluster.dev/launcher"  # a runtime patch's manager: a domain-prefixed path (jobset.go Validate)


def install_hint() -> str:
    """How to install Trainer v2 with its runtimes (and JobSet, which its manager overlay includes)."""
    base = "https://github.com/kubeflow/trainer.git/manifests/overlays"
    return (f"install Kubeflow Trainer {TRAINER_RELEASE} (it brings JobSet {JOBSET_RELEASE}): kubectl apply "
            f"--server-side -k \"{base}/manager?ref={TRAINER_RELEASE}\" && kubectl apply --server-side -k "
            f"\"{base}/runtimes?ref={TRAINER_RELEASE}\"")


def trainjob_manifest(plan: Plan, template: JsonObject) -> JsonObject:
    """The TrainJob of `plan`, from its pod template as plain JSON (`manifests.pod_template`)."""
    spec = copy.deepcopy(template["spec"])
    app = next(c for c in spec["containers"] if c["name"] == TRAINER_NODE)
    pod_patch: JsonObject = {
        "volumes": spec.get("volumes") or [],
        "containers": [{"name": TRAINER_NODE, "volumeMounts": app.get("volumeMounts") or []}],
        "tolerations": spec.get("tolerations") or [],
        "affinity": spec.get("affinity"),
        "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds"),
    }
    if spec.get("nodeSelector"):
        pod_patch["nodeSelector"] = spec["nodeSelector"]
    if spec.get("serviceAccountName"):
        pod_patch["serviceAccountName"] = spec["serviceAccountName"]
    labels = plan.label_dict
    trainer: JsonObject = {"image": app["image"], "command": app["command"], "env": app.get("env") or [],
                               "numNodes": plan.nodes}
    if app.get("resources"):
        trainer["resourcesPerNode"] = app["resources"]
    body: JsonObject = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": plan.name, "namespace": plan.namespace, "labels": labels},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME, "apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime"},
            "trainer": trainer,
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {
                "metadata": {"labels": labels},
                "spec": {"replicatedJobs": [{"name": TRAINER_NODE, "template": {
                    "metadata": {"labels": labels},
                    "spec": {"template": {"metadata": {"labels": labels}, "spec": pod_patch}}}}]}}}}],
        },
    }
    if plan.active_deadline_s:
        body["spec"]["activeDeadlineSeconds"] = plan.active_deadline_s
    return body


def _served(api: KubeApi, group: str, version: str, retry: Retry) -> set[str] | None:
    """The resources `group/version` serves (API discovery, readable by every authenticated user:
    the system:discovery ClusterRole), or None when the group/version is not served (404)."""
    try:
        found = retry.call(api.custom.get_api_resources, group, version)
    except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
        if not _is_api_error(exc) or _status(exc) != 404:
            raise
        return None
    items = found.get("resources") if isinstance(found, dict) else getattr(found, "resources", None)
    return {str(r.get("name") if isinstance(r, dict) else r.name) for r in items or []}


def require_trainer(api: KubeApi, retry: Retry) -> None:
    """The TrainJob, ClusterTrainingRuntime and JobSet resource types are served and the torch runtime
    exists, else a ConfigError (exit 2) naming what is missing and how to install it; nothing is created."""
    missing = []
    trainer = _served(api, TRAINER_GROUP, TRAINER_VERSION, retry) or set()
    for plural in (TRAINJOB_PLURAL, RUNTIME_PLURAL):
        if plural not in trainer:
            missing.append(f"{plural}.{TRAINER_GROUP}/{TRAINER_VERSION}")
    if JOBSET_PLURAL not in (_served(api, JOBSET_GROUP, JOBSET_VERSION, retry) or set()):
        missing.append(f"{JOBSET_PLURAL}.{JOBSET_GROUP}/{JOBSET_VERSION}")
    if missing:
        raise ConfigError(f"launcher trainjob needs {', '.join(missing)}, which this cluster does not serve: "
                          f"{install_hint()}; or use the default launcher (an Indexed Job, no operator); "
                          "nothing was created")
    try:
        retry.call(api.custom.get_cluster_custom_object, TRAINER_GROUP, TRAINER_VERSION, RUNTIME_PLURAL,
                   TORCH_RUNTIME)
    except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
        if not _is_api_error(exc) or _status(exc) not in (403, 404):
            raise
        if _status(exc) == 404:
            raise ConfigError(f"launcher trainjob needs the ClusterTrainingRuntime {TORCH_RUNTIME!r}, which this "
                              f"cluster does not have: {install_hint()}; nothing was created") from None
        # 403: a namespaced user may not read cluster-scoped runtimes; Trainer's webhook refuses a TrainJob
        # whose runtime is missing (trainingruntime.go ValidateObjects), before any pod exists
