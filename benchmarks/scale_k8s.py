"""The Kubernetes launcher against the FAKE API server (tests/k8s_fake.py) with 16, 64 and 128 pods.

    python benchmarks/scale_k8s.py [SIZES...]      (default: 16 64 128; POLL=0.2)

For each size, two runs of `KubernetesLauncher.launch` + `collect_outputs` (an Indexed Job, outputs
copied back through the exec API, as a real run does):

- healthy: every pod prints a start record, 20 lines, a final record, and has one 64 KiB output
  file; measured: wall time of launch and of the copy-back, API calls by verb and per second, log
  streams opened, the peak of this process's threads and open file descriptors, and its resident
  memory (peak, VmHWM, and growth over the run);
- one failed pod: pod N/2 exits 3 while the others run on; measured: the time from its torchrun's
  end in the fake (the entry script's job_end record is in its log from then on; sampled every
  20 ms) to the first call that stops the other pods (an exec), and to `launch` returning with the
  failure (every other pod told to stop).

The fake lives in this process (its pods' threads and memory count here too: figures are an upper
bound for gpucluster's share) and its clock moves one tick per pod listing, so the launcher's poll
interval (2 s by default, POLL here) sets how fast pods start: the head pod starts N ticks after
the last (the fake's start-up skew). Not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _util import ROOT

sys.path.insert(0, str(ROOT / "tests"))

POLL = float(os.environ.get("POLL", "0.2"))


def _proc_status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _ours(t: threading.Thread) -> bool:
    """A thread gpucluster started (its target is gpucluster code, or a pool of gpucluster's), not
    one of the fake's (its pods' pumps and reapers, its log responses)."""
    target = getattr(t, "_target", None)
    module = getattr(target, "__module__", "") or ""
    return module.startswith("gpucluster") or t.name.startswith("ThreadPoolExecutor")


def _fds_under(folder: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(folder):
                n += 1
        except OSError:
            pass
    return n


class Sampler(threading.Thread):
    def __init__(self, log_dir: Path, watch=None):
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.peak = Counter()
        self.log_dir = str(log_dir)
        self.watch = watch  # () -> None, called every sample (the failure watch)

    def run(self) -> None:
        while not self.done.is_set():
            st = _proc_status()
            fds = len(os.listdir("/proc/self/fd"))
            self.peak["threads"] = max(self.peak["threads"], st["Threads"])
            self.peak["our_threads"] = max(self.peak["our_threads"], sum(map(_ours, threading.enumerate())))
            self.peak["fds"] = max(self.peak["fds"], fds)
            self.peak["log_fds"] = max(self.peak["log_fds"], _fds_under(self.log_dir))
            self.peak["rss_kb"] = max(self.peak["rss_kb"], st["VmRSS"])
            if self.watch:
                self.watch()
            self.done.wait(0.02)


def scripts(n: int, fail: int | None):
    from k8s_fake import PodScript
    from gpucluster.workloads.protocol import PREFIX

    def rec(kind, **f):
        return PREFIX + json.dumps({"kind": kind, **f})

    out = {}
    for r in range(n):
        lines = [rec("start", rank=r, world_size=n)] + [f"rank {r} step {i} loss 0.{i}" for i in range(20)]
        if r == fail:
            out[r] = PodScript(lines=lines + ["Traceback: RuntimeError: boom"], exit_code=3, run_s=1.0,
                               outputs={"model.pt": os.urandom(1 << 16)})
        else:
            lines.append(rec("final", rank=r, epochs=1, loss=0.1, accuracy=0.9, ok=True))
            out[r] = PodScript(lines=lines, exit_code=0 if fail is None else None, run_s=0.5,
                               outputs={"model.pt": os.urandom(1 << 16)})
    return out


def one(n: int, fail: int | None, work: Path) -> dict:
    from k8s_fake import FakeKubeApi

    from gpucluster.domain import Cluster
    from gpucluster.events import NullEvents
    from gpucluster.infra.kubernetes import launcher as k8s
    from gpucluster.watch.launch import JobSpec

    fake = FakeKubeApi(scripts(n, fail))
    stamps: list[tuple[float, str]] = []
    for verb in ("list_namespaced_pod", "read_namespaced_pod_log", "connect_get_namespaced_pod_exec",
                 "create_namespaced_job", "create_namespaced_service", "create_namespaced_config_map",
                 "delete_namespaced_job", "delete_namespaced_service", "delete_namespaced_config_map",
                 "list_namespaced_event"):
        orig = getattr(fake, verb)

        def timed(*a, _orig=orig, _verb=verb, **kw):
            stamps.append((time.monotonic(), _verb))
            return _orig(*a, **kw)
        setattr(fake, verb, timed)
    failed_at: list[float] = []

    def watch() -> None:
        if fail is not None and not failed_at:
            for pod in list(fake.pods.values()):
                if pod.index == fail and '"job_end"' in pod.log_text():  # the entry script saw torchrun end
                    failed_at.append(time.monotonic())

    cluster = Cluster(name="bench", cloud="gcp", nodes=(), gpus_per_node=1, kubeconfig="{}",
                      outputs={"nodes": n, "gpus_per_node": 1})
    run_id = f"r20261125-000000-{n:04x}{0 if fail is None else 1:02x}"
    job = JobSpec(run_id=run_id, command=("python", "train.py"), nproc_per_node=1, max_seconds=600,
                  output_dir=str(work / f"out-{n}-{fail}"))
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=POLL)
    rss0 = _proc_status()["VmRSS"]
    sampler = Sampler(work / f"logs-{n}-{fail}", watch)
    sampler.start()
    t0 = time.monotonic()
    result = launcher.launch(cluster, job, NullEvents(), work / f"logs-{n}-{fail}")
    t1 = time.monotonic()
    outs = launcher.collect_outputs(job, NullEvents())
    t2 = time.monotonic()
    sampler.done.set()
    sampler.join()
    fake.settle()
    verbs = Counter(v for _, v in stamps)
    out = {
        "n": n, "ok": result.ok, "failure": (result.failure or "")[:120], "launch_s": t1 - t0, "collect_s": t2 - t1,
        "calls": dict(verbs), "calls_per_s": len(stamps) / (t2 - t0),
        "list_per_s": verbs["list_namespaced_pod"] / (t1 - t0),
        "log_streams": sum(1 for c in fake.of("log") if c[5]), "threads": sampler.peak["threads"],
        "our_threads": sampler.peak["our_threads"], "fds": sampler.peak["fds"], "log_fds": sampler.peak["log_fds"], "rss_peak_mb": sampler.peak["rss_kb"] / 1024,
        "rss_growth_mb": (sampler.peak["rss_kb"] - rss0) / 1024,
        "outputs": Counter(o.verdict for o in outs), "left": (len(fake.objects), len(fake.pods)),
    }
    if fail is not None and failed_at:
        stops = [t for t, v in stamps if t > failed_at[0] and v in ("connect_get_namespaced_pod_exec",
                                                                     "delete_namespaced_job")]
        out["detect_s"] = t1 - failed_at[0]
        out["first_stop_s"] = (stops[0] - failed_at[0]) if stops else None
    return out


def main(sizes: list[int]) -> None:
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="gpucluster-bench-k8s-"))
    rows = []
    try:
        for n in sizes:
            for fail in (None, n // 2):
                r = one(n, fail, work)
                rows.append(r)
                if fail is None:
                    print(f"{n} pods, healthy: launch {r['launch_s']:.1f} s, copy-back {r['collect_s']:.1f} s "
                          f"({dict(r['outputs'])}); ok={r['ok']}; API calls {sum(r['calls'].values())} "
                          f"({r['calls_per_s']:.1f}/s; pod listings {r['list_per_s']:.2f}/s): {r['calls']}; "
                          f"log streams {r['log_streams']}; peak threads {r['threads']} (gpucluster's {r['our_threads']}), "
                          f"fds {r['fds']} (log files {r['log_fds']}), "
                          f"RSS {r['rss_peak_mb']:.0f} MB (+{r['rss_growth_mb']:.0f} MB); left {r['left']}")
                else:
                    first = r.get("first_stop_s")
                    print(f"{n} pods, pod {fail} fails: first stop sent {float('nan') if first is None else first:.2f} s "
                          f"after its torchrun ended, launch returned (every other pod stopped) after "
                          f"{r.get('detect_s', float('nan')):.2f} s; launch {r['launch_s']:.1f} s, copy-back "
                          f"{r['collect_s']:.1f} s; {dict(r['outputs'])}; failure: {r['failure']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    print(f"poll interval {POLL} s; load average {load0[0]:.1f} before, {load1[0]:.1f} after")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16, 64, 128])
