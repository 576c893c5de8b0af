"""FAKE Kubernetes API, the API server's object store (tests/k8s_fake.py says what the whole fake is and
the source of each behaviour): authentication, field validation, namespaces, creates, deletes that take
time, and the Jobs a namespace holds. `FakeKubeApi` builds on it."""

from __future__ import annotations

import re
from types import SimpleNamespace as NS

BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _get(obj, *path):
    """A field of a client model or of the same object as a dict (snake_case or camelCase path given)."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
        if obj is None:
            return None
    return obj


class FakeApiException(Exception):
    """Shaped like kubernetes.client.ApiException: status and reason."""

    def __init__(self, status: int, reason: str = ""):
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason


_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SELECTOR = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*=[A-Za-z0-9]?[-A-Za-z0-9_.]*$")
_CM_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_FIELD_SELECTOR = re.compile(r"^involvedObject\.name=[a-z0-9][-a-z0-9.]*$")


class ObjectStore:
    """The objects part of FakeKubeApi (which sets the attributes used here in its __init__)."""

    # -- auth and validation ---------------------------------------------------------------
    def _authenticate(self) -> None:
        if getattr(self._tls, "controller", False):
            return  # a controller of the cluster acting (its own credentials)
        if self.api_down():
            self.refused_while_down += 1
            raise FakeApiException(503, "Service Unavailable")
        if self.auth is not None and self.auth() not in self.tokens:
            raise FakeApiException(401, "Unauthorized")

    def _namespace(self, namespace: str) -> None:
        if namespace not in self.namespaces or ("namespace", namespace) in self.terminating:
            raise FakeApiException(404, f'NotFound: namespaces "{namespace}" not found')

    def _validate(self, kind: str, body) -> None:
        from kubernetes.client import ApiClient

        obj = body if isinstance(body, dict) else ApiClient().sanitize_for_serialization(body)
        name = (obj.get("metadata") or {}).get("name") or ""
        rule = _DNS1035_LABEL if kind == "service" else _DNS1123_SUBDOMAIN
        limit = 63 if kind == "service" else 253
        problems = []
        if not name or len(name) > limit or not rule.match(name):
            problems.append(f"metadata.name: Invalid value: {name!r}")
        if kind == "configmap":
            data = {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
            problems += [f"data[{k}]: Invalid key" for k in data if not _CM_KEY.match(k)]
            size = sum(len(str(v)) for v in (obj.get("data") or {}).values())
            size += sum(len(v) * 3 // 4 for v in (obj.get("binaryData") or {}).values())
            if size > 1024 * 1024:
                problems.append("data: Too long: must have at most 1048576 bytes")
        if kind == "secret":  # Kubernetes docs, "Secrets": keys as ConfigMap keys, values base64, 1 MiB in all
            import base64
            import binascii

            data = obj.get("data") or {}
            problems += [f"data[{k}]: Invalid value: a valid config key must consist of alphanumeric characters, "
                         "'-', '_' or '.'" for k in data if not _CM_KEY.match(k)]
            size = 0
            for k, v in data.items():
                try:
                    size += len(base64.b64decode(v, validate=True))
                except (binascii.Error, ValueError):
                    problems.append(f"data[{k}]: Invalid value: illegal base64 data")
            if size > 1024 * 1024:
                problems.append("data: Too long: must have at most 1048576 bytes")
        if kind == "job":
            spec = obj.get("spec") or {}
            if spec.get("completionMode") == "Indexed" and not spec.get("completions"):
                problems.append("spec.completions: Required value: when completion mode is Indexed")
            pod = (spec.get("template") or {}).get("spec") or {}
            if pod.get("restartPolicy") not in ("Never", "OnFailure"):
                problems.append(f"spec.template.spec.restartPolicy: Unsupported value: {pod.get('restartPolicy')!r}")
            names = [c.get("name") for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])]
            for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                if not c.get("name") or not c.get("image"):
                    problems.append("spec.template.spec.containers: name and image: Required value")
            if len(names) != len(set(names)):
                problems.append("spec.template.spec.containers: Duplicate value")
            if not pod.get("containers"):
                problems.append("spec.template.spec.containers: Required value")
        if problems:
            raise FakeApiException(422, "Unprocessable Entity: " + "; ".join(problems))

    def settle(self) -> None:
        """Let deletion time pass: every terminating object and pod is gone."""
        for key in list(self.terminating):
            self._gone(key)
        self.terminating.clear()
        for name in [n for n, p in self.pods.items() if p.terminating is not None]:
            self.pods.pop(name)

    def _gone(self, key) -> None:
        self.objects.pop(key, None)
        self.object_ns.pop(key, None)
        if key[0] == "namespace":
            self.namespaces.pop(key[1], None)

    def _age_deletions(self) -> None:
        for key in list(self.terminating):
            self.terminating[key] -= 1
            if self.terminating[key] <= 0:
                del self.terminating[key]
                self._gone(key)
        for name, pod in list(self.pods.items()):
            if pod.terminating is not None:
                pod.terminating -= 1
                if pod.terminating <= 0:
                    self.pods.pop(name)

    # -- create ----------------------------------------------------------------------------
    def _create(self, kind: str, namespace: str, body) -> object:
        name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name
        # what a controller of the cluster creates is not the client's call
        self.calls.append(("ctl-create" if getattr(self._tls, "controller", False) else "create", kind, namespace, name))
        self._authenticate()
        self._namespace(namespace)
        if kind in self.refuse:
            raise FakeApiException(self.refuse[kind], "Forbidden" if self.refuse[kind] == 403 else "refused")
        if kind in ("configmap", "service", "job", "secret"):
            self._validate(kind, body)
        if (kind, name) in self.objects:
            raise FakeApiException(409, "AlreadyExists")
        self.objects[(kind, name)] = body
        self.object_ns[(kind, name)] = namespace
        return body

    def create_namespaced_config_map(self, namespace, body, **kw):
        return self._create("configmap", namespace, body)

    def create_namespaced_service(self, namespace, body, **kw):
        return self._create("service", namespace, body)

    def create_namespaced_secret(self, namespace, body, **kw):
        return self._create("secret", namespace, body)

    def secret_env(self, containers, namespace: str):
        """What the kubelet does when it starts a pod's app containers: every `secretKeyRef` resolved
        from the Secret as it is now -> ({name: value}, None), or (None, the CreateContainerConfigError
        message) when the Secret or its key does not exist (or is being deleted) then (kubelet_pods.go
        makeEnvironmentVariables)."""
        import base64

        env = {}
        for container in containers:
            for e in getattr(container, "env", None) or []:
                ref = getattr(getattr(e, "value_from", None), "secret_key_ref", None)
                if ref is None:
                    continue
                secret = self.objects.get(("secret", ref.name))
                if secret is None or ("secret", ref.name) in self.terminating:
                    return None, f'secret "{ref.name}" not found'
                data = secret.data or {}
                if ref.key not in data:
                    return None, f"couldn't find key {ref.key} in Secret {namespace}/{ref.name}"
                env[e.name] = base64.b64decode(data[ref.key]).decode()
        return env, None

    def create_namespaced_service_account(self, namespace, body, **kw):
        return self._create("serviceaccount", namespace, body)

    # -- namespaces --------------------------------------------------------------------------
    def read_namespace(self, name, **kw):
        self.calls.append(("read", "namespace", name))
        self._authenticate()
        self._namespace(name)
        return NS(metadata=NS(name=name, labels=dict(self.namespaces[name])), status=NS(phase="Active"))

    def create_namespace(self, body, **kw):
        name = body.metadata.name
        self.calls.append(("create", "namespace", "", name))
        self._authenticate()
        if name in self.namespaces:
            raise FakeApiException(409, "AlreadyExists")
        if not _DNS1035_LABEL.match(name) or len(name) > 63:
            raise FakeApiException(422, f"Unprocessable Entity: metadata.name: Invalid value: {name!r}")
        self.namespaces[name] = dict(body.metadata.labels or {})
        self.objects[("namespace", name)] = body
        return body

    def delete_namespace(self, name, **kw):
        self.calls.append(("delete", "namespace", "", name, None))
        self._authenticate()
        if name in BUILTIN_NAMESPACES:
            raise FakeApiException(403, f'Forbidden: namespace "{name}" may not be deleted')
        self._namespace(name)
        self.terminating[("namespace", name)] = self.delete_ticks or 1
        for key, ns in list(self.object_ns.items()):  # what is in it goes with it
            if ns == name and key[0] != "namespace":
                if key[0] in ("job", "pytorchjobs.kubeflow.org", "trainjobs.trainer.kubeflow.org"):
                    self._terminate_pods(key[1])
                self.terminating[key] = self.delete_ticks or 1

    def list_namespaced_job(self, namespace, label_selector=None, **kw):
        self.calls.append(("list", "job", namespace, label_selector))
        self._authenticate()
        from k8s_fake_rbac import parse_selector, selector_match  # it imports this module

        reqs = parse_selector(label_selector)  # "k=v,k2=v2": every requirement holds (Labels and Selectors)
        items = []
        for (kind, name), body in self.objects.items():
            if kind == "job" and self.object_ns.get((kind, name)) == namespace:
                labels = body.metadata.labels or {}
                if selector_match(reqs, labels):
                    items.append(NS(metadata=NS(name=name, labels=dict(labels), deletion_timestamp=(
                        "2026-11-22T00:01:00Z" if (kind, name) in self.terminating else None))))
        return NS(items=items)

    def _list(self, kind: str, namespace: str, label_selector=None) -> list:
        """The objects of `kind` in `namespace` matching an equality selector. A deleted object whose
        deletion is not finished is still listed, with metadata.deletionTimestamp set (Kubernetes docs,
        "Finalizers": the API server "marks the object for deletion by populating
        .metadata.deletionTimestamp" and it "remains in a terminating state"; "Garbage Collection":
        with Foreground propagation the owner "remains visible through the Kubernetes API" until its
        dependents are gone). A missing namespace lists nothing (a list in it answers an empty list)."""
        self.calls.append(("list", kind, namespace, label_selector))
        self._authenticate()
        from k8s_fake_rbac import parse_selector, selector_match  # it imports this module

        reqs = parse_selector(label_selector)  # "k=v,k2=v2": every requirement holds (Labels and Selectors)
        items = []
        for (k, name), body in self.objects.items():
            if k != kind or self.object_ns.get((k, name)) != namespace:
                continue
            meta = body["metadata"] if isinstance(body, dict) else None
            labels = (meta.get("labels") if meta is not None else body.metadata.labels) or {}
            if selector_match(reqs, labels):
                items.append(NS(metadata=NS(name=name, labels=dict(labels), deletion_timestamp=(
                    "2026-11-22T00:01:00Z" if (k, name) in self.terminating else None))))
        return items

    def list_namespaced_service(self, namespace, label_selector=None, **kw):
        return NS(items=self._list("service", namespace, label_selector))

    def list_namespaced_config_map(self, namespace, label_selector=None, **kw):
        return NS(items=self._list("configmap", namespace, label_selector))

    def list_namespaced_secret(self, namespace, label_selector=None, **kw):
        return NS(items=self._list("secret", namespace, label_selector))

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=None, **kw):
        if f"{plural}.{group}" in getattr(self, "missing_crds", ()):  # no such resource type is served
            raise FakeApiException(404, "the server could not find the requested resource")
        items = self._list(f"{plural}.{group}", namespace, label_selector)  # the client returns a dict
        return {"items": [{"metadata": {"name": i.metadata.name, "labels": i.metadata.labels,
                                        "deletionTimestamp": i.metadata.deletion_timestamp}} for i in items]}

    def _delete(self, kind: str, name: str, namespace: str, body=None):
        policy = body.get("propagationPolicy") if isinstance(body, dict) else getattr(body, "propagation_policy", None)
        self.calls.append(("delete", kind, namespace, name, policy))
        self._authenticate()
        if kind in self.refuse_delete:
            raise FakeApiException(self.refuse_delete[kind], "Internal Server Error")
        if (kind, name) not in self.objects or (kind, name) in self.terminating:
            raise FakeApiException(404, "NotFound")
        if self.delete_ticks:
            self.terminating[(kind, name)] = self.delete_ticks  # gone only after a while
        else:
            self._gone((kind, name))

    def delete_namespaced_service(self, name, namespace, **kw):
        self._delete("service", name, namespace)

    def delete_namespaced_config_map(self, name, namespace, **kw):
        self._delete("configmap", name, namespace)

    def delete_namespaced_secret(self, name, namespace, **kw):
        self._delete("secret", name, namespace)
