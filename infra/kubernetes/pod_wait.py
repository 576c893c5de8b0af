"""gpucluster: wait for the job's pods in the network, standard library only.

Shipped by content in the run's ConfigMap (`infra.kubernetes.plan`) as /gpucluster/wait.py and run with
the image's python, in two places:

- `wait.py dns HOSTS PORT LIMIT` is the init container `wait-for-peers` (job mode): it ends once every
  pod of the job has a DNS record (it is placed and has an address: the headless Service publishes
  not-ready addresses). That never depends on another pod's app container, so it cannot deadlock.
  A TrainJob's pod may get no init container (a runtime patch names only the runtime's own), so there
  `wait.py dns HOSTS PORT LIMIT -- ARGV...` prefixes the argv in the app container and then execs it.
- `wait.py rendezvous HOST PORT LIMIT -- ARGV...` prefixes torchrun on the ranks other than 0, inside the
  app container (after the --data and --setup gates): it waits until the head's rendezvous port answers,
  then execs ARGV. The head opens that port only when its torchrun starts, which with --setup is after
  the launcher's release, so this wait cannot sit in an init container (the launcher releases only
  once every pod's setup ended, and a pod's app container starts only after its init containers).

Either gives up with a one-line reason after LIMIT seconds.
"""
import os
import socket
import sys
import time


def wait(what, probe, end, limit):
    last = None
    while time.monotonic() < end:
        try:
            probe()
            print(f"[gpucluster] {what}: ok", flush=True)
            return
        except OSError as exc:
            last = exc
            time.sleep(2)
    sys.exit(f"[gpucluster] {what}: not ready after {limit:.0f} s ({last})")


def main(args):
    mode, hosts, port, limit = args[0], args[1].split(","), int(args[2]), float(args[3])
    end = time.monotonic() + limit
    if mode == "dns":
        for host in hosts:
            wait(f"dns {host}", lambda h=host: socket.getaddrinfo(h, port, proto=socket.IPPROTO_TCP), end, limit)
        if args[4:5] == ["--"] and len(args) > 5:
            sys.stdout.flush()
            os.execvp(args[5], args[5:])
        return
    if mode != "rendezvous" or args[4:5] != ["--"] or len(args) < 6:
        sys.exit("usage: wait.py dns HOSTS PORT LIMIT [-- ARGV...] | wait.py rendezvous HOST PORT LIMIT -- ARGV...")
    wait(f"rendezvous {hosts[0]}:{port}", lambda: socket.create_connection((hosts[0], port), timeout=5).close(),
         end, limit)
    sys.stdout.flush()
    os.execvp(args[5], args[5:])


if __name__ == "__main__":
    main(sys.argv[1:])
