"""`--data` staging over ssh (two real sshd "nodes" on loopback, tests/sshd.py): bytes sent and
seconds for a cold cache, a rerun with unchanged data (goal: under 1% of the bytes), and a rerun
with one file changed; `scp -r` of the same folder to one node for scale.

    python benchmarks/data_stage.py [MB] [FILES]     (default 100 MB in 100 files)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshd import SshdHosts, cluster_of, free_port, make_launcher, Recorder  # noqa: E402


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    nfiles = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.staging import parse_data

    tmp = Path(tempfile.mkdtemp(prefix="gcdata-"))
    hosts = SshdHosts.start(tmp / "sshd", 2)
    try:
        ds = tmp / "dataset"
        ds.mkdir()
        size = mb * 1024 * 1024 // nfiles
        for i in range(nfiles):
            (ds / f"part-{i:04d}.bin").write_bytes(os.urandom(size))
        total = size * nfiles
        os.chdir(tmp)
        print(f"data: {nfiles} files, {total / 2**20:.0f} MB; 2 nodes (sshd on loopback, one shared cache)")
        for label in ("cold cache", "unchanged rerun", "one file changed"):
            if label == "one file changed":
                (ds / "part-0003.bin").write_bytes(os.urandom(size))
            run_id = f"bench-{label.split()[0]}-{os.getpid()}"
            job = JobSpec(run_id, command=("true",), rdzv_port=free_port(), max_seconds=300,
                          data=parse_data([str(ds)]))
            events = Recorder()
            launcher = make_launcher(hosts, tmp / "remote", data_cache=str(tmp / "cache"))
            t0 = time.monotonic()
            result = launcher.launch(cluster_of(hosts, 2), job, events, tmp / "logs" / run_id)
            assert result.ok, result.failure
            recs = [r for _, r in events.metrics if r.get("kind") == "stage"]
            sent = sum(r["sent_bytes"] for r in recs)
            print(f"{label:17s} sent {sent / 2**20:8.2f} MB = {100 * sent / (2 * total):6.2f}% of 2 x data; "
                  f"slowest node stage {max(r['seconds'] for r in recs):.2f} s; run {time.monotonic() - t0:.1f} s")
        node = hosts.hosts[0]
        user_host, port = node.rsplit(":", 1)
        t0 = time.monotonic()
        subprocess.run(["scp", "-O", "-q", "-r", "-P", port, "-i", str(hosts.identity), "-o", "BatchMode=yes",
                        "-o", f"UserKnownHostsFile={hosts.known_hosts}", str(ds), f"{user_host}:{tmp}/scp-copy"],
                       check=True)
        print(f"scp -r to one node: {time.monotonic() - t0:.2f} s")
    finally:
        hosts.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
