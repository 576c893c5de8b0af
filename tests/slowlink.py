"""A slow link for real. Run inside a network namespace of its own (`unshare -n`: the machine's own
network is untouched, and everything goes away with the process), it makes three "hosts", each a
network namespace of its own (held by a `sleep`, entered with nsenter) joined to a bridge by a veth
pair, as three machines on one switch: 10.9.0.2, .3 and .4, one sshd each. Node 1's link is
throttled both ways by the kernel's token bucket filter (tc-tbf(8)) on its veth pair, so every
flow to or from that host is slow whoever opens it; the other links run at veth speed. Then a real
`gpucluster` ssh run with the health check on; what it recorded is printed as JSON.

    unshare -n python tests/slowlink.py WORKDIR [RATE|none]

Used by tests/test_health_ssh.py (and by hand: RATE `none` leaves the link alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

ADDRESSES = ["10.9.0.2", "10.9.0.3", "10.9.0.4"]
SLOW = 1


def sh(*argv: str, pid: int | None = None) -> None:
    prefix = ["nsenter", "-t", str(pid), "-n"] if pid else []
    subprocess.run([*prefix, *argv], check=True, capture_output=True)


def hosts_on_a_bridge(rate: str) -> list[subprocess.Popen]:
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "addr", "add", "10.9.0.1/24", "dev", "br0")
    sh("ip", "link", "set", "br0", "up")
    mine = os.readlink("/proc/self/ns/net")
    holders = []
    for i, addr in enumerate(ADDRESSES):
        holder = subprocess.Popen(["unshare", "-n", "sleep", "infinity"])
        holders.append(holder)
        end = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/net") == mine:
            if time.monotonic() > end:
                raise RuntimeError("the host's network namespace was not made")
            time.sleep(0.01)
        sh("ip", "link", "add", f"vh{i}", "type", "veth", "peer", "name", f"vn{i}")
        sh("ip", "link", "set", f"vn{i}", "netns", str(holder.pid))
        sh("ip", "link", "set", f"vh{i}", "master", "br0")
        sh("ip", "link", "set", f"vh{i}", "up")
        sh("ip", "link", "set", "lo", "up", pid=holder.pid)
        sh("ip", "addr", "add", f"{addr}/24", "dev", f"vn{i}", pid=holder.pid)
        sh("ip", "link", "set", f"vn{i}", "up", pid=holder.pid)
        if i == SLOW and rate != "none":
            for dev, pid in ((f"vn{i}", holder.pid), (f"vh{i}", None)):  # out of the host, and into it
                sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                   "latency", "400ms", pid=pid)
    return holders


def main() -> None:
    work = Path(sys.argv[1])
    rate = sys.argv[2] if len(sys.argv) > 2 else "40mbit"
    holders = hosts_on_a_bridge(rate)
    os.environ["GPUCLUSTER_HOME"] = str(work / "home")
    import sshd

    from gpucluster.watch.health import HealthSpec
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.infra.registry import plugin as backend_of
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id

    hosts = None
    try:
        hosts = sshd.SshdHosts.start(work / "sshd", 3, addresses=ADDRESSES,
                                     wrap=[["nsenter", "-t", str(h.pid), "-n"] for h in holders])
        launcher = sshd.make_launcher(hosts, work / "remote")
        spec = ClusterSpec(cloud="ssh", nodes=3, name="slow", gpus_per_node=0, run_id=new_run_id(),
                           hosts=tuple(hosts.hosts))
        ledger = Ledger(work / "home" / "ledger.sqlite3")
        job = JobSpec(run_id=spec.run_id, command=(sys.executable, "-c", "pass"), check=HealthSpec(timeout_s=60),
                      max_seconds=120)
        outcome = execute(spec, job, backend=backend_of(spec.cloud),
                          ledger=ledger, provider=SshProvider(launcher=launcher), launcher=launcher)
        print(json.dumps({"status": outcome.status, "failure": outcome.failure, "teardown": outcome.teardown,
                          "links": ledger.metrics(spec.run_id, kind="link"),
                          "lost": ledger.metrics(spec.run_id, kind="node_lost"),
                          "left": sshd.run_processes(spec.run_id),
                          "remote_left": (work / "remote" / spec.run_id).exists()}))
    finally:
        if hosts is not None:
            hosts.stop()
        for h in holders:
            h.kill()
            h.wait()


if __name__ == "__main__":
    main()
