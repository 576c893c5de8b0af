"""`gpucluster run --cloud kubernetes --dry-run`: the objects a run would create, built by the launcher's own
code (plan and manifests, the user's options added by the platform's `shape`) and serialized as the API
server would receive them, without reaching the cluster; and the checks a real run makes before creating
anything that a dry run therefore skipped. The ConfigMap is shown by its keys and sizes (it carries whole
files: the workloads, the entry script, the script folder)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.domain import Cluster

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.launcher import KubernetesLauncher
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import JobSpec

SKIPPED = ("the API server answering and accepting the context's credentials",
           "the namespace existing (made only with --create-namespace)",
           "permissions: a SelfSubjectAccessReview for every verb and resource the run uses",
           "fit: the nodes' allocatable GPUs, their labels, taints and cordons, the GPUs other pods hold now",
           "the namespace's ResourceQuota and LimitRanges", "the Kueue LocalQueue (with --option queue)")


def preview(spec: ClusterSpec, job: JobSpec, launcher: KubernetesLauncher) -> dict[str, object]:
    import yaml
    from kubernetes.client import ApiClient

    from gpucluster.infra.kubernetes.manifests import config_map_manifest, job_manifest, pytorchjob_manifest, \
        service_manifest
    from gpucluster.infra.kubernetes.plan import plan_job

    from . import options
    from .gpus import PRODUCT_LABEL, assumed
    from .platform import kube_platform

    gpu = options.gpu(spec)
    if gpu:  # the nodes are not read: the selector the rule gives (gpus.py `KNOWN`, or the value the user pinned)
        launcher.platform = kube_platform(spec.option_dict, assumed(gpu, options.pinned_product(spec)))
    cluster = Cluster(name=spec.name, cloud=spec.cloud, nodes=(), gpus_per_node=spec.gpus_per_node or 0,
                      outputs={"nodes": spec.nodes, "max_lifetime_minutes": spec.max_lifetime_minutes})
    namespace = str(spec.option("namespace") or launcher.namespace)
    plan = plan_job(cluster, job, namespace=namespace, image=launcher.image, mode=launcher.mode,
                    start_deadline_s=launcher.start_deadline_s, collect_wait_s=launcher.collect_wait_s,
                    platform=launcher.platform)
    shape, client = launcher.platform.shape, ApiClient()
    config = client.sanitize_for_serialization(config_map_manifest(plan))
    config["data"] = {k: f"({len(v)} characters)" for k, v in (config.get("data") or {}).items()}
    config["binaryData"] = {k: f"({len(v)} base64 characters)" for k, v in (config.get("binaryData") or {}).items()}
    docs = [config]
    if plan.mode == "job":
        docs += [client.sanitize_for_serialization(shape("service", service_manifest(plan))),
                 client.sanitize_for_serialization(shape("job", job_manifest(plan)))]
    else:
        docs.append(shape("pytorchjob", pytorchjob_manifest(plan)))
    from gpucluster.errors import LaunchError
    from gpucluster.infra.kubernetes.schema import errors, model_of

    for doc in docs:  # as the API server's strict field validation would judge them (a failure is a bug here)
        wrong = errors(doc) if model_of(doc) else []
        if wrong:
            raise LaunchError(f"the {doc.get('kind')} gpucluster built is not valid: {'; '.join(wrong[:3])}")
    import kubernetes

    checked = [str(d.get("kind")) for d in docs if model_of(d)]
    unchecked = [str(d.get("kind")) for d in docs if not model_of(d)]
    context = spec.option("context") or "(the kubeconfig's current context)"
    lines = [f"dry run: {len(docs)} object(s) would be created in context {context}, namespace {namespace}, "
             "each labelled with the run and its owner; nothing was created and the cluster was not reached",
             f"validated against the Kubernetes API schema (kubernetes client {kubernetes.__version__}: every field "
             f"known, every type right): {', '.join(checked)}"
             + (f"; not validated (no schema here for a custom resource): {', '.join(unchecked)}" if unchecked else ""),
             yaml.safe_dump_all(docs, sort_keys=False).rstrip(),
             "not checked (a dry run does not reach the cluster; a real run checks each before creating anything):"]
    skipped = list(SKIPPED) + ([f"the GPU labels: which nodes carry GPU {gpu} ({PRODUCT_LABEL}); the selector above "
                                f"is the rule's ({', '.join(assumed(gpu, options.pinned_product(spec)).products)}), "
                                "a real run selects the values its nodes carry"] if gpu else [])
    lines += [f"  - {s}" for s in skipped]
    return {"text": "\n".join(lines), "objects": docs, "skipped": skipped}
