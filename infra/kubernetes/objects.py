"""The Kubernetes objects of one run (`infra.kubernetes.launcher`): created in order, each recorded before its
request (an interrupted call may still have succeeded), deleted in reverse whatever happened.

- the namespace: the API server refuses objects in a namespace that does not exist (the
  NamespaceLifecycle admission plugin, Kubernetes docs "Admission Controllers"; 404 `namespaces "x"
  not found`). `default` always exists; another one (the option `namespace`) is created for the run
  when missing, labelled managed-by=gpucluster and with the run, and deleted after it, unless a Job
  of another gpucluster run is in it then (it goes with the last such run's cleanup only if that run
  made it: otherwise it stays, empty, until the cluster goes).
- with --secret, the run's own Secret (its values, nothing else, deleted with the run);
- the ConfigMap, the headless Service and the Job (or a Kubeflow PyTorchJob, or a Trainer v2 TrainJob,
  whose JobSet makes the Service and the Job), built by
  `infra.kubernetes.manifests`.

Ledger rows (the ledger-first rule): with `events` (the run's `RunEvents`) each object is a resource
row `k8s-<kind>` `<namespace>/<name>` (the namespace: `<namespace>`) written before its create request
and marked created after it. `delete_all` then reads every kind back by the run's label
(`infra.kubernetes.gone`): an object not found, or listed with a deletionTimestamp (its deletion accepted,
finished by the cluster), has its row closed as confirmed gone; one still there, or one that cannot be
read back, is an error (its row stays open: the run's verdict is not verified, and `gpucluster down`
or the next check finds it by the run's label).

Every call is retried while the API answers transiently (`api.Retry`: a control-plane upgrade of
a zonal cluster takes minutes); a create that answers 409 after a failed try had reached the server
the first time. What could not be deleted is kept in `errors` (shown by the lifecycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from gpucluster.errors import LaunchError

from .api import KubeApi, KubeObject, Retry, _is_api_error, _status, transient
from .gone import ROW_PREFIX, listed, namespace_state, row_name
from .manifests import (config_map_manifest, job_manifest, kube_models, pytorchjob_manifest, secret_manifest,
                            service_manifest, trainjob_manifest)
from .plan import (DEFAULT_NAMESPACE, JOB_LABEL, KUBEFLOW_GROUP, KUBEFLOW_PLURAL, KUBEFLOW_VERSION, TRAINER_GROUP,
                   TRAINER_VERSION, TRAINJOB_PLURAL, Plan)

if TYPE_CHECKING:
    from gpucluster.events import RunEvents

    from .platform import Shape

MANAGED = ("app.kubernetes.io/managed-by", "gpucluster")


@dataclass
class Created:
    """What the launch asked the API server to create, recorded before each request."""

    api: KubeApi
    plan: Plan
    retry: Retry = field(default_factory=Retry)
    kinds: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False
    events: RunEvents | None = None  # a ledger row for each object, written before its request
    going: list[str] = field(default_factory=list)  # deleted, still terminating when read back
    ns_in_use: list[str] = field(default_factory=list)  # the Jobs of other runs that kept our namespace
    shape: Shape | None = None  # (kind, manifest) -> manifest: the platform's additions (`Platform.shape`)

    # -- create ---------------------------------------------------------------------------------
    def namespace(self) -> None:
        """The plan's namespace exists when this returns (made for the run when it was missing)."""
        ns = self.plan.namespace
        if ns == DEFAULT_NAMESPACE:
            return
        try:
            self.retry.call(self.api.core.read_namespace, ns)
            return
        except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
            if _is_api_error(exc) and _status(exc) == 403:
                return  # a user whose Role is namespaced may not read its namespace: used as it is (a missing
                # one then fails the first create with 404, and such a user could not create it anyway)
            if not _is_api_error(exc) or _status(exc) != 404:
                raise self._refused("namespace", exc) from None
        k = kube_models()
        body = k.V1Namespace(api_version="v1", kind="Namespace", metadata=k.V1ObjectMeta(name=ns, labels=dict([MANAGED, ("gpucluster-run",
                                                                                    self.plan.label_dict["gpucluster-run"])])))
        self._create("namespace", lambda: self.api.core.create_namespace(body), exists_is_ours=False)

    def objects(self, secret_values: dict[str, str] | None = None) -> None:
        """The run's objects; with --secret first its own Secret holding `secret_values` (the values
        go only there, deleted with the run)."""
        api, plan, ns = self.api, self.plan, self.plan.namespace
        shape = self.shape or (lambda kind, manifest: manifest)
        if plan.secrets:
            self._create("secret", lambda: api.core.create_namespaced_secret(ns, shape("secret", secret_manifest(
                plan, secret_values or {}))))
        self._create("configmap", lambda: api.core.create_namespaced_config_map(ns, shape("configmap",
                                                                                          config_map_manifest(plan))))
        if plan.mode == "job":
            self._create("service", lambda: api.core.create_namespaced_service(ns, shape("service",
                                                                                       service_manifest(plan))))
            self._create("job", lambda: api.batch.create_namespaced_job(ns, shape("job", job_manifest(plan))))
        elif plan.mode == "trainjob":  # the Trainer makes the JobSet, its child Job and headless Service
            self._create("trainjob", lambda: api.custom.create_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, ns, TRAINJOB_PLURAL, shape("trainjob", trainjob_manifest(plan))))
        else:
            self._create("pytorchjob", lambda: api.custom.create_namespaced_custom_object(
                KUBEFLOW_GROUP, KUBEFLOW_VERSION, ns, KUBEFLOW_PLURAL, shape("pytorchjob", pytorchjob_manifest(plan))))

    def _row(self, kind: str) -> tuple[str, str]:
        return ROW_PREFIX + kind, row_name(kind, self.plan.namespace, self.plan.name)

    def _note(self, what: str, kind: str) -> None:
        if self.events is None:
            return
        row, name = self._row(kind)
        if what == "requested":  # a ledger that cannot take it raises here: nothing is asked for
            self.events.resource_requested(row, name, namespace=self.plan.namespace,
                                           label=f"gpucluster-run={self.plan.label_dict.get('gpucluster-run')}")
        elif what == "created":
            self.events.resource_created(row, name)
        else:
            self.events.resource_deleted(row, name)

    def _create(self, kind: str, create: Callable[[], object], exists_is_ours: bool = True) -> None:
        self._note("requested", kind)  # the ledger first: the row exists before the request
        self.kinds.append(kind)  # before the request: an interrupted call may still succeed
        tried = [False]

        def once() -> object:
            try:
                return create()
            except Exception as exc:  # noqa: BLE001 - remembered: a 409 after a transient failure is ours
                tried[0] = tried[0] or transient(exc)
                raise

        try:
            self.retry.call(once)
        except Exception as exc:  # ApiException lives in the lazily imported SDK: non-API errors re-raise
            if not _is_api_error(exc):
                raise
            if _status(exc) == 409 and (tried[0] or not exists_is_ours):
                if not exists_is_ours:  # made by someone else meanwhile: not ours to delete, nor to count
                    self.kinds.remove(kind)
                    self._note("deleted", kind)
                    return
                self._note("created", kind)
                return  # the earlier try had reached the server: it exists, as ours
            raise self._refused(kind, exc) from None
        self._note("created", kind)

    def _refused(self, kind: str, exc: Exception) -> LaunchError:
        ns, name = self.plan.namespace, self.plan.name
        what = f"namespace {ns}" if kind == "namespace" else f"{kind} {ns}/{name}"
        if _status(exc) is None:
            return LaunchError(f"cannot reach the Kubernetes API to create {what}: {exc}")
        if _status(exc) == 401:
            return LaunchError(f"the Kubernetes API refused gpucluster's credentials creating {what} (401 Unauthorized)",
                               hint="run `gcloud auth application-default login` (the token comes from "
                                    "application-default credentials)")
        if _status(exc) == 403:
            return LaunchError(f"the Kubernetes API forbade creating {what} (403 Forbidden)",
                               hint="the application-default account needs roles/container.developer on the project")
        hint = " (is the Kubeflow training operator installed?)" if kind == "pytorchjob" and _status(exc) == 404 else ""
        return LaunchError(f"kubernetes refused to create {what}: {_status(exc)} {getattr(exc, 'reason', '')}{hint}")

    # -- delete ---------------------------------------------------------------------------------
    def delete_all(self) -> None:
        if self.done:
            return
        self.done = True
        k = kube_models()
        ns, name = self.plan.namespace, self.plan.name
        delete = {
            "job": lambda: self.api.batch.delete_namespaced_job(
                name, ns, body=k.V1DeleteOptions(propagation_policy="Foreground")),
            "pytorchjob": lambda: self.api.custom.delete_namespaced_custom_object(
                KUBEFLOW_GROUP, KUBEFLOW_VERSION, ns, KUBEFLOW_PLURAL, name,
                body=k.V1DeleteOptions(propagation_policy="Foreground")),
            "trainjob": lambda: self.api.custom.delete_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, ns, TRAINJOB_PLURAL, name,
                body=k.V1DeleteOptions(propagation_policy="Foreground")),
            "service": lambda: self.api.core.delete_namespaced_service(name, ns),
            "configmap": lambda: self.api.core.delete_namespaced_config_map(name, ns),
            "secret": lambda: self.api.core.delete_namespaced_secret(name, ns),
            "namespace": self._delete_namespace,
        }
        for kind in reversed(self.kinds):  # the workload first, what it uses last, the namespace at the end
            try:
                self.retry.call(delete[kind])
            except Exception as exc:  # noqa: BLE001 - every kind is still deleted; the error is reported
                if _status(exc) != 404:
                    what = f"namespace {ns}" if kind == "namespace" else f"{kind} {ns}/{name}"
                    self.errors.append(f"{what}: {exc}")
        self.confirm()

    def confirm(self) -> None:
        """Read back what this run asked for (`gone`): gone or going closes its ledger row; still
        there, or unreadable, is an error (the row stays open)."""
        ns, name = self.plan.namespace, self.plan.name
        run_id = str(self.plan.label_dict.get("gpucluster-run") or "")
        inner = [k for k in self.kinds if k != "namespace"]
        try:
            found = listed(self.api, ns, run_id, inner, retry=self.retry) if inner else {}
            states = {k: ("there" if found.get((k, name)) is False else "going" if (k, name) in found else "gone")
                      for k in inner}
            if "namespace" in self.kinds:
                states["namespace"] = namespace_state(self.api, ns, retry=self.retry)
        except Exception as exc:  # noqa: BLE001 - not read back: not confirmed; the rows stay open
            self.errors.append(f"the run's objects in namespace {ns} could not be read back after their delete: "
                               f"{_status(exc) or type(exc).__name__} {getattr(exc, 'reason', exc)}")
            return
        for kind, state in states.items():
            what = f"namespace {ns}" if kind == "namespace" else f"{kind} {ns}/{name}"
            if state == "there" and kind == "namespace" and self.ns_in_use:
                continue  # left on purpose for the other run's Job: its row stays open, it bills nothing
            if state == "there":
                if not any(e.startswith(what + ":") for e in self.errors):
                    self.errors.append(f"{what}: still there after its delete")
                continue
            if state == "going":
                self.going.append(what)
            self._note("deleted", kind)

    def _delete_namespace(self) -> None:
        """The namespace this run made, unless another gpucluster run's Job is in it now."""
        ns = self.plan.namespace
        jobs = self.retry.call(self.api.batch.list_namespaced_job, ns, label_selector="=".join(MANAGED)).items
        others = [j.metadata.name for j in jobs if (j.metadata.labels or {}).get(JOB_LABEL) != self.plan.name
                  and not getattr(j.metadata, "deletion_timestamp", None)]
        if others:
            self.ns_in_use = others
            return  # in use by another run; it stays (empty once that run ends) until the cluster goes
        self.api.core.delete_namespace(ns)
