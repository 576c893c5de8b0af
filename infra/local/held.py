"""A kept local cluster (`up --cloud local --nodes N`, `gpucluster.lifecycle.held`): N "nodes" of this machine
held under a name, so that `exec` runs job after job on them as on a kept cloud cluster.

- `hold(launcher, cluster)`: the nodes' Python is asked once (it runs and finds torch, as before a
  local run); each node's `host` row records that Python, so a later `exec` uses the same one.
- `KeptLocalLauncher`: the local launcher, with the check `exec` asks after each job
  (`Launcher.leftovers`): the run's processes on this machine and its node folders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.watch.launch import JobSpec, Launcher

from .launch import LocalLauncher, check_python
from .provider import LocalProvider

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover


def hold(launcher: Launcher, cluster: Cluster) -> dict[int, dict[str, object]]:
    if not isinstance(launcher, LocalLauncher):
        raise TypeError(f"the local backend holds its nodes through its own launcher, not {type(launcher).__name__}")
    check_python(launcher.python, launcher.python_given, JobSpec(run_id="up"))  # UsageError: nothing recorded
    return {n.rank: {"python": launcher.python} for n in cluster.nodes}


class KeptLocalLauncher(LocalLauncher):
    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        """The run's processes and node folders on this machine; None with `remove`: a run whose gpucluster
        process died is not reclaimed here (`exec` refuses, naming `gpucluster down`)."""
        if not run_id or remove:
            return None
        return list(LocalProvider().leftovers(cluster.name, run_id).leftovers)
