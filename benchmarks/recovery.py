"""Recovery time (issue 30 items 4 and 6): from a lost node to the recovered run training again.

Each case is a real recovery chain (gpucluster/lifecycle/recovery.py) of digits (2 nodes, seed 5, a
checkpoint every 10 steps) with node 1 lost mid-training (after the first epoch record), the
fault made as in the tests (tests/recovery_faults.py). Figures, from the fault:
  detect   the `node_lost` record's detected_at (the goal: <= 30 s)
  next     the next attempt's ledger row (the interrupted one has stopped its ranks, copied its
           outputs, torn down and been checked; the recovery loop starts provisioning again)
  train    the next attempt's `train` phase (provisioned, ready, staged, resumed)
and the chain's wall time against an uninterrupted run's (local only).

Cases (CASES=local,ssh,ssh-frozen,aws,gcp; default local,ssh,ssh-frozen: aws and gcp wait out their
clouds' provisioning delays, about 3 and 37 minutes with the defaults, so they run when named):
  local       the torchrun agent of local node 1 killed (SIGKILL)
  ssh         the torchrun agent on ssh host 1 killed (real sshd on loopback)
  ssh-frozen  ssh host 1 frozen (SIGSTOP: silent, connections open): the ssh keep-alive finds it
  aws         the fake EC2 nodes of tests/test_cloud_run.py (root, port 22 on 127.0.0.2/3) with a
              spot interruption notice from the fake IMDSv2; boot delays AWS_SSHD_DELAY_S (default 60)
              until sshd answers and AWS_MARKER_DELAY_S (default 30) until the ready marker, as a
              DLAMI instance takes "a few minutes" (EC2 user guide)
  gcp         the gcp provider on the fake Pulumi CLI with fake GKE clusters (tests/gke_fake.py: each
              `up` makes a new cluster, a fake API server whose pods run the real programs; `destroy`
              deletes it); node 1's pod preempted (GKE graceful node shutdown); pods listed every 2 s
              (the launcher's default); creation delays GKE_CLUSTER_DELAY_S (default 570: "Creation
              complete after 8m49s" / 10m30s, cluster-toolkit PR #4215) for the cluster and
              GKE_POOL_DELAY_S (default 540: a GPU node with its driver, about 9 minutes,
              codalab-worksheets#4042) for its GPU node pool; deletion is at once (GKE takes minutes)
Not a test.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from _util import ROOT

sys.path.insert(0, str(ROOT / "tests"))


def _chain(home: Path, spec, launcher, provider, store, fault=None, epochs: int = 4):
    from recovery_faults import Interrupting
    from test_recovery import _digits_job

    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.recovery import Policy, run_chain

    ledger = Ledger(home / "ledger.sqlite3")
    t0 = time.time()
    chain = run_chain(spec, _digits_job(spec.run_id, epochs=epochs), policy=Policy(retries=1, replace_bad_nodes=True),
                      ledger=ledger, provider=provider,
                      launcher=Interrupting(launcher, "train", fault) if fault else launcher,
                      workload="digits", backend=store)
    return chain, ledger, time.time() - t0


def _figures(name: str, chain, ledger, fault_at: float, wall: float, ref_wall: float | None = None) -> None:
    if len(chain.attempts) < 2:
        print(f"{name}: no recovery happened: {chain.attempts[-1].outcome.failure}")
        return
    first, second = chain.attempts[0], chain.attempts[1]
    lost = min(ledger.metrics(first.run_id, kind="node_lost"), key=lambda r: r["detected_at"])
    nxt = ledger.get_run(second.run_id)
    train = nxt.phase("train")
    parts = [f"detect {lost['detected_at'] - fault_at:.1f} s", f"next attempt {nxt.run.created_at - fault_at:.1f} s",
             f"training again {train.started_at - fault_at:.1f} s" if train else "never trained again",
             f"chain {wall:.1f} s" + (f" vs {ref_wall:.1f} s uninterrupted" if ref_wall else ""),
             f"final: {second.outcome.status}"]
    print(f"{name}: " + "; ".join(parts) + f" ({lost['cause']}: {lost['reason'][:80]})")


def local(home: Path) -> None:
    from recovery_faults import Fault, kill_node_procs

    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="local", nodes=2, name="bench-rec", gpus_per_node=0, run_id=new_run_id())
    _, _, ref = _chain(home, spec, LocalLauncher(), LocalProvider(), plugin("local"))
    spec = spec.replace(run_id=new_run_id())
    fault = Fault(kill_node_procs(lambda: [spec.run_id], 1, "torch.distributed.run"))
    chain, ledger, wall = _chain(home, spec, LocalLauncher(), LocalProvider(), plugin("local"), fault)
    _figures("local, agent killed", chain, ledger, fault.fired_at, wall, ref)


def ssh(home: Path, frozen: bool) -> None:
    import sshd
    from recovery_faults import Fault, freeze_host, kill_node_procs, reboot_host

    from gpucluster.infra.registry import plugin
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.spec import ClusterSpec, new_run_id

    hosts = sshd.SshdHosts.start(Path(tempfile.mkdtemp(prefix="bench-rec-sshd-")), 2)
    try:
        launcher = sshd.make_launcher(hosts, Path(tempfile.mkdtemp(prefix="bench-rec-remote-")))
        spec = ClusterSpec(cloud="ssh", nodes=2, name="bench-rec", gpus_per_node=0, run_id=new_run_id(),
                           hosts=tuple(hosts.hosts))
        if frozen:
            stopped: list[int] = []
            fault = Fault(lambda: stopped.extend(freeze_host(hosts, 1)), lambda: reboot_host(hosts, 1, stopped))
        else:
            fault = Fault(kill_node_procs(lambda: [spec.run_id], 1, "torch.distributed.run"))
        chain, ledger, wall = _chain(home, spec, launcher, SshProvider(launcher=launcher), plugin("ssh"), fault)
        _figures("ssh, host frozen" if frozen else "ssh, agent killed", chain, ledger, fault.fired_at, wall)
    finally:
        hosts.stop()


def aws(home: Path) -> None:
    import http.server
    import threading

    import test_cloud_run as tcr
    from imds_fake import FakeImds
    from recovery_faults import Fault

    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec, new_run_id

    if os.geteuid() != 0 or not tcr._port_22_free():
        print("aws (fake EC2): skipped (needs root and a free port 22 on 127.0.0.2/3)")
        return
    tcr.SSHD_DELAY_S = float(os.environ.get("AWS_SSHD_DELAY_S", "60"))
    tcr.MARKER_DELAY_S = float(os.environ.get("AWS_MARKER_DELAY_S", "30"))

    class CheckIp(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(f"{tcr.CALLER}\n".encode())

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CheckIp)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    os.environ["GPUCLUSTER_CHECKIP_URL"] = f"http://127.0.0.1:{srv.server_address[1]}/"
    made = not tcr.DLAMI_PYTHON.exists()
    if made:
        tcr.DLAMI_PYTHON.parent.mkdir(parents=True, exist_ok=True)
        tcr.DLAMI_PYTHON.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        tcr.DLAMI_PYTHON.chmod(0o755)
    root = Path(tempfile.mkdtemp(prefix="bench-rec-ec2-"))
    (root / "ec2").mkdir()
    ec2 = tcr.Ec2Like(root / "ec2")
    imds = [FakeImds(), FakeImds()]
    ec2.node_envs = [{"GPUCLUSTER_IMDS_URL": m.url} for m in imds]
    terminate = ec2.terminate
    ec2.terminate = lambda: (terminate(), [m.clear() for m in imds])  # new instances: a fresh metadata service
    try:
        provider, _, _ = tcr._provider_and_fake(ec2)
        launcher = tcr._launcher(root, ready_timeout=600)
        spec = ClusterSpec(cloud="aws", nodes=2, name="bench-rec", region="us-east-1", instance_type="g5.xlarge",
                           ssh_cidr="127.0.0.1/32", gpus_per_node=1, spot=True, run_id=new_run_id())
        fault = Fault(lambda: imds[1].schedule("terminate", 120), lambda: None)
        chain, ledger, wall = _chain(home, spec, launcher, provider, plugin("aws"), fault, epochs=30)
        _figures(f"aws fake, spot notice (boot: sshd {tcr.SSHD_DELAY_S:g} s + marker {tcr.MARKER_DELAY_S:g} s)",
                 chain, ledger, imds[1].scheduled_at, wall)
    finally:
        ec2.terminate()
        for m in imds:
            m.stop()
        srv.shutdown()
        if made:
            import shutil

            shutil.rmtree("/opt/pytorch", ignore_errors=True)


def gcp(home: Path) -> None:
    from gke_fake import GkeLike
    from recovery_faults import Fault

    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec, new_run_id

    cluster_s = float(os.environ.get("GKE_CLUSTER_DELAY_S", "570"))
    pool_s = float(os.environ.get("GKE_POOL_DELAY_S", "540"))
    gke = GkeLike(cluster_s=cluster_s, pool_s=pool_s)
    provider, _ = gke.provider("bench-rec")
    spec = ClusterSpec(cloud="gcp", nodes=2, name="bench-rec", zone="us-central1-a", instance_type="n1-standard-8",
                       accelerator="nvidia-tesla-v100", gpus_per_node=1, project="my-proj-42", spot=True,
                       run_id=new_run_id())
    fault = Fault(lambda: gke.current.preempt(1, reason="Shutdown"))
    try:
        chain, ledger, wall = _chain(home, spec, gke.launcher(poll_interval=2.0), provider, plugin("gcp"), fault)
    finally:
        gke.stop()
    _figures(f"gcp fake, pod preempted (creation: cluster {cluster_s:g} s + GPU pool {pool_s:g} s)",
             chain, ledger, fault.fired_at, wall)


def main() -> None:
    os.environ.setdefault("GPUCLUSTER_HOME", tempfile.mkdtemp(prefix="gpucluster-bench-rec-"))
    home = Path(os.environ["GPUCLUSTER_HOME"])
    cases = os.environ.get("CASES", "local,ssh,ssh-frozen").split(",")
    for case in cases:
        if case == "local":
            local(home)
        elif case == "ssh":
            ssh(home, frozen=False)
        elif case == "ssh-frozen":
            ssh(home, frozen=True)
        elif case == "aws":
            aws(home)
        elif case == "gcp":
            gcp(home)


if __name__ == "__main__":
    main()
