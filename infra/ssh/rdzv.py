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
that the port was taken twice, naming both ports. The retry itself is the launch sequence's
(gpucluster.watch.sequence: `port_taken`, `taken_twice`); here, what the ssh transport does for it.
"""

from __future__ import annotations

import shlex

from .session import Session

RETRY_STEP = 3  # the new port's search starts above the check's store port (rdzv + 1) and recovery's (rdzv + 2)


def clear_marks(session: Session, dirs: dict[int, str], tool_files: tuple[str, ...]) -> None:
    """The nodes' marks of a first try (`cancelled`, `pgid`, the setup go file) removed before the second."""
    marks = " ".join(shlex.quote(f"{d}/{name}") for d in dirs.values() for name in tool_files)
    session.each(lambda n: (session.run(n, f"rm -f {marks}", timeout=30), None))
