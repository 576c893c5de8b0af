"""The c10d rendezvous store of a run, in a process of its own that the launcher controls.

    python -m gpucluster.rdzv_store HOST PORT

hosts a `torch.distributed.TCPStore` server at HOST:PORT (the torchrun agents' rendezvous
endpoint; every agent runs with is_host=false and only connects), prints "ready HOST:PORT" once
it listens, and serves until its stdin closes (the launcher closes it, or dies) or it gets
SIGTERM/SIGINT. The launcher stops it only after every agent has exited, so no agent ever loses
the store while shutting down the rendezvous (which is what made torch print "recvVector failed
... RendezvousConnectionError" stack traces at the end of a clean run when the store lived in
the head's agent and that agent happened to exit first).
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        sys.stderr.write("usage: python -m gpucluster.rdzv_store HOST PORT\n")
        return 2
    host, port = argv[0], int(argv[1])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())

    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        # The same kind of server torch's c10d rendezvous backend creates on its host agent
        # (multi-tenant, so the workers' bootstrap can share it), without waiting for clients.
        store = TCPStore(host, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                         timeout=timedelta(seconds=60))
    except (RuntimeError, ValueError, OSError) as exc:
        sys.stderr.write(f"rendezvous store: cannot listen on {host}:{port}: {exc}\n")
        return 1
    print(f"ready {host}:{store.port}", flush=True)

    def wait_stdin() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        done.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    while not done.wait(1.0):
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
