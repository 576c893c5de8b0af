"""The ssh launcher against 8, 16 and 32 hosts: real sshd servers on loopback (tests/sshd.py), one
`gpucluster run --cloud ssh` each, every phase timed and the gpucluster process watched.

    python benchmarks/scale_ssh.py [SIZES...]      (default: 8 16 32; DATA_MB=100)

Each host is its own sshd with its own HOME (SetEnv), so each "node" has its own run folder and
its own `--data` cache, as separate machines would. The run is what a user types:

    gpucluster run --cloud ssh --hosts u@127.0.0.1:P0,... --identity KEY --known-hosts FILE
                   --remote-python PY --data DATASET -- python job.py

`DATASET` is DATA_MB (default 100) MB in 10 files, staged to every node (cold cache); `job.py` is a
torch-free script (it writes a 1 MB file into its output folder and exits) under the real torchrun
agents, so the launch phase measures rendezvous and supervision, not a model. The phase times come
from the run's ledger row (`show --json`): ready (ssh masters, the node check, which imports torch
on each node), stage, rendezvous + train (the launch), outputs, teardown.

While it runs, the gpucluster process is sampled every 0.1 s from /proc: threads, open file
descriptors, resident memory (and its peak, VmHWM), its ssh child processes, the ssh
ControlMasters to these hosts and the established TCP connections to their ports. Peaks are
printed per phase. On this 2-core machine every node's torch imports (the check, the agent) share
two cores with sshd and gpucluster: wall times at 32 hosts measure that contention as much as
gpucluster. Not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _util import BIN, ROOT

sys.path.insert(0, str(ROOT / "tests"))
from sshd import SshdHosts, missing_reason  # noqa: E402

DATA_MB = int(os.environ.get("DATA_MB", "100"))
PHASES = ("prepare", "provision", "ready", "stage", "rendezvous", "train", "outputs", "teardown")
JOB = """import os
out = os.environ["GPUCLUSTER_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank-%s.bin" % os.environ["RANK"]), "wb") as f:
    f.write(os.urandom(1 << 20))
"""


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _tcp_to(ports: set[int]) -> int:
    """Established TCP connections (IPv4) whose remote end is one of `ports` on this machine."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) in ports:
                n += 1
    return n


def _rss_mb(pid: str) -> float:
    try:
        return _status(int(pid)).get("VmRSS", 0) / 1024
    except (OSError, ValueError):
        return 0.0


def _ssh_procs(pid: int, ports: set[int]) -> tuple[int, int, float]:
    """(ssh processes that are children of `pid`, ssh ControlMasters to `ports`, the resident
    memory of both together in MB)."""
    children = masters = 0
    rss = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if not argv or os.path.basename(argv[0]) != b"ssh":
            continue
        if ppid == pid:
            children += 1
            rss += _rss_mb(d)
        if b"ControlMaster=yes" in argv and "-p" in [a.decode() for a in argv]:
            port = argv[[a.decode() for a in argv].index("-p") + 1]
            if int(port) in ports:
                masters += 1
                rss += _rss_mb(d)
    return children, masters, rss


class Watcher(threading.Thread):
    def __init__(self, pid: int, ports: set[int]):
        super().__init__(daemon=True)
        self.pid, self.ports = pid, ports
        self.samples: list[dict[str, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                st = _status(self.pid)
                fds = len(os.listdir(f"/proc/{self.pid}/fd"))
                children, masters, ssh_rss = _ssh_procs(self.pid, self.ports)
                tcp = _tcp_to(self.ports)
            except (OSError, ValueError):
                return
            self.samples.append({"t": time.time(), "threads": st.get("Threads", 0), "rss_mb": st.get("VmRSS", 0) / 1024,
                                 "hwm_mb": st.get("VmHWM", 0) / 1024, "fds": fds, "ssh_children": children,
                                 "masters": masters, "ssh_rss_mb": ssh_rss, "tcp": tcp})
            self.done.wait(0.1)


def one(n: int, work: Path, data: Path, job_dir: Path) -> dict:
    hosts = SshdHosts.start(work / f"sshd{n}", n, env=[{"HOME": str(work / f"home{n}-{i}")} for i in range(n)])
    try:
        for i in range(n):
            (work / f"home{n}-{i}").mkdir()
        home = work / f"gchome{n}"
        env = dict(os.environ, GPUCLUSTER_HOME=str(home))
        argv = [str(BIN / "gpucluster"), "run", "--cloud", "ssh", "--hosts", ",".join(hosts.hosts),
                "--identity", str(hosts.identity), "--known-hosts", str(hosts.known_hosts),
                "--remote-python", sys.executable, "--threads-per-proc", "1", "--quiet", "--yes",
                "--data", str(data), "--", "python", str(job_dir / "job.py")]
        t0 = time.time()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watch = Watcher(proc.pid, set(hosts.ports))
        watch.start()
        out, _ = proc.communicate()
        wall = time.time() - t0
        watch.done.set()
        watch.join()
        if proc.returncode != 0:
            raise RuntimeError(f"{n} hosts: gpucluster exited {proc.returncode}:\n{out[-3000:]}")
        runs = json.loads(subprocess.run([str(BIN / "gpucluster"), "runs", "--json", "--limit", "1"], env=env,
                                         capture_output=True, text=True, check=True).stdout)
        run = json.loads(subprocess.run([str(BIN / "gpucluster"), "show", runs[0]["id"], "--json"], env=env,
                                        capture_output=True, text=True, check=True).stdout)
        phases = {p["name"]: (p["started_at"], p["ended_at"]) for p in run["phases"]}
        peaks: dict[str, dict[str, float]] = {}
        for name, (a, b) in phases.items():
            inside = [s for s in watch.samples if a <= s["t"] <= (b or a)]
            if inside:
                peaks[name] = {k: max(s[k] for s in inside) for k in inside[0] if k != "t"}
        overall = {k: max(s[k] for s in watch.samples) for k in watch.samples[0] if k != "t"}
        left = _ssh_procs(-1, set(hosts.ports))[1]  # ControlMasters still up after the run
        return {"n": n, "wall": wall, "phases": {k: (b - a) if b else None for k, (a, b) in phases.items()},
                "peaks": peaks, "overall": overall, "outputs": run.get("outputs"), "teardown": run["run"].get("teardown")
                if "run" in run else run.get("teardown"), "masters_left": left}
    finally:
        hosts.stop()


def main(sizes: list[int]) -> None:
    reason = missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return
    work = Path(tempfile.mkdtemp(prefix="gpucluster-bench-scale-"))
    load0 = os.getloadavg()
    try:
        data = work / "dataset"
        data.mkdir()
        for i in range(10):
            (data / f"part-{i}.bin").write_bytes(os.urandom(DATA_MB * (1 << 20) // 10))
        job_dir = work / "job"
        job_dir.mkdir()
        (job_dir / "job.py").write_text(JOB)
        results = []
        for n in sizes:
            r = one(n, work, data, job_dir)
            results.append(r)
            ph = r["phases"]
            launch = (ph.get("rendezvous") or 0) + (ph.get("train") or 0)
            print(f"{n} hosts: wall {r['wall']:.1f} s; ready {ph.get('ready', 0):.1f} s, stage {ph.get('stage', 0):.1f} s "
                  f"({n * DATA_MB} MB sent), launch {launch:.1f} s, outputs {ph.get('outputs', 0):.1f} s, "
                  f"teardown {ph.get('teardown', 0):.1f} s; teardown verdict {r['teardown']}; "
                  f"outputs {sorted({o['verdict'] for o in r['outputs'] or []})}")
            o = r["overall"]
            print(f"  gpucluster process peaks: {o['threads']:.0f} threads, {o['fds']:.0f} fds, RSS {o['rss_mb']:.0f} MB "
                  f"(VmHWM {o['hwm_mb']:.0f} MB), {o['ssh_children']:.0f} ssh children, {o['masters']:.0f} ControlMasters, "
                  f"{o['tcp']:.0f} TCP connections to the hosts; the ssh clients' RSS {o['ssh_rss_mb']:.0f} MB; "
                  f"ControlMasters left after the run: {r['masters_left']}")
            for name in PHASES:
                p = r["peaks"].get(name)
                if p:
                    print(f"    {name:10s} threads {p['threads']:3.0f}  fds {p['fds']:3.0f}  ssh children "
                          f"{p['ssh_children']:3.0f}  masters {p['masters']:3.0f}  tcp {p['tcp']:3.0f}  rss {p['rss_mb']:.0f} MB")
        load1 = os.getloadavg()
        print(f"load average {load0[0]:.1f} before, {load1[0]:.1f} after")
        print(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in results]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [8, 16, 32])
