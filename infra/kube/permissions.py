"""Whether the kubeconfig's user may do everything a run will do in its namespace, asked before anything
is created, with one SelfSubjectAccessReview per verb and resource (Kubernetes docs, "Authorization":
"Checking API access"; `kubectl auth can-i` sends the same object: POST
/apis/authorization.k8s.io/v1/selfsubjectaccessreviews, `spec.resourceAttributes` {namespace, verb,
group, resource, subresource}, answered with `status.allowed`). The API server answers it for any
authenticated user; RBAC decides (Kubernetes docs, "Using RBAC Authorization").

What a run uses (infra/kubernetes: objects.py creates and deletes, gone.py lists by label, pods.py
lists pods and reads their logs and events, stage.py/outputs.py/check.py exec into them, connect.py
forwards ports for `gpucluster ssh -L`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeClient

# (API group, resource, verbs); "pods/exec" is a subresource: exec and port-forward are `create` on them
# (a websocket upgrade of GET was also allowed by `get` until Kubernetes 1.30: KEP-4006; `create` is the one
# both old and new API servers accept)
COMMON = (
    ("", "configmaps", ("create", "get", "list", "delete")),
    ("", "pods", ("get", "list")),
    ("", "pods/log", ("get",)),
    ("", "pods/exec", ("create",)),
    ("", "pods/portforward", ("create",)),
    ("", "events", ("list",)),
)
JOB = (
    ("", "services", ("create", "get", "list", "delete")),
    ("batch", "jobs", ("create", "get", "list", "delete")),
)
PYTORCHJOB = (("kubeflow.org", "pytorchjobs", ("create", "get", "list", "delete")),)
SECRETS = (("", "secrets", ("create", "list", "delete")),)
NAMESPACE = (("", "namespaces", ("create", "get", "delete")),)  # cluster-scoped: --create-namespace


def needed(mode: str, secrets: bool, create_namespace: bool) -> list[tuple[str, str, str, bool]]:
    """[(group, resource, verb, namespaced)] a run of launcher `mode` uses."""
    rules = COMMON + (JOB if mode == "job" else PYTORCHJOB) + (SECRETS if secrets else ())
    out = [(g, r, v, True) for g, r, verbs in rules for v in verbs]
    if create_namespace:
        out += [(g, r, v, False) for g, r, verbs in NAMESPACE for v in verbs]
    return out


def review(api_client: KubeClient, namespace: str, group: str, resource: str, verb: str, namespaced: bool) -> bool:
    from kubernetes import client

    res, _, sub = resource.partition("/")
    body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(namespace=namespace if namespaced else None, verb=verb,
                                                        group=group, resource=res, subresource=sub or None)))
    answer = client.AuthorizationV1Api(api_client).create_self_subject_access_review(body)
    return bool(answer.status and answer.status.allowed)


def missing(api_client: KubeClient, namespace: str, rules: Iterable[tuple[str, str, str, bool]]) -> list[str]:
    """"verb resource in namespace N" for each one the user may not do."""
    out = []
    for group, resource, verb, namespaced in rules:
        if not review(api_client, namespace, group, resource, verb, namespaced):
            name = f"{resource}.{group}" if group else resource
            out.append(f"{verb} {name}" + (f" in namespace {namespace}" if namespaced else " (cluster-wide)"))
    return out


def check(api_client: KubeClient, namespace: str, context: str, rules: list[tuple[str, str, str, bool]]) -> None:
    """A UsageError naming the first missing permission (and how many more), before anything exists."""
    lacking = missing(api_client, namespace, rules)
    if lacking:
        more = f" (and {len(lacking) - 1} more: {'; '.join(lacking[1:])})" if len(lacking) > 1 else ""
        raise UsageError(f"context {context!r} may not {lacking[0]}{more}: a run needs it; ask the cluster's "
                         "admin for a Role with it (`kubectl auth can-i --list -n " + namespace + "` shows yours)")
