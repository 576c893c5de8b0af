"""The `kubernetes` backend: an existing Kubernetes cluster a kubeconfig context reaches (on-prem,
EKS, GKE, k3d). Nothing is provisioned and nothing is priced by the catalog: the run's own namespaced
objects (a ConfigMap, a headless Service, an Indexed Job; a Secret with --secret) are made by the
Kubernetes launcher gcp uses (`infra.kubernetes`), labelled with the run and its owner, and nothing
else in the cluster is touched (other people's jobs run there).

Contract: `gpucluster.infra.contract`. `TRAITS` here (plain values); `plugin.PLUGIN` holds its parts.
Modules: options (the `--option` keys, checked), access (kubeconfig and context through the kubernetes
client's own loader), fit (nodes, GPUs, taints, ResourceQuota), permissions (SelfSubjectAccessReview),
platform (the launcher's `Platform`: API, queue, priority, selectors, tolerations), provider (preflight,
`up` that creates nothing, leftovers by the run's label), sweep (`gc --cloud kubernetes`)."""

from __future__ import annotations

from gpucluster.infra.contract import Capability, Traits

TRAITS = Traits(
    name="kubernetes",
    max_nodes=64,
    flags=("context", "namespace", "create_namespace",  # which cluster, and where in it
           "start_deadline",  # pods' scheduling (and Kueue admission) deadline
           "setup", "data", "resume"),  # as on gcp: through the exec API (infra.kubernetes.stage)
    flags_refused_why="kubernetes runs pods on an existing cluster through its API",
    # --gpu TYPE:COUNT: COUNT GPUs per pod on the nodes labelled with TYPE (gpus.py)
    capabilities=frozenset({Capability.GPU_SELECTS_NODES}),
)
