"""FAKE Kubernetes API, the parts the idle stop's watcher meets (tests/k8s_fake.py says what the whole fake
is): label selectors with several requirements, RBAC for service-account tokens, Jobs that are not Indexed
(their pods placeholders, no process), and a Job read and patched by name. Each behaviour from its source:

- Label selectors (Kubernetes docs, "Labels and Selectors"): requirements separated by commas, all must
  hold (AND); equality `k=v`, `k==v`, `k!=v`; existence `k` and `!k`. Anything else is a 400.
- RBAC (Kubernetes docs, "Using RBAC Authorization"): a request made with a service account's token is
  allowed only when a RoleBinding in the request's namespace binds that account to a Role one of whose
  rules matches the API group, the resource, the verb (get/list/create/update/patch/delete, from the
  HTTP method and whether a name is given) and, when the rule lists `resourceNames`, the object's name
  ("list" and "create" requests carry no name, so a rule with resourceNames never allows them).
  Otherwise 403 Forbidden: `User "system:serviceaccount:NS:SA" cannot VERB resource "R" in API group
  "G" in the namespace "NS"`. Permissions only add up; there are no deny rules.
- Jobs (Kubernetes docs, "Jobs"): a Job without completionMode Indexed and with `parallelism` P runs P
  pods at once; `parallelism` may be changed on a running Job, and 0 pauses it: the controller deletes the
  extra pods (they stay listed, terminating, for `delete_ticks` listings, Kubernetes docs "Pod Lifecycle",
  termination) or creates the missing ones (Pending until placed on a node: `start_after` listings).
  A Job past `activeDeadlineSeconds` is not modelled here (the watcher never waits that long in a test).
- JSON merge patch (RFC 7386, `application/merge-patch+json`): objects merge key by key, a null removes a
  key; metadata.annotations and spec.parallelism are what the watcher sends. A patch of the Job's pod
  template is refused with 422 (Kubernetes docs, "Jobs": the template is immutable).
"""

from __future__ import annotations

import re
from types import SimpleNamespace as NS

from k8s_fake_objects import FakeApiException

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[A-Za-z0-9]?[-A-Za-z0-9_.]*"
_REQ = re.compile(rf"^(?:(?P<neg>!)?(?P<key>{_KEY})|(?P<k>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<v>{_VALUE}))$")


def parse_selector(selector: str | None) -> list[tuple[str, str, str | None]]:
    """[(key, op, value)] with op in =, !=, exists, !exists; a FakeApiException(400) for bad syntax."""
    reqs = []
    for part in (selector or "").split(","):
        part = part.strip()
        if not part and not selector:
            continue
        m = _REQ.match(part)
        if not m:
            raise FakeApiException(400, f"BadRequest: unable to parse requirement: {selector!r}")
        if m.group("key"):
            reqs.append((m.group("key"), "!exists" if m.group("neg") else "exists", None))
        else:
            reqs.append((m.group("k"), "!=" if m.group("op") == "!=" else "=", m.group("v")))
    return reqs


def selector_match(reqs: list[tuple[str, str, str | None]], labels: dict) -> bool:
    for key, op, value in reqs:
        have = labels.get(key)
        if (op == "exists" and have is None) or (op == "!exists" and have is not None) \
                or (op == "=" and have != value) or (op == "!=" and have == value):
            return False
    return True


# -- RBAC --------------------------------------------------------------------------------------------
_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<res>[^/]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


def _get(obj, key):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def authorize(fake, token: str, method: str, path: str) -> None:
    """Raise 403 unless a Role bound to the token's service account allows this request."""
    ns_sa = fake.sa_tokens.get(token)
    if ns_sa is None:
        return  # a cluster admin's token (the launcher's): everything
    m = _PATH.match(path)
    if not m:
        raise FakeApiException(403, f"Forbidden: {path} is not allowed to service accounts here")
    group = "" if m.group("core") else m.group("group")
    resource = m.group("res") + (f"/{m.group('sub')}" if m.group("sub") else "")
    name, ns = m.group("name"), m.group("ns")
    verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}[method]
    for (kind, bname), binding in fake.objects.items():
        if kind != "rolebinding" or fake.object_ns.get((kind, bname)) != ns:
            continue
        subjects = _get(binding, "subjects") or []
        if not any(_get(s, "kind") == "ServiceAccount" and _get(s, "name") == ns_sa[1]
                   and (_get(s, "namespace") or ns) == ns_sa[0] for s in subjects):
            continue
        ref = _get(binding, "role_ref")
        role = fake.objects.get(("role", _get(ref, "name"))) if _get(ref, "kind") == "Role" else None
        for rule in (_get(role, "rules") or []) if role is not None else []:
            names = _get(rule, "resource_names") or []
            if group in (_get(rule, "api_groups") or []) and resource in (_get(rule, "resources") or []) \
                    and verb in (_get(rule, "verbs") or []) and (not names or (name is not None and name in names)):
                return
    raise FakeApiException(403, f'Forbidden: User "system:serviceaccount:{ns_sa[0]}:{ns_sa[1]}" cannot {verb} '
                                f'resource "{resource}" in API group "{group}" in the namespace "{ns}"')


# -- Jobs that are not Indexed: their pods are placeholders ------------------------------------------
class PlainPod:
    """A pod of a Job that is not Indexed: Pending for `start_after` listings, then Running on its node."""

    def __init__(self, name: str, namespace: str, labels: dict, node: str, start_after: int = 1):
        self.name, self.namespace, self.labels, self.node = name, namespace, dict(labels), node
        self.index = 0
        self.age, self.start_after = 0, start_after
        self.terminating: int | None = None
        self.ended: str | None = None  # Succeeded / Failed

    def tick(self) -> None:
        self.age += 1

    def kill(self) -> None:
        pass  # no process

    @property
    def phase(self) -> str:
        return self.ended or ("Running" if self.age > self.start_after else "Pending")

    def view(self) -> NS:
        placed = self.age > self.start_after
        return NS(metadata=NS(name=self.name, namespace=self.namespace, labels=dict(self.labels),
                              deletion_timestamp="2026-11-22T00:01:00Z" if self.terminating is not None else None),
                  spec=NS(node_name=self.node if placed else None, containers=[NS(name="c")]),
                  status=NS(phase=self.phase))


def plain_job_pods(fake, namespace: str, body, want: int | None = None) -> None:
    """The Job controller's part for a Job that is not Indexed: `parallelism` pods that are not
    terminating, created or deleted to match."""
    name = body.metadata.name
    want = body.spec.parallelism if want is None else want
    mine = [p for n, p in fake.pods.items() if n.startswith(name + "-") and isinstance(p, PlainPod)]
    live = [p for p in mine if p.terminating is None and p.ended is None]
    for p in live[want:]:
        p.terminating = fake.delete_ticks or 1
    labels = body.spec.template.metadata.labels or {}
    for i in range(len(live), want):
        n = len(mine) + i - len(live)
        node = fake.node_for(name, n) if hasattr(fake, "node_for") else f"gke-gpu-{n}"
        fake.pods[f"{name}-{n}-plain"] = PlainPod(f"{name}-{n}-plain", namespace, labels, node)


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


class ClusterObjects:
    """FakeKubeApi's part for the idle stop's objects: Roles, RoleBindings, Deployments (stored, validated
    for a name; a Deployment's pods are not run: the tests run the watcher's command themselves), Jobs
    read, patched and replaced by name, and objects replaced (PUT) by name."""

    def _plain_job(self, namespace, body):
        self._create("job", namespace, body)
        plain_job_pods(self, namespace, body)
        return body

    def create_namespaced_role(self, namespace, body, **kw):
        return self._create("role", namespace, body)

    def create_namespaced_role_binding(self, namespace, body, **kw):
        return self._create("rolebinding", namespace, body)

    def create_namespaced_deployment(self, namespace, body, **kw):
        return self._create("deployment", namespace, body)

    def _replace(self, kind, name, namespace, body):
        self.calls.append(("replace", kind, namespace, name))
        self._authenticate()
        if (kind, name) not in self.objects or self.object_ns.get((kind, name)) != namespace:
            raise FakeApiException(404, "NotFound")
        self.objects[(kind, name)] = body
        return body

    def replace_namespaced_service_account(self, name, namespace, body, **kw):
        return self._replace("serviceaccount", name, namespace, body)

    def replace_namespaced_config_map(self, name, namespace, body, **kw):
        return self._replace("configmap", name, namespace, body)

    def replace_namespaced_role(self, name, namespace, body, **kw):
        return self._replace("role", name, namespace, body)

    def replace_namespaced_role_binding(self, name, namespace, body, **kw):
        return self._replace("rolebinding", name, namespace, body)

    def replace_namespaced_deployment(self, name, namespace, body, **kw):
        return self._replace("deployment", name, namespace, body)

    def read_namespaced_job(self, name, namespace, **kw):
        self.calls.append(("read", "job", namespace, name))
        self._authenticate()
        key = ("job", name)
        if key not in self.objects or self.object_ns.get(key) != namespace or key in self.terminating:
            raise FakeApiException(404, f'NotFound: jobs.batch "{name}" not found')
        return self.objects[key]

    def patch_namespaced_job(self, name, namespace, body, **kw):
        from kubernetes.client import ApiClient

        job = self.read_namespaced_job(name, namespace)
        self.calls.append(("patch", "job", namespace, name, body))
        client = ApiClient()
        before = client.sanitize_for_serialization(job)
        after = merge_patch(before, body if isinstance(body, dict) else client.sanitize_for_serialization(body))
        if after["spec"].get("template") != before["spec"].get("template"):
            raise FakeApiException(422, "Unprocessable Entity: spec.template: Invalid value: field is immutable")
        new = client._ApiClient__deserialize(after, "V1Job")
        self.objects[("job", name)] = new
        if (job.spec.completion_mode or "NonIndexed") != "Indexed":
            plain_job_pods(self, namespace, new)
        return new

    def finish_pods(self, job: str, phase: str = "Succeeded") -> None:
        """The pods of a plain Job end (their containers exited): Succeeded or Failed, still listed."""
        for n, p in self.pods.items():
            if n.startswith(job + "-") and isinstance(p, PlainPod):
                p.ended = phase
