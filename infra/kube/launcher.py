"""The `kubernetes` backend's launcher: the shared Kubernetes launcher (`infra.kubernetes`) in the
namespace the run's context and options pinned, saying what the provider's preflight found."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from gpucluster.domain import Cluster, Leftover
from gpucluster.events import RunEvents
from gpucluster.infra.kubernetes.launcher import KubernetesLauncher

from . import options
from .gpus import GpuNodes
from .platform import kube_platform
from .provider import KubeProvider

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import JobResult, JobSpec


class KubeLauncher(KubernetesLauncher):
    """The shared launcher in the namespace the run's context and options pinned (`provider.prepare`),
    saying what the provider's preflight found before the objects are made."""

    def __init__(self, provider: KubeProvider, queue: str | None = None, options: Mapping[str, object] | None = None,
                 **kw: Any):  # Any: the shared launcher's keyword arguments, passed on as they are
        super().__init__(**kw)
        self.provider = provider
        self.queue = queue  # --option queue: Kueue admits the Job (or does not) within the start deadline
        self.options = dict(options or {})  # the run's options, for the platform once --gpu's nodes are known

    def describe(self, spec: ClusterSpec, job: JobSpec) -> list[str]:
        """The plan's lines, said of an existing cluster's namespace; the job's --secret tells the provider's
        preflight to ask for the Secret permissions too (describe comes first: `gpucluster.lifecycle.prepare`)."""
        self.namespace = str(spec.option("namespace") or self.namespace)
        self.provider.secrets = bool(job.secrets)
        lines = super().describe(spec, job)
        from .limits import job_pod

        self.provider.pod = job_pod(self, spec, job)  # judged against the LimitRanges and quotas before creating
        made = options.create_namespace(spec)
        return [(f"namespace {self.namespace}: " + ("made for the run if it is missing (--create-namespace), and then "
                                                    "removed after it" if made else "used as it is (it must exist)"))
                if line.startswith(f"namespace {self.namespace}:") else line for line in lines]

    def launch(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        from .cleanup import kinds_of

        self.namespace = str((cluster.outputs or {}).get("namespace") or self.namespace)
        gpu = GpuNodes.from_dict((cluster.outputs or {}).get("gpu_nodes"))
        if gpu is not None:  # --gpu TYPE: its nodes, as the provider's preflight found them
            self.platform = kube_platform(self.options, gpu)
        self.provider.kinds = kinds_of((), self.mode, bool(job.secrets))
        for line in self.provider.checked:
            events.message(f"checked before creating: {line}")
        for line in self.provider.skipped:
            events.message(f"not checked: {line}")
        result = super().launch(cluster, job, events, log_dir)
        if self.queue and result.failure and "the Job made no pod for it" in result.failure:
            result.failure += (f"; the Job was still waiting for Kueue to admit it from LocalQueue {self.queue} "
                               f"(`kubectl get workloads -n {self.namespace}` says why; a longer --start-deadline "
                               "waits longer)")
        return result

    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        """The run's objects of the kinds it made (a team's Role covers those, not every kind), read back. With
        `remove` (a killed job's objects on a kept cluster, before the next job): by its run label, of the kinds a
        job makes, in the kept cluster's namespace, deleted first."""
        if not run_id:
            return None
        from gpucluster.infra.kubernetes.api import Retry

        from .cleanup import delete_run, kinds_of, run_leftovers

        api, retry = self.api or self._api_for(cluster), Retry(self.api_retry_s)
        if not remove:
            return run_leftovers(api, self.namespace, run_id, self.provider.kinds, retry)
        self.namespace = str((cluster.outputs or {}).get("namespace") or self.namespace)
        kinds = kinds_of((), self.mode, self.provider.secrets)
        delete_run(api, self.namespace, run_id, kinds, retry)
        return run_leftovers(api, self.namespace, run_id, kinds, retry)
