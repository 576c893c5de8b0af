"""FAKE Kubernetes API, the nodes of tests/k8s_fake.py and GCE host maintenance on them (what GKE shows
of it). Each behaviour with its public source:

- Every placed pod is bound to a node (`spec.nodeName`; Kubernetes API reference, PodSpec: "NodeName
  is a request to schedule this pod onto a specific node"), here `gke-gpu-node-<index>` (the fake's GPU
  nodes are one per pod index, as its hostPath disks are); `read_node(name)` returns it (labels, taints),
  404 for a node that does not exist.
- Host maintenance of a GPU VM (GCE docs, "Host events" / "Monitor and plan for a host maintenance
  event": GPU VMs cannot live-migrate and are terminated, with about an hour's notice on N1 GPU VMs;
  GKE docs, "Manage disruption to GKE nodes that don't live migrate" and "Monitor maintenance events":
  while upcoming maintenance is scheduled "GKE adds scheduled-maintenance-time to the node label", as
  the Unix start time; once active, the label `cloud.google.com/active-node-maintenance=ONGOING` and the
  taint `cloud.google.com/impending-node-termination:NoSchedule`, and GKE terminates the node and its
  pods; label and taint names as GKE's maintenance controller spells them). At its worst here:
  - late: the label appears `label_lag_s` after Compute Engine scheduled the event (GKE copies it from
    the VM's notification; nothing bounds the delay);
  - no warning at the start: the ONGOING label, the taint and the pod's termination (the kubelet's
    graceful node shutdown, as `FakeKubeApi.preempt`: SIGTERM, then Failed, reason Terminated) all come
    at the window's start, so whoever waits for ONGOING to save has lost the node's pod already.
  Times are fake seconds on the controllers' scaled clock (`fake.clock()`, `fake.time_scale`); the label's
  Unix time is on `fake.wall()`, the fake's scaled wall clock.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace as NS

from k8s_fake_objects import FakeApiException

SCHEDULED_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_LABEL = "cloud.google.com/active-node-maintenance"
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"


def node_of(index: int) -> str:
    return f"gke-gpu-node-{index}"


class FakeNodes:
    """Mixin of FakeKubeApi: its nodes and their host maintenance (see the module docstring)."""

    def wall(self) -> float:
        """The fake's wall clock (Unix seconds), running `time_scale` times faster than the real one."""
        if not hasattr(self, "_wall0"):
            self._wall0 = time.time() - self.clock()
        return self._wall0 + self.clock()

    def _node_state(self) -> dict:
        if not hasattr(self, "_node_marks"):
            self._node_marks: dict[str, tuple[dict, list]] = {}  # node -> (labels, taints)
        return self._node_marks

    def read_node(self, name, **kw):
        self.calls.append(("read", "node", name))
        self._authenticate()
        placed = {node_of(p.index) for p in list(self.pods.values()) if p.sandbox}
        if name not in placed and name not in self._node_state():
            raise FakeApiException(404, f'NotFound: nodes "{name}" not found')
        labels, taints = self._node_state().get(name, ({}, []))
        return NS(metadata=NS(name=name, labels={"kubernetes.io/hostname": name,
                                                 "cloud.google.com/gke-accelerator": "nvidia-tesla-t4", **labels}),
                  spec=NS(taints=[NS(key=k, value=None, effect=e) for k, e in taints], unschedulable=None))

    def host_maintenance(self, rank: int, notice_s: float = 3600.0, label_lag_s: float = 60.0) -> None:
        """Compute Engine schedules a terminating host maintenance for the node of `rank`'s pod, starting
        `notice_s` fake seconds from now; GKE labels the node `label_lag_s` later; at the start it marks it
        ONGOING, taints it and terminates its pods (see the module docstring)."""
        name, scale, start = node_of(rank), self.time_scale, self.wall() + notice_s

        def events() -> None:
            time.sleep(label_lag_s / scale)
            self._node_state().setdefault(name, ({}, []))[0][SCHEDULED_LABEL] = str(int(start))
            time.sleep(max(0.0, (notice_s - label_lag_s) / scale))
            labels, taints = self._node_state()[name]
            labels.pop(SCHEDULED_LABEL, None)
            labels[ACTIVE_LABEL] = "ONGOING"
            taints.append((TERMINATION_TAINT, "NoSchedule"))
            self.preempt(rank, reason="Terminated")

        threading.Thread(target=events, daemon=True, name=f"fake-host-maintenance-{rank}").start()
