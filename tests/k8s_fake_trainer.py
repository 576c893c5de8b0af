"""FAKE Kubeflow Trainer v2 and JobSet controllers for tests/k8s_fake.py: a TrainJob becomes a JobSet,
the JobSet a headless Service and child Indexed Jobs (which the fake Job controller, tests/k8s_fake_jobs.py,
runs), on the controllers' own thread, as the real ones do. Checked against kubeflow/trainer v2.3.0 and
kubernetes-sigs/jobset v0.12.0; every rule with its source file:

- API discovery (`GET /apis/GROUP/VERSION`): a group's resources are served only while its CRDs are
  installed; otherwise 404 (Kubernetes docs, "Custom Resources"). `missing_crds` removes some.
- The Trainer's admission webhook refuses a TrainJob whose runtime does not exist (trainer
  pkg/runtime/core/clustertrainingruntime.go ValidateObjects: "must be created before the TrainJob is
  created"), PET_* names in spec.trainer.env (plugins/torch/torch.go Validate, TorchRunReservedEnvNames),
  a runtime patch naming a container or ReplicatedJob the runtime lacks, or setting the `node`
  container's env (plugins/jobset/jobset.go Validate) -> 422.
- The Trainer controller (pkg/runtime/core/trainingruntime.go newRuntimeInfo/mergeRuntimePatches, then
  plugins/jobset/jobset.go Build and builder.go Trainer, plugins/torch/torch.go EnforceMLPolicy): the
  runtime's JobSet template, strategic-merge patched by spec.runtimePatches (lists with names merge by
  name; tolerations are atomic), the `node` container gets spec.trainer's image/command/env and
  resourcesPerNode, PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK (the completion index)/PET_MASTER_ADDR
  `<trainjob>-node-0-0.<trainjob>`/PET_MASTER_PORT 29500 and the port; parallelism = completions =
  numNodes (jobset.go SyncParallelCount); the JobSet is named as the TrainJob, labelled with the
  template's and the patches' labels, owned by the TrainJob (controller, blockOwnerDeletion).
- The JobSet webhook's defaults (jobset pkg/webhooks/jobset_webhook.go Default): successPolicy All,
  completionMode Indexed, pod restartPolicy OnFailure when the template sets none, DNS hostnames on
  with subdomain = the JobSet's name.
- The JobSet controller (pkg/controllers/jobset_controller.go): a headless Service named the subdomain,
  selecting jobset.sigs.k8s.io/jobset-name, publishNotReadyAddresses true, owned by the JobSet
  (createHeadlessSvcIfNecessary), made before the Jobs; child Jobs `<jobset>-<replicatedJob>-<index>`
  (placement.GenJobName) with the JobSet's labels on the Job and its pod template and the pods'
  subdomain set (constructJob, labelAndAnnotateObject); no failurePolicy: the first failed child Job
  fails the JobSet (failure_policy.go executeFailurePolicy); every Job of every ReplicatedJob succeeded
  completes it (success_policy, operator All); once the JobSet is finished its active child Jobs are
  deleted with Foreground propagation (Reconcile: "If JobSet is already completed or failed, clean up
  active child jobs"), their running pods with them.
- The TrainJob's status mirrors the JobSet's Completed/Failed (plugins/jobset/jobset.go Status);
  spec.activeDeadlineSeconds from its creation: Failed, reason DeadlineExceeded, and its JobSet deleted
  (pkg/controller/trainjob_controller.go reconcileDeadline).
- Garbage collection: deleting the TrainJob (Foreground) deletes what it owns, and what they own:
  the JobSet, its Service and Jobs, their pods (Kubernetes docs, "Garbage Collection").
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

from k8s_fake_objects import FakeApiException

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
TRAINJOBS, JOBSETS = "trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

# kubeflow/trainer v2.3.0 manifests/base/runtimes/torch_distributed.yaml, as the API server stores it
TORCH_DISTRIBUTED = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
        "name": "node",
        "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {"containers": [
                         {"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]}}}}}]}}},
}

_uids = itertools.count(1)


def merge(base, patch):
    """A strategic merge patch, as far as JobSetSpec's lists go: lists of named objects (replicatedJobs,
    containers, volumes, volumeMounts, env) merge by name; other lists (tolerations: listType atomic)
    and scalars are replaced; maps merge key by key (apimachinery strategicpatch)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base and value is not None else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x
                                                                  for x in base + patch):
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            at = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = merge(out[at], item)
        return out
    return copy.deepcopy(patch)


def upsert_env(env: list, values: list) -> list:
    out = [e for e in env if e["name"] not in {v["name"] for v in values}]
    return out + [copy.deepcopy(v) for v in values]


@dataclass
class SetState:
    """What the JobSet controller keeps of one JobSet."""

    name: str
    namespace: str
    trainjob: str
    jobs: list
    created: float
    deadline_s: int | None = None
    condition: tuple[str, str] | None = None  # (Completed|Failed, reason)


class TrainerControllers:
    """Mixin for FakeKubeApi: the Trainer v2 controller and the JobSet controller."""

    def _start_trainer(self) -> None:
        self.cluster_runtimes = {"torch-distributed": copy.deepcopy(TORCH_DISTRIBUTED)}
        self.served = {TRAINER: {"trainjobs", "trainingruntimes", "clustertrainingruntimes"}, JOBSET: {"jobsets"}}
        self.jobsets: dict[str, SetState] = {}
        self.trainjob_status: dict[str, tuple[str, str]] = {}  # name -> (Complete|Failed, reason)
        self.pending_trainjobs: list[str] = []  # created, not yet reconciled by the Trainer controller

    # -- discovery and the runtime --------------------------------------------------------------
    def get_api_resources(self, group, version, **kw):
        self.calls.append(("discover", f"{group}/{version}"))
        self._authenticate()
        plurals = self.served.get((group, version))
        missing = getattr(self, "missing_crds", ())
        names = sorted(p for p in plurals or () if f"{p}.{group}" not in missing)
        if not names:
            raise FakeApiException(404, "the server could not find the requested resource")
        return {"kind": "APIResourceList", "groupVersion": f"{group}/{version}",
                "resources": [{"name": n, "namespaced": n != "clustertrainingruntimes"} for n in names]}

    def get_cluster_custom_object(self, group, version, plural, name, **kw):
        self.calls.append(("get", f"{plural}.{group}", "", name))
        self._authenticate()
        if (group, version) != TRAINER or plural != "clustertrainingruntimes" or name not in self.cluster_runtimes:
            raise FakeApiException(404, f'clustertrainingruntimes.trainer.kubeflow.org "{name}" not found')
        return copy.deepcopy(self.cluster_runtimes[name])

    # -- the Trainer's webhook and the TrainJob -------------------------------------------------
    def create_trainjob(self, namespace, body: dict):
        if TRAINJOBS in getattr(self, "missing_crds", ()):
            self.calls.append(("create", TRAINJOBS, namespace, body["metadata"]["name"]))
            raise FakeApiException(404, "the server could not find the requested resource")
        runtime = self.cluster_runtimes.get(body["spec"]["runtimeRef"]["name"])
        problems = []
        if runtime is None:
            problems.append("spec.runtimeRef: Invalid value: clustertrainingruntimes.trainer.kubeflow.org not found: "
                            "specified clusterTrainingRuntime must be created before the TrainJob is created")
        else:
            problems += self._patch_problems(body, runtime)
        reserved = sorted({e["name"] for e in (body["spec"].get("trainer") or {}).get("env") or []} & RESERVED_ENV)
        if reserved:
            problems.append(f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: "
                            f"{reserved}")
        if problems:
            self.calls.append(("create", TRAINJOBS, namespace, body["metadata"]["name"]))
            raise FakeApiException(422, "admission webhook denied the request: " + "; ".join(problems))
        body = copy.deepcopy(body)
        body["metadata"]["uid"] = f"uid-{next(_uids)}"
        self._create(TRAINJOBS, namespace, body)
        self.pending_trainjobs.append(body["metadata"]["name"])
        return body

    @staticmethod
    def _patch_problems(body: dict, runtime: dict) -> list[str]:
        jobs = {rj["name"]: {c["name"] for c in rj["template"]["spec"]["template"]["spec"].get("containers") or []}
                for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
        out = []
        for patch in body["spec"].get("runtimePatches") or []:
            if "/" not in patch.get("manager", ""):
                out.append("spec.runtimePatches.manager: Invalid value: must be a domain-prefixed path")
            spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
            for rj in spec.get("replicatedJobs") or []:
                if rj["name"] not in jobs:
                    out.append("spec.runtimePatches: must not have replicated job that doesn't exist in the runtime")
                    continue
                pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                    if c["name"] not in jobs[rj["name"]]:
                        out.append(f"spec.runtimePatches: must not have container that doesn't exist in the runtime "
                                   f"job {rj['name']}")
                    elif c.get("env") and c["name"] == "node":
                        out.append("spec.runtimePatches: must not have envs for the dataset-initializer, "
                                   "model-initializer, node containers")
        return out

    # -- one pass of the controllers (tests/k8s_fake_jobs.py calls it with the lock held) ------------
    def sync_trainer(self, now: float) -> None:
        while self.pending_trainjobs:
            name = self.pending_trainjobs.pop(0)
            body = self.objects.get((TRAINJOBS, name))
            if body is not None and (TRAINJOBS, name) not in self.terminating:
                self._reconcile_trainjob(body, now)
        for js in list(self.jobsets.values()):
            self._sync_jobset(js, now)

    def _as_controller(self, fn, *args):
        self._tls.controller = True
        try:
            return fn(*args)
        finally:
            self._tls.controller = False

    def _reconcile_trainjob(self, tj: dict, now: float) -> None:
        name, ns = tj["metadata"]["name"], self.object_ns[(TRAINJOBS, tj["metadata"]["name"])]
        runtime = self.cluster_runtimes[tj["spec"]["runtimeRef"]["name"]]
        template = copy.deepcopy(runtime["spec"]["template"])
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        spec = template["spec"]
        for patch in tj["spec"].get("runtimePatches") or []:
            t = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
            labels.update(((t.get("metadata") or {}).get("labels")) or {})
            spec = merge(spec, t.get("spec") or {})
        trainer = tj["spec"].get("trainer") or {}
        nodes = trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes") or 1
        for rj in spec["replicatedJobs"]:
            if (rj["template"].get("metadata") or {}).get("labels", {}).get(
                    "trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
                continue
            rj["replicas"] = 1
            rj["template"]["spec"]["parallelism"] = rj["template"]["spec"]["completions"] = nodes
            for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
                if c["name"] != "node":
                    continue
                for key in ("image", "command", "args"):
                    if trainer.get(key) is not None:
                        c[key] = trainer[key]
                if trainer.get("resourcesPerNode"):
                    c["resources"] = merge(c.get("resources") or {}, trainer["resourcesPerNode"])
                c["env"] = upsert_env(c.get("env") or [], (trainer.get("env") or []) + [
                    {"name": "PET_NNODES", "value": str(nodes)},
                    {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode") or "auto")},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
                    {"name": "PET_MASTER_PORT", "value": "29500"}])
                c["ports"] = merge(c.get("ports") or [], [{"containerPort": 29500}]) if c.get("ports") else [
                    {"containerPort": 29500}]
        # the JobSet webhook's defaults
        spec.setdefault("successPolicy", {"operator": "All"})
        for rj in spec["replicatedJobs"]:
            rj["template"]["spec"].setdefault("completionMode", "Indexed")
            rj["template"]["spec"]["template"]["spec"].setdefault("restartPolicy", "OnFailure")
        network = spec.setdefault("network", {})
        network.setdefault("enableDNSHostnames", True)
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                  "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"uid-{next(_uids)}",
                               "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                    "name": name, "uid": tj["metadata"]["uid"], "controller": True,
                                                    "blockOwnerDeletion": True}]},
                  "spec": spec}
        self._as_controller(self._create, JOBSETS, ns, jobset)
        state = self.jobsets[name] = SetState(name=name, namespace=ns, trainjob=name, jobs=[], created=now,
                                              deadline_s=tj["spec"].get("activeDeadlineSeconds"))
        self._as_controller(self._jobset_children, jobset, state)

    def _jobset_children(self, js: dict, state: SetState) -> None:
        from kubernetes import client

        name, ns, spec = js["metadata"]["name"], state.namespace, js["spec"]
        owner = client.V1OwnerReference(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet", name=name,
                                        uid=js["metadata"]["uid"], controller=True, block_owner_deletion=True)
        subdomain = spec["network"].get("subdomain") or name
        self._create("service", ns, client.V1Service(
            api_version="v1", kind="Service",
            metadata=client.V1ObjectMeta(name=subdomain, namespace=ns, owner_references=[owner]),
            spec=client.V1ServiceSpec(cluster_ip="None", selector={JOBSET_NAME: name},
                                      publish_not_ready_addresses=spec["network"].get("publishNotReadyAddresses", True))))
        api = client.ApiClient()
        for rj in spec["replicatedJobs"]:
            for idx in range(rj.get("replicas", 1)):
                job_name = f"{name}-{rj['name']}-{idx}"
                extra = {JOBSET_NAME: name, "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                         "jobset.sigs.k8s.io/job-index": str(idx), "jobset.sigs.k8s.io/restart-attempt": "0"}
                tmpl = copy.deepcopy(rj["template"])
                meta = tmpl.get("metadata") or {}
                pod = tmpl["spec"]["template"]
                pod.setdefault("metadata", {})["labels"] = {**(pod["metadata"].get("labels") or {}), **extra}
                pod["spec"]["subdomain"] = subdomain
                body = {"apiVersion": "batch/v1", "kind": "Job", "spec": tmpl["spec"], "metadata": {
                    "name": job_name, "namespace": ns, "labels": {**(meta.get("labels") or {}), **extra},
                    "ownerReferences": [api.sanitize_for_serialization(owner)]}}
                job = api._ApiClient__deserialize(body, "V1Job")
                self.create_namespaced_job(ns, job)
                state.jobs.append(job_name)

    def _sync_jobset(self, state: SetState, now: float) -> None:
        if state.condition is None:
            conditions = [self.job_condition(j) for j in state.jobs if j in self.jobs]
            if any(c is not None and c[0] == "Failed" for c in conditions):
                state.condition = ("Failed", "FailedJobs")
            elif len(conditions) == len(state.jobs) and all(c is not None and c[0] == "Complete" for c in conditions):
                state.condition = ("Completed", "AllJobsCompleted")
            if state.condition is not None:
                self.trainjob_status[state.trainjob] = ("Complete" if state.condition[0] == "Completed" else "Failed",
                                                        state.condition[1])
                for job in state.jobs:  # the finished JobSet deletes its active child Jobs (Foreground)
                    cond = self.job_condition(job)
                    if job in self.jobs and (cond is None or cond[0] not in ("Complete", "Failed")):
                        self._delete_owned("job", job)
        if state.condition is None and state.deadline_s and now - state.created >= state.deadline_s:
            self.trainjob_status[state.trainjob] = ("Failed", "DeadlineExceeded")
            self._delete_jobset(state.name)

    # -- garbage collection -------------------------------------------------------------------------
    def _delete_owned(self, kind: str, name: str) -> None:
        if (kind, name) in self.objects and (kind, name) not in self.terminating:
            self.terminating[(kind, name)] = self.delete_ticks or 1
        if kind == "job":
            self.jobs.pop(name, None)
            self._terminate_pods(name)

    def _delete_jobset(self, name: str) -> None:
        state = self.jobsets.pop(name, None)
        if state is None:
            return
        self._delete_owned(JOBSETS, name)
        for job in state.jobs:
            self._delete_owned("job", job)
        for (kind, obj), body in list(self.objects.items()):
            refs = getattr(getattr(body, "metadata", None), "owner_references", None) or []
            if kind == "service" and any(r.kind == "JobSet" and r.name == name for r in refs):
                self._delete_owned("service", obj)

    def delete_trainjob(self, namespace, name, body=None):
        self._delete(TRAINJOBS, name, namespace, body)
        self.trainjob_status.pop(name, None)
        with_lock = self.lock.acquire(timeout=5)
        try:
            self._delete_jobset(name)
        finally:
            if with_lock:
                self.lock.release()
