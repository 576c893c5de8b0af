"""The rendezvous port, taken between its check and torchrun's bind (issue 45 item 6).

The ssh launcher checks that the rendezvous port is free on the head (node_port.py, `free_port`)
and torchrun binds it seconds later, once ssh, Python and torch have started there. Another
process can bind it in between. torchrun's c10d store then fails on the head with

    DistNetworkError: The server socket has failed to listen on any local network address.
    port: 29400, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

(torch/csrc/distributed/c10d/TCPServer / socket.cpp), the head's agent exits 1 in the rendezvous,
and before this the cause was only in node 0's log. Now such a failure (the head's last lines name
EADDRINUSE, no rank had started) is run once more on a port found free again, said and recorded
(an `rdzv_port` record, as for a port found busy at the check); a second one says in the failure
that the port was taken twice, naming both ports.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import TYPE_CHECKING, Callable

from gpucluster.events import RunEvents
from gpucluster.watch.launch import JobResult, JobSpec

from .health import free_port
from .session import Session, SshSettings, node_label

if TYPE_CHECKING:
    from gpucluster.domain import Cluster

_TAKEN = re.compile(r"EADDRINUSE|[Aa]ddress already in use|errno:? 98\b")
RETRY_STEP = 3  # the new port's search starts above the check's store port (rdzv + 1) and recovery's (rdzv + 2)


def port_taken(result: JobResult) -> bool:
    """The run failed in its rendezvous because the head could not bind the port."""
    if result.ok or result.timed_out or result.train_started_at is not None:
        return False
    head = next((n for n in result.nodes if n.node_rank == 0), None)
    return head is not None and any(_TAKEN.search(line) for line in head.last_lines)


def once_more(launcher: SshSettings, session: Session, cluster: Cluster, job: JobSpec, events: RunEvents,
              dirs: dict[int, str], run: Callable[[JobSpec], JobResult], tool_files: tuple[str, ...]) -> JobResult:
    """`run(job)`; when the head's torchrun could not bind the rendezvous port, once more on a port
    found free again (the nodes' `cancelled`, `pgid` and setup marks of the first try removed)."""
    result = run(job)
    if not port_taken(result):
        return result
    taken = job.rdzv_port
    head = cluster.head
    alt, _ = free_port(launcher, session, head, taken + RETRY_STEP, what="rendezvous port")
    marks = " ".join(shlex.quote(f"{d}/{name}") for d in dirs.values() for name in tool_files)
    session.each(lambda n: (session.run(n, f"rm -f {marks}", timeout=30), None))
    events.message(f"rendezvous port {taken} on node 0 ({node_label(head)}) was taken by another process between its "
                   f"check and torchrun's bind (EADDRINUSE): starting once more on port {alt}")
    events.on_metric(0, {"kind": "rdzv_port", "port": alt, "busy_port": taken,
                         "holder": "another process, between the check and torchrun's bind (EADDRINUSE)"})
    job = dataclasses.replace(job, rdzv_port=alt)
    again = run(job)
    return taken_twice(again, taken, alt, node_label(head)) if port_taken(again) else again


def taken_twice(result: JobResult, taken: int, alt: int, head: str) -> JobResult:
    """`result` of a second try whose port was taken too, its failure naming both ports."""
    why = (f"the rendezvous port was taken by another process between its check and torchrun's bind "
           f"(EADDRINUSE) twice: port {taken}, then port {alt}, on node 0 ({head})")
    return dataclasses.replace(result, failure=f"{why}; {result.failure}" if result.failure else why)
