"""Copy-back of a node's outputs over ssh on loopback vs `scp -r` of the same folder.

One real sshd on 127.0.0.1 (tests/sshd.py). A folder of OUTPUTS_MB (default 500) MB of random
bytes (files of 1-50 MB and a subfolder) is copied back (a) by `Session.copy_outputs`, the ssh
launcher's own path (`tar -cf - .` on the "node" over the run's ControlMaster connection,
unpacked here member by member), and (b) by `scp -O -r` (the classic scp protocol: the test
sshd has no sftp subsystem) with the same key, known_hosts and cipher defaults, through the same
master connection. Runs interleaved, ROUNDS (default 5) times; the
median ratio is printed (goal <= 1.2), with the load average before and after. Checksums of both copies are compared with the source.
Not a test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from sshd import SshdHosts, missing_reason  # noqa: E402

from gpucluster.domain import NullEvents  # noqa: E402
from gpucluster.infra.ssh.launch import SshLauncher  # noqa: E402
from gpucluster.infra.ssh.provider import SshProvider  # noqa: E402
from gpucluster.infra.ssh.session import Session  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

MB = int(os.environ.get("OUTPUTS_MB", "500"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def make_source(root: Path, total_mb: int) -> None:
    sizes = [50, 20, 10, 5, 1]
    left, i = total_mb, 0
    (root / "ckpt").mkdir(parents=True)
    while left > 0:
        mb = min(sizes[i % len(sizes)], left)
        target = root / ("ckpt" if i % 2 else ".") / f"part-{i:03d}.bin"
        with open(target, "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
        left -= mb
        i += 1


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(root)).encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def main() -> int:
    reason = missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="gpucluster-bench-outputs-"))
    hosts = SshdHosts.start(work / "sshd", 1)
    try:
        src = work / "node" / "outputs"
        make_source(src, MB)
        want = digest(src)
        spec = ClusterSpec(cloud="ssh", nodes=1, name="bench", hosts=tuple(hosts.hosts[:1]))
        cluster = SshProvider().up(spec, NullEvents())
        launcher = SshLauncher(str(hosts.identity), str(hosts.known_hosts), python=sys.executable)
        node = cluster.nodes[0]
        ours, theirs = [], []
        with Session(launcher, cluster) as session:
            session.open_master(node)
            for r in range(ROUNDS):
                dest = work / f"ours-{r}"
                t0 = time.perf_counter()
                res = session.copy_outputs(node, str(src), dest)
                ours.append(time.perf_counter() - t0)
                assert res.verdict == "complete", res
                assert digest(dest) == want
                shutil.rmtree(dest)

                dest = work / f"scp-{r}"
                argv = ["scp", "-O", "-r", "-q", "-P", str(node.port), *session.base_opts,
                        f"{node.user}@{node.host}:{src}", str(dest)]
                t0 = time.perf_counter()
                subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
                theirs.append(time.perf_counter() - t0)
                assert digest(dest) == want
                shutil.rmtree(dest)
        ratio = statistics.median(a / b for a, b in zip(ours, theirs))
        load1 = os.getloadavg()
        print(f"outputs copy-back of {MB} MB over ssh on loopback, {ROUNDS} interleaved rounds; load average "
              f"{load0[0]:.1f} before, {load1[0]:.1f} after")
        print(f"  copy_outputs (tar stream over ControlMaster): median {statistics.median(ours):.2f} s "
              f"({MB / statistics.median(ours):.0f} MB/s); runs {', '.join(f'{x:.2f}' for x in ours)}")
        print(f"  scp -r (same connection options):             median {statistics.median(theirs):.2f} s "
              f"({MB / statistics.median(theirs):.0f} MB/s); runs {', '.join(f'{x:.2f}' for x in theirs)}")
        print(f"  ratio copy_outputs / scp -r: {ratio:.2f} (goal <= 1.2)")
        return 0
    finally:
        hosts.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
