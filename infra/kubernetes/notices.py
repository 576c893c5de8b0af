"""A node's interruption notice read from the Kubernetes API, for providers that announce it there
(GKE: host maintenance on GPU nodes, which cannot live-migrate; `infra.gcp.maintenance`).

`NodeNotices` reads the nodes the job's pods run on (`spec.nodeName`, `read_node`) at most every
`interval_s` seconds and asks the platform's `node_notice(node, now)` whether the provider is taking
that node back; the first answer goes to the supervisor (`NodeSupervisor.notify`), which ends the run as
on a spot notice: the ranks get the notice's time to save (SIGTERM), every node's outputs are copied
while its pod still runs, the `node_lost` record (cause "interruption") lets the recovery loop go on.

Reading nodes needs `get` on nodes (cluster-scoped): a 401/403 stops the watch with one message (a
cluster where the user may not read nodes); a node not found (404) has gone, which the pod listing
reports as a lost node. Other API errors skip that reading (the control plane may be away for minutes).
"""

from __future__ import annotations

import time
from typing import Callable

from gpucluster.states import JsonObject

from .api import KubeApi, KubeObject, _is_api_error, _status

DEFAULT_INTERVAL_S = 15.0  # seconds between two readings of the job's nodes


class NodeNotices:
    """Watch the job's nodes for a provider's notice (see the module docstring)."""

    def __init__(self, api: KubeApi, notice: Callable[[KubeObject, float], JsonObject | None],
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] | None = None):
        self.api, self.notice, self.interval_s, self.clock, self.say = api, notice, interval_s, clock, say
        self._next = float("-inf")
        self.off: str | None = None  # why the nodes are not read (a 403)

    def poll(self, nodes: dict[int, str]) -> tuple[int, JsonObject] | None:
        """(rank, notice record) for the first of `nodes` (rank -> node name) its provider takes back, or None."""
        now = time.monotonic()
        if self.off is not None or not nodes or now < self._next:
            return None
        self._next = now + self.interval_s
        for rank, name in sorted(nodes.items()):
            try:
                node = self.api.core.read_node(name)
            except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
                if not _is_api_error(exc):
                    raise
                if _status(exc) in (401, 403):
                    self.off = f"cannot read nodes ({_status(exc)}): host maintenance notices are not watched"
                    if self.say is not None:
                        self.say(self.off)
                    return None
                continue  # 404: the node is gone (the pods say so); 5xx: read again next time
            record = self.notice(node, self.clock())
            if record:
                return rank, {**record, "node": name}
        return None
