"""FAKE Kubernetes API, the parts "someone else's cluster" adds for `--cloud kubernetes` (tests/k8s_fake.py says
what the whole fake is; tests/k8s_fake_http.py serves it): nodes with allocatable GPUs, labels, taints and
cordons; other people's pods holding GPUs; a namespace's ResourceQuota; SelfSubjectAccessReview answered
from the same RBAC model the requests go through (tests/k8s_fake_rbac.py); ClusterRoleBindings for the
cluster-scoped reads. `install(fake)` adds them to a fake served over HTTP (its routes go first). Each
behaviour from its source:

- Nodes (Kubernetes API reference, `Node`: `status.allocatable`, `metadata.labels`, `spec.taints`,
  `spec.unschedulable`): GET /api/v1/nodes lists them; a node is cluster-scoped, so a user whose only grants
  are a namespaced Role may not list them (RBAC docs: "Role ... always sets permissions within a particular
  namespace"; nodes need a ClusterRole): 403.
- Pods of every namespace (GET /api/v1/pods): cluster-scoped likewise; each bound pod's containers' requests
  count against its node's allocatable (the scheduler's NodeResourcesFit).
- ResourceQuota (Kubernetes docs, "Resource Quotas"): GET /api/v1/namespaces/NS/resourcequotas lists
  `spec.hard` and the quota controller's `status.hard`/`status.used`; a create that would take `used` over
  `hard` is refused at admission with 403 `exceeded quota: NAME, requested: ..., used: ..., limited: ...`,
  and so is a pod that does not state a resource the quota limits (`must specify requests.cpu`). Modelled
  for the counted objects this backend makes (configmaps, services, jobs) at their create.
- LimitRange (Kubernetes docs, "Limit Ranges"): GET /api/v1/namespaces/NS/limitranges lists
  `fake.limit_ranges[NS]` as the API server stores them (defaulted), and a Job whose pods they refuse gets no pod
  (the LimitRanger admission of each pod create): tests/k8s_fake_limits.py, with its sources.
- SelfSubjectAccessReview (Kubernetes docs, "Authorization", checking API access; `kubectl auth can-i`):
  POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews is allowed to every authenticated user (the
  `system:basic-user` ClusterRole) and answered with `status.allowed` as the authorizer would decide the
  request described by `spec.resourceAttributes`: here the Roles and RoleBindings of the namespace for a
  service account's token (tests/k8s_fake_rbac.py `authorize`), everything for an admin's token.
- Kueue (Kueue docs, "Run a Job" and "Overview"): a Job labelled `kueue.x-k8s.io/queue-name` is suspended by
  Kueue's webhook when it is created (`spec.suspend: true`), so the Job controller makes no pods (Kubernetes docs,
  "Jobs": suspending a Job); once its Workload is admitted Kueue un-suspends it and the pods are created.
  `kueue(fake, admit_after_s)` admits each queued Job that many seconds after its create (checked at each pod
  listing, the clock of this fake's controllers); a Job deleted while it waits never gets pods. Its LocalQueues
  (`fake.local_queues`: namespace -> names) are read by name at GET
  /apis/kueue.x-k8s.io/v1beta1/namespaces/NS/localqueues/NAME (404 for another name, as for a cluster
  without Kueue's CRDs), each pointing at ClusterQueue `cluster-queue`; `fake.cluster_queues` are served at GET
  /apis/kueue.x-k8s.io/v1beta1/clusterqueues/NAME (cluster-scoped: a namespaced Role cannot grant it, 403), and
  a queued Job whose GPUs are over the ClusterQueue's capacity is never admitted (`kueue_capacity`, with its
  source; `fake.never_admitted` keeps the workload's message).
- Other owners' objects live in the same namespaces and are never ours to touch: the tests put them there.
- `schedule(fake)`: the run's pods are placed on these nodes by tests/k8s_fake_sched.py's scheduler (their
  nodeSelector, required node affinity, taints, pod anti-affinity and free resources, with the sources named
  there), other people's pods holding their GPUs; without it a pod is placed wherever the fake puts it.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import k8s_fake_http
from k8s_fake_limits import pod_refusals, served
from k8s_fake_objects import FakeApiException
from k8s_fake_rbac import authorize as namespaced_authorize

SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CLUSTER_PATHS = {"/api/v1/nodes": ("", "nodes"), "/api/v1/pods": ("", "pods"), "/api/v1/namespaces": ("", "namespaces")}
CLUSTER_QUEUES = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/"
VERB_METHOD = {"create": "POST", "get": "GET", "list": "GET", "delete": "DELETE", "update": "PUT", "patch": "PATCH",
               "watch": "GET"}


def node(name: str, gpus: int, resource: str = "nvidia.com/gpu", *, labels: dict | None = None,
         taints: list | None = None, unschedulable: bool = False) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable or None},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", resource: str(gpus)} if gpus else
                       {"cpu": "32", "memory": "128Gi"}}}


def foreign_pod(name: str, namespace: str, node_name: str, gpus: int, resource: str = "nvidia.com/gpu") -> dict:
    """Someone else's running pod holding `gpus` on `node_name`."""
    return {"metadata": {"name": name, "namespace": namespace, "labels": {"app": "their-training"}},
            "spec": {"nodeName": node_name, "containers": [{"name": "train", "image": "theirs",
                                                           "resources": {"requests": {resource: str(gpus)},
                                                                         "limits": {resource: str(gpus)}}}]},
            "status": {"phase": "Running"}}


def quota(name: str, hard: dict, used: dict | None = None) -> dict:
    return {"metadata": {"name": name}, "spec": {"hard": hard},
            "status": {"hard": hard, "used": used or {k: "0" for k in hard}}}


def _cluster_allowed(fake, token: str, group: str, resource: str, verb: str) -> bool:
    ns_sa = fake.sa_tokens.get(token)
    if ns_sa is None:
        return True  # an admin's token
    grants = getattr(fake, "cluster_grants", {})  # a fake without install(): none, as before
    return any(g == group and r == resource and verb in verbs for g, r, verbs in grants.get(ns_sa, ()))


def authorize(fake, token: str, method: str, path: str) -> None:
    """The namespaced RBAC of tests/k8s_fake_rbac.py, and: SSAR allowed to everyone authenticated; the
    cluster-scoped reads allowed by a ClusterRoleBinding (`fake.cluster_grants`). A fake not given these
    parts (`install`) keeps the namespaced RBAC alone."""
    if not getattr(fake, "cluster_parts", False):
        return namespaced_authorize(fake, token, method, path)
    if path == SSAR:
        return
    if path in CLUSTER_PATHS or path.startswith(CLUSTER_QUEUES):
        group, resource = CLUSTER_PATHS.get(path) or ("kueue.x-k8s.io", "clusterqueues")  # cluster-scoped
        verb = {"GET": "get" if path.startswith(CLUSTER_QUEUES) else "list", "POST": "create"}.get(method, method.lower())
        if not _cluster_allowed(fake, token, group, resource, verb):
            ns_sa = fake.sa_tokens[token]
            raise FakeApiException(403, f'Forbidden: User "system:serviceaccount:{ns_sa[0]}:{ns_sa[1]}" cannot {verb} '
                                        f'resource "{resource}" in API group "{group}" at the cluster scope')
        return
    namespaced_authorize(fake, token, method, path)


def would_allow(fake, token: str, attrs: dict) -> bool:
    """The authorizer's answer for the request `attrs` (spec.resourceAttributes) describes."""
    if token not in fake.sa_tokens:
        return True
    group, resource, sub = attrs.get("group") or "", attrs.get("resource") or "", attrs.get("subresource")
    verb, ns, name = attrs.get("verb") or "", attrs.get("namespace"), attrs.get("name")
    if not ns:
        return _cluster_allowed(fake, token, group, resource + (f"/{sub}" if sub else ""), verb)
    base = "/api/v1" if not group else f"/apis/{group}/v1"
    named = name or ("x" if verb in ("get", "delete", "update", "patch") or sub else None)
    path = f"{base}/namespaces/{ns}/{resource}" + (f"/{named}" if named else "") + (f"/{sub}" if sub else "")
    method = VERB_METHOD.get(verb, "GET")
    if sub and verb == "create":  # exec/portforward: the fake's RBAC reads the websocket's GET as `get`
        return _rule_allows(fake, token, ns, group, f"{resource}/{sub}", "create")
    try:
        namespaced_authorize(fake, token, method, path)
        return True
    except FakeApiException:
        return False


def _rule_allows(fake, token: str, ns: str, group: str, resource: str, verb: str) -> bool:
    from k8s_fake_rbac import _get

    sa = fake.sa_tokens[token]
    for (kind, bname), binding in fake.objects.items():
        if kind != "rolebinding" or fake.object_ns.get((kind, bname)) != ns:
            continue
        if not any(_get(s, "name") == sa[1] and (_get(s, "namespace") or ns) == sa[0] for s in _get(binding, "subjects") or []):
            continue
        role = fake.objects.get(("role", _get(_get(binding, "role_ref"), "name")))
        for rule in (_get(role, "rules") or []) if role is not None else []:
            if group in (_get(rule, "api_groups") or []) and resource in (_get(rule, "resources") or []) \
                    and verb in (_get(rule, "verbs") or []):
                return True
    return False


def _quota_admit(fake, namespace: str, counted: str) -> None:
    for q in fake.quotas.get(namespace, []):
        hard, used = q["status"]["hard"], q["status"]["used"]
        for key in (counted, f"count/{counted}"):
            if key in hard and int(used.get(key, 0)) + 1 > int(hard[key]):
                raise FakeApiException(403, f"Forbidden: exceeded quota: {q['metadata']['name']}, requested: "
                                            f"{key}=1, used: {key}={used.get(key, 0)}, limited: {key}={hard[key]}")
    for q in fake.quotas.get(namespace, []):
        used = q["status"]["used"]
        for key in (counted, f"count/{counted}"):
            if key in q["status"]["hard"]:
                used[key] = str(int(used.get(key, 0)) + 1)


# -- the HTTP handlers, added to tests/k8s_fake_http.py's Handler ---------------------------------------
def h_nodes(self):
    self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": self.fake.kube_nodes})


def h_all_pods(self):
    items = [p for pods in self.fake.foreign_pods.values() for p in pods]
    self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})


def h_quotas(self, ns):
    self.fake._authenticate()
    items = [dict(q, metadata={**q["metadata"], "namespace": ns}) for q in self.fake.quotas.get(ns, [])]
    self._send(200, {"kind": "ResourceQuotaList", "apiVersion": "v1", "metadata": {}, "items": items})


def h_local_queue(self, ns, name):
    self.fake._authenticate()
    if name not in getattr(self.fake, "local_queues", {}).get(ns, ()):
        raise FakeApiException(404, f'NotFound: localqueues.kueue.x-k8s.io "{name}" not found')
    self._send(200, {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                     "metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": "cluster-queue"}})


def h_cluster_queue(self, name):
    self.fake._authenticate()
    cq = getattr(self.fake, "cluster_queues", {}).get(name)
    if cq is None:
        raise FakeApiException(404, f'NotFound: clusterqueues.kueue.x-k8s.io "{name}" not found')
    self._send(200, {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name}, **cq})


def kueue_capacity(cq: dict, resource: str, total: float) -> str | None:
    """Kueue's flavor assignment of one podset needing `total` of `resource` (kubernetes-sigs/kueue
    pkg/scheduler/flavorassigner/flavorassigner.go `fitsResourceQuota`: "request > maximum capacity" when the
    request is over the flavor's potential capacity, `PotentialAvailable`: nominalQuota, plus borrowingLimit in a
    cohort, or the cohort's whole lendable quota without one, here taken as unbounded); the condition message of a
    workload that never fits, else None."""
    from kubernetes.utils import parse_quantity

    spec = cq.get("spec") or {}
    said = []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                if res.get("name") != resource:
                    continue
                cap = float(parse_quantity(str(res.get("nominalQuota", 0))))
                if spec.get("cohort"):
                    if res.get("borrowingLimit") is None:
                        return None
                    cap += float(parse_quantity(str(res["borrowingLimit"])))
                if total <= cap:
                    return None
                said.append(f"insufficient quota for {resource} in flavor {flavor.get('name')}, request > maximum "
                            f"capacity ({total:g} > {cap:g})")
    return "couldn't assign flavors to pod set main: " + ("; ".join(said) or f"resource {resource} unavailable in ClusterQueue")


def h_limits(self, ns):
    self.fake._authenticate()
    items = [dict(served(lr), metadata={**lr["metadata"], "namespace": ns})
             for lr in getattr(self.fake, "limit_ranges", {}).get(ns, [])]
    self._send(200, {"kind": "LimitRangeList", "apiVersion": "v1", "metadata": {}, "items": items})


def h_ssar(self):
    self.fake._authenticate()
    token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
    attrs = ((self.body or {}).get("spec") or {}).get("resourceAttributes") or {}
    allowed = would_allow(self.fake, token, attrs)
    self.fake.reviews.append((attrs.get("verb"), attrs.get("resource"), attrs.get("subresource"),
                              attrs.get("namespace"), allowed))
    self._send(201, {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                     "spec": (self.body or {}).get("spec"), "status": {"allowed": allowed}})


ROUTES = [
    ("GET", r"/api/v1/nodes", "nodes"),
    ("GET", r"/api/v1/pods", "all_pods"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/resourcequotas", "quotas"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/limitranges", "limits"),
    ("POST", SSAR, "ssar"),
    ("GET", r"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/(?P<name>[^/]+)", "cluster_queue"),
    ("GET", r"/apis/kueue.x-k8s.io/v1beta1/namespaces/(?P<ns>[^/]+)/localqueues/(?P<name>[^/]+)", "local_queue"),
]


def _only_where_installed(handler):
    """`handler` for a fake given these parts; any other fake served in this process (the routes and the
    handlers are the module's, added once) answers as it did before: no such route (404). Without this, a
    GKE fake served in a pytest worker after a test of this file met these routes and failed with
    "'FakeKubeApi' object has no attribute 'kube_nodes'" (seen when the files' order changed)."""

    def serve(self, **args):
        if getattr(self.fake, "cluster_parts", False):
            return handler(self, **args)
        path = self.path.split("?", 1)[0]
        return self._send(404, {"kind": "Status", "status": "Failure", "code": 404,
                                "message": f"no route {self.command} {path}"})

    return serve


def install(fake, nodes=(), quotas=None, foreign_pods=None, cluster_grants=None) -> None:
    """Someone else's cluster's parts on `fake` (served with tests/k8s_fake_http.py)."""
    fake.cluster_parts = True
    fake.kube_nodes = list(nodes)
    fake.quotas = dict(quotas or {})
    fake.foreign_pods = dict(foreign_pods or {})
    fake.cluster_grants = dict(cluster_grants or {})
    fake.reviews = []
    if getattr(k8s_fake_http, "_cluster_installed", False):
        return
    k8s_fake_http._cluster_installed = True
    k8s_fake_http.ROUTES[:0] = ROUTES
    for name in ("h_nodes", "h_all_pods", "h_quotas", "h_limits", "h_ssar", "h_local_queue", "h_cluster_queue"):
        setattr(k8s_fake_http.Handler, name, _only_where_installed(globals()[name]))
    k8s_fake_http.authorize = authorize  # SSAR and the cluster-scoped reads, then the namespaced RBAC
    original = type(fake)._create

    def create(self, kind, namespace, body):  # the ResourceQuota admission of the counted objects
        if getattr(self, "quotas", None) and kind in ("configmap", "service", "job"):
            self._namespace(namespace)
            _quota_admit(self, namespace, {"configmap": "configmaps", "service": "services", "job": "jobs.batch"}[kind])
        return original(self, kind, namespace, body)

    type(fake)._create = create
    create_job = type(fake).create_namespaced_job

    def create_namespaced_job(self, namespace, body, **kw):  # the LimitRanger admission of the Job's pod creates
        from kubernetes.client import ApiClient

        ranges = [served(lr) for lr in getattr(self, "limit_ranges", {}).get(namespace, [])]
        pod = ApiClient().sanitize_for_serialization(body)["spec"]["template"]["spec"] if ranges else {}
        refused = pod_refusals(pod, ranges) if ranges else []
        if not refused:
            return create_job(self, namespace, body, **kw)
        self._authenticate()
        self._create("job", namespace, body)  # the Job is made; the controller's pod creates are all refused
        self.refused_jobs = getattr(self, "refused_jobs", {})
        self.refused_jobs[body.metadata.name] = (f'Error creating: pods "{body.metadata.name}-0" is forbidden: '
                                                 f'[{", ".join(refused)}]')
        return body

    type(fake).create_namespaced_job = create_namespaced_job


def schedule(fake):
    """The scheduler of tests/k8s_fake_sched.py over `fake.kube_nodes`, other people's pods counted where they run;
    `fake.scheduler.bound` then says which node each pod of ours went to."""
    from k8s_fake_sched import FakeNode, Scheduler, pod_requests, quantity_m, quantity_mi

    nodes = []
    for n in fake.kube_nodes:
        alloc = n["status"]["allocatable"]
        node = FakeNode(n["metadata"]["name"], quantity_m(alloc.get("cpu", "0")), quantity_mi(alloc.get("memory", "0")),
                        int(alloc.get("nvidia.com/gpu", 0)), dict(n["metadata"]["labels"]),
                        taints=list(n["spec"].get("taints") or []))
        for pod in [p for pods in fake.foreign_pods.values() for p in pods if p["spec"]["nodeName"] == node.name]:
            for key, value in pod_requests(pod["spec"]).items():
                node.used[key] += value
        nodes.append(node)
    fake.scheduler = Scheduler(nodes)
    return fake.scheduler


def kueue(fake, admit_after_s: float, queue_label: str = "kueue.x-k8s.io/queue-name") -> None:
    """Kueue on `fake`: queued Jobs suspended at their create, admitted `admit_after_s` seconds later."""
    import time

    create, list_pods = fake.create_namespaced_job, fake.list_namespaced_pod
    fake.queued, fake.admitted = [], []
    fake.local_queues = {ns: ("team-queue",) for ns in fake.namespaces}
    fake.cluster_queues = getattr(fake, "cluster_queues", None) or {"cluster-queue": {"spec": {"resourceGroups": [
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "default-flavor", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": "16"}]}]}]}}}
    fake.never_admitted = {}  # job name -> the workload's condition message

    def create_job(namespace, body, **kw):
        if not (body.metadata.labels or {}).get(queue_label):
            return create(namespace, body, **kw)
        body.spec.suspend = True  # Kueue's mutating webhook
        fake._create("job", namespace, body)
        fake.queued.append((time.monotonic() + admit_after_s, namespace, body))
        return body

    def list_namespaced_pod(namespace, label_selector=None, **kw):
        now = time.monotonic()
        for due, ns, body in [q for q in fake.queued if q[0] <= now]:
            gpus = body.spec.completions * sum(int((c.resources.limits or {}).get("nvidia.com/gpu", 0))
                                               for c in body.spec.template.spec.containers if c.resources)
            never = kueue_capacity(fake.cluster_queues.get("cluster-queue") or {}, "nvidia.com/gpu", gpus)
            if never:  # QuotaReserved=False, reason Pending, for as long as the quota stays as it is
                fake.never_admitted[body.metadata.name] = never
                continue
            fake.queued.remove((due, ns, body))
            key = ("job", body.metadata.name)
            if key not in fake.objects or key in fake.terminating:
                continue  # deleted while it waited
            del fake.objects[key], fake.object_ns[key]  # re-made un-suspended, its pods with it
            body.spec.suspend = False
            create(ns, body)
            fake.admitted.append(body.metadata.name)
        return list_pods(namespace, label_selector=label_selector, **kw)

    fake.create_namespaced_job, fake.list_namespaced_pod = create_job, list_namespaced_pod


__all__ = ["NS", "install", "kueue", "node", "foreign_pod", "quota", "schedule"]
