"""The GPU checks of issue 49, as one script of a few minutes: the local backend, the node health check
and the sampler on a real GPU, and the CPU-vs-GPU figures. Not a test: it measures and writes down.

    python benchmarks/gpu_check.py [OUTDIR] [--budget SECONDS]

(`benchmarks/gpu_check.sh` installs gpucluster on a bare GPU machine first, then runs this.)

Each step runs the installed `gpucluster` CLI (or its node program) as a user would, with its own
GPUCLUSTER_HOME under OUTDIR/gpu-check/home, and its figures are read back from `show --json`.
Without a CUDA GPU (nvidia-smi absent, or torch without CUDA) the GPU steps are skipped with a line
saying so, and the CPU steps still run: that is the rehearsal on a CPU-only machine. Steps that
would start after --budget seconds are skipped (named in the summary), so the whole stays inside a
device lease.

Writes OUTDIR/gpu-check.tar.gz: gpu-check/log.txt (everything printed), summary.json and
summary.md (the figures), util-*.png (`show --plot`), sweep-*/ (the CPU-vs-GPU reports, with
plots), home/ (the ledger and the runs' logs); and beside it copies of summary.md, summary.json,
log.txt and the util-*.png plots (at most 7 files in all: what a device lease brings back).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BF16_DENSE_PEAK = {"H100": 989.0, "H200": 989.0}  # NVIDIA data sheets, SXM, dense (no sparsity), TFLOP/s


class Check:
    def __init__(self, out: Path, budget: float, base: Path) -> None:
        self.out = out
        self.base = base
        self.home = out / "home"
        self.start = time.monotonic()
        self.budget = budget
        self.summary: dict[str, Any] = {"steps": {}, "skipped": []}
        self.log = open(out / "log.txt", "a", buffering=1)
        self.env = dict(os.environ, GPUCLUSTER_HOME=str(self.home), GPUCLUSTER_CONFIG="", PYTHONUNBUFFERED="1")
        self.cli = shutil.which("gpucluster") or ""
        self.gpu = False

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def sh(self, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a command, its output into the log; never raises for a failing command."""
        self.say("$ " + " ".join(argv))
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.out)
        except subprocess.TimeoutExpired as exc:
            self.say(f"  timed out after {timeout:g} s")
            return subprocess.CompletedProcess(argv, 124, str(exc.stdout or ""), str(exc.stderr or ""))
        except OSError as exc:
            self.say(f"  could not start: {exc}")
            return subprocess.CompletedProcess(argv, 127, "", str(exc))
        self.log.write(cp.stdout[-20000:] + ("\n" if cp.stdout and not cp.stdout.endswith("\n") else ""))
        self.log.write(cp.stderr[-20000:] + ("\n" if cp.stderr and not cp.stderr.endswith("\n") else ""))
        self.say(f"  exit {cp.returncode}")
        return cp

    def gc(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.sh([self.cli, *args], timeout=timeout)

    def run_json(self, *args: str, timeout: float = 300) -> dict[str, Any]:
        """`gpucluster run ... --yes --json`, then `show --json` of the run (its metric records)."""
        cp = self.gc("run", "--cloud", "local", "--yes", "--json", *args, timeout=timeout)
        try:
            run = json.loads(cp.stdout)
        except ValueError:
            return {"status": "no json", "exit": cp.returncode, "stderr": cp.stderr[-2000:]}
        shown = self.gc("show", run["id"], "--json")
        try:
            run = json.loads(shown.stdout)
        except ValueError:
            pass
        run["_stderr"] = cp.stderr
        return run

    def step(self, name: str, fn: Callable[[], dict[str, Any]], *, gpu: bool = False, cost_s: float = 30) -> None:
        if gpu and not self.gpu:
            self.say(f"== {name}: skipped (no CUDA GPU here)")
            self.summary["skipped"].append({"step": name, "why": "no CUDA GPU"})
            return
        left = self.budget - (time.monotonic() - self.start)
        if left < cost_s:
            self.say(f"== {name}: skipped ({left:.0f} s of the {self.budget:g} s budget left, it needs ~{cost_s:g})")
            self.summary["skipped"].append({"step": name, "why": f"budget: {left:.0f} s left"})
            return
        self.say(f"== {name}")
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - one broken step must not lose the others' figures
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.monotonic() - t0, 1)
        self.summary["steps"][name] = result
        self.say(f"   {json.dumps(result, default=str)[:1500]}")
        self.save()

    def save(self) -> None:
        text = json.dumps(self.summary, indent=2, default=str)
        (self.out / "summary.json").write_text(text)
        (self.base / "summary.json").write_text(text)  # as it grows: a run cut short still brings it back


def records(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in run.get("metric_records") or [] if r.get("kind") == kind]


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Training time (the sum of epoch times) at the first epoch whose test accuracy reached target."""
    total = 0.0
    for e in records(run, "epoch"):
        total += float(e.get("epoch_time_s") or 0)
        if float(e.get("accuracy") or 0) >= target:
            return round(total, 3)
    return None


def epochs_of(run: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ("epoch", "accuracy", "loss", "epoch_time_s", "samples_per_s", "model_tflops", "comm_s", "compute_s")
    return [{k: e[k] for k in keys if k in e} for e in records(run, "epoch")]


def util_stats(run: dict[str, Any]) -> dict[str, Any]:
    gpus = [g for r in records(run, "util") for g in (r.get("gpu") or [])]
    utils = [g["util"] for g in gpus if isinstance(g.get("util"), (int, float))]
    mem = [g["mem_used_mib"] for g in gpus if isinstance(g.get("mem_used_mib"), (int, float))]
    power = [g["power_w"] for g in gpus if isinstance(g.get("power_w"), (int, float))]
    cpu = [r["cpu_percent"] for r in records(run, "util") if isinstance(r.get("cpu_percent"), (int, float))]
    return {"samples": len(records(run, "util")), "gpu_samples": len(gpus),
            "gpu_util_max": max(utils, default=None), "gpu_util_mean": round(sum(utils) / len(utils), 1) if utils else None,
            "gpu_mem_used_mib_max": max(mem, default=None), "gpu_power_w_max": max(power, default=None),
            "cpu_percent_mean": round(sum(cpu) / len(cpu), 1) if cpu else None}


def brief(run: dict[str, Any]) -> dict[str, Any]:
    start = (records(run, "start") or [{}])[0]
    return {"run": run.get("id"), "status": run.get("status"), "failure": run.get("failure"),
            "device": start.get("device"), "backend": start.get("backend"), "metrics": run.get("metrics"),
            "phases": {p["name"]: round(p["ended_at"] - p["started_at"], 2) for p in run.get("phases") or []
                       if p.get("ended_at") and p.get("started_at")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", nargs="?", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    p.add_argument("--budget", type=float, default=450.0, help="seconds after which no step starts (default 450)")
    args = p.parse_args(argv)
    base = Path(args.outdir)
    base.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "gpu-check"  # the runs' homes: many files
    out.mkdir()
    c = Check(out, args.budget, base)
    if not c.cli:
        print("gpu_check: no `gpucluster` on PATH (install it first: benchmarks/gpu_check.sh)", file=sys.stderr)
        return 2
    c.step("environment", lambda: environment(c))
    c.gpu = bool(c.summary["steps"]["environment"].get("cuda"))
    c.say(f"CUDA GPU: {'yes' if c.gpu else 'no: the GPU steps are skipped'}")
    c.step("peaks", lambda: peaks(c), gpu=True, cost_s=20)
    c.step("node_check", lambda: node_check(c), cost_s=20)
    c.step("health_check_run", lambda: health_run(c), cost_s=25)
    c.step("mnist_fast", lambda: mnist_fast(c), gpu=True, cost_s=30)
    c.step("mnist", lambda: mnist(c), gpu=True, cost_s=30)
    c.step("synthetic_bf16", lambda: synthetic_big(c, "bf16"), gpu=True, cost_s=30)
    c.step("cpu_vs_gpu_digits", lambda: compare(c, "digits", "--epochs", "5"), gpu=True, cost_s=30)
    c.step("two_nodes_one_gpu", lambda: two_nodes(c), cost_s=25)
    c.step("mnist_fast_grid", lambda: fast_grid(c), gpu=True, cost_s=40)
    c.step("cpu_vs_gpu_synthetic", lambda: compare(c, "synthetic", "--workload-args",
                                                   "--width 2048 --depth 4 --batch-size 1024 --steps 10",
                                                   "--epochs", "2"), gpu=True, cost_s=50)
    c.step("cpu_vs_gpu_mnist", lambda: compare(c, "mnist", "--epochs", "1"), gpu=True, cost_s=60)
    c.step("synthetic_tf32", lambda: synthetic_big(c, "tf32", steps=10), gpu=True, cost_s=40)
    c.step("mnist_fast_again", lambda: mnist_fast(c), gpu=True, cost_s=30)
    c.step("cpu_rehearsal_digits", lambda: brief(c.run_json("--nodes", "1", "--workload", "digits", "--epochs", "3")),
           cost_s=30)
    c.summary["total_s"] = round(time.monotonic() - c.start, 1)
    c.save()
    write_md(c)
    c.say(f"done in {c.summary['total_s']} s; figures in {out / 'summary.md'}")
    c.log.close()
    with tarfile.open(base / "gpu-check.tar.gz", "w:gz") as tar:
        tar.add(out, arcname="gpu-check", filter=lambda t: t if t.size < (1 << 20) else None)  # not checkpoints
    # the few files worth a look without unpacking (a device lease brings back at most 8)
    for name in ("summary.md", "summary.json", "log.txt", *sorted(p.name for p in out.glob("util-*.png"))[:4]):
        if (out / name).exists():
            shutil.copy2(out / name, base / name)
    shutil.rmtree(out.parent, ignore_errors=True)
    return 0


def environment(c: Check) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "commit": os.environ.get("GPUCLUSTER_COMMIT")}
    if shutil.which("nvidia-smi"):
        c.sh(["nvidia-smi"])
        q = c.sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                  "--format=csv,noheader"])
        info["nvidia_smi"] = q.stdout.strip()
    code = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'available': c, 'name': torch.cuda.get_device_name(0) if c else None, "
            "'capability': torch.cuda.get_device_capability(0) if c else None, "
            "'count': torch.cuda.device_count() if c else 0}))")
    cp = c.sh([sys.executable, "-c", code])
    try:
        t = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        t = {"error": cp.stderr[-500:]}
    info.update(torch=t.get("torch"), cuda_runtime=t.get("cuda"), gpu_name=t.get("name"),
                capability=t.get("capability"), gpus=t.get("count"), cuda=bool(t.get("available")))
    info["cpus"] = os.cpu_count()
    return info


PEAKS = r"""
import json, time, torch
out = {}
for name, dtype, n, tf32 in (("bf16", torch.bfloat16, 8192, False), ("tf32", torch.float32, 8192, True),
                             ("fp32", torch.float32, 4096, False)):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter(); k = 20
    for _ in range(k): a @ b
    torch.cuda.synchronize(); out[name + "_tflops"] = round(2 * n ** 3 * k / (time.perf_counter() - t) / 1e12, 1)
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x); y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); out["copy_tb_s"] = round(2 * x.numel() * 10 / (time.perf_counter() - t) / 1e12, 2)
print(json.dumps(out))
"""


def peaks(c: Check) -> dict[str, Any]:
    """What this GPU gives in plain torch: bf16/tf32/fp32 matmuls and a device copy (the references)."""
    cp = c.sh([sys.executable, "-c", PEAKS], timeout=120)
    return json.loads(cp.stdout.strip().splitlines()[-1])


def node_check(c: Check) -> dict[str, Any]:
    """The health check's node program alone, as a launcher starts it, on this machine's GPU(s)."""
    from gpucluster.node import node_check as program

    gpus = c.summary["steps"]["environment"].get("gpus") or 0
    cp = c.sh([sys.executable, program.__file__, "--rank", "0", "--world", "1", "--store", "127.0.0.1:1",
               "--addr", "127.0.0.1", "--gpus", str(gpus), "--disk", str(c.out)], timeout=120)
    recs = [json.loads(ln[len(program.PREFIX):]) for ln in cp.stdout.splitlines() if ln.startswith(program.PREFIX)]
    node = next((r for r in recs if r.get("kind") == "node"), {})
    from gpucluster.watch.health import fp32_peak, slow_gpus

    names = node.get("gpu_names") or []
    return {"node": node, "fp32_peak_tflops": fp32_peak(names[0]) if names else None,
            "slow": slow_gpus(node), "exit": cp.returncode}


def health_run(c: Check) -> dict[str, Any]:
    """`run --check` on one local node: the check phase through the lifecycle, its records."""
    run = c.run_json("--nodes", "1", "--check", "--", sys.executable, "-c", "pass")
    return {**brief(run), "node_check": records(run, "node_check"), "check": records(run, "check")}


def mnist_fast(c: Check) -> dict[str, Any]:
    run = c.run_json("--nodes", "1", "--workload", "mnist", "--workload-args", "--fast", timeout=240)
    final = next((r for r in records(run, "final") if r.get("rank") == 0), {})
    return {**brief(run), "epochs": epochs_of(run), "time_to_99_s": final.get("time_to_target_s"),
            "train_time_s": final.get("train_time_s")}


def fast_grid(c: Check) -> dict[str, Any]:
    """benchmarks/mnist_fast_grid.py: --fast's learning rate, epochs and shift, two seeds each."""
    cp = c.sh([sys.executable, str(ROOT / "benchmarks" / "mnist_fast_grid.py"), "--lrs", "0.001,0.002,0.004,0.008",
               "--epochs", "3,4", "--shifts", "0,2", "--seeds", "0,1", "--budget", "30"], timeout=120)
    rows = []
    for ln in cp.stdout.splitlines():
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue
    return {"exit": cp.returncode, "rows": rows, "stderr": cp.stderr[-800:] if cp.returncode else ""}


def mnist(c: Check) -> dict[str, Any]:
    run = c.run_json("--nodes", "1", "--workload", "mnist", "--epochs", "3", timeout=300)
    out = {**brief(run), "epochs": epochs_of(run), "time_to_99_s": time_to(run, 0.99),
           "time_to_98_s": time_to(run, 0.98), "util": util_stats(run)}
    if run.get("id"):
        png = c.out / "util-mnist.png"
        c.gc("show", run["id"], "--plot", str(png))
        out["plot"] = png.name if png.exists() else None
    return out


def two_nodes(c: Check) -> dict[str, Any]:
    """`--nodes 2` on this machine: on one GPU no node gets a whole GPU, so both train on the CPU."""
    run = c.run_json("--nodes", "2", "--workload", "digits", "--epochs", "3", timeout=240)
    said = [ln for ln in (run.get("_stderr") or "").splitlines() if "GPU(s) for" in ln]
    return {**brief(run), "said": said, "gpus_per_node": run.get("gpus_per_node")}


def synthetic_big(c: Check, precision: str, steps: int = 20) -> dict[str, Any]:
    """The synthetic MLP at a size where the GPU's matrix units can be busy: its model TFLOP/s."""
    wl = f"--width 4096 --depth 8 --batch-size 8192 --steps {steps} --precision {precision}"
    run = c.run_json("--nodes", "1", "--workload", "synthetic", "--epochs", "3", "--workload-args", wl, timeout=300)
    eps = epochs_of(run)
    best = max((e.get("model_tflops") or 0 for e in eps), default=0)
    gpu = c.summary["steps"]["environment"].get("gpu_name") or ""
    peak = next((v for k, v in BF16_DENSE_PEAK.items() if k in gpu), None)
    measured = (c.summary["steps"].get("peaks") or {}).get(f"{precision}_tflops")
    out = {**brief(run), "workload_args": wl, "epochs": eps, "model_tflops_best": best,
           "matmul_tflops_same_precision": measured, "datasheet_bf16_dense_tflops": peak,
           "of_matmul": round(best / measured, 3) if measured else None,
           "of_datasheet_bf16": round(best / peak, 3) if peak else None, "util": util_stats(run)}
    if run.get("id"):
        png = c.out / f"util-synthetic-{precision}.png"
        c.gc("show", run["id"], "--plot", str(png))
        out["plot"] = png.name if png.exists() else None
    return out


def compare(c: Check, workload: str, *extra: str) -> dict[str, Any]:
    """`sweep --compare-cpu` at one node: the same job with and without the GPU."""
    report = c.out / f"sweep-{workload}"
    cp = c.gc("sweep", "--cloud", "local", "--nodes", "1", "--compare-cpu", "--workload", workload, *extra,
              "--report", str(report), "--yes", "--json", timeout=400)
    try:
        data = json.loads(cp.stdout)
    except ValueError:
        return {"exit": cp.returncode, "stderr": cp.stderr[-1500:]}
    return {"exit": cp.returncode, "cpu_vs_gpu": data.get("cpu_vs_gpu"),
            "sizes": [{k: s.get(k) for k in ("nodes", "gpus_per_node", "train_s", "samples_per_s", "accuracy", "wall_s")}
                      for s in data.get("sizes") or data.get("summary") or []],
            "report": sorted(p.name for p in report.glob("*")) if report.exists() else []}


def write_md(c: Check) -> None:
    s = c.summary["steps"]
    env = s.get("environment", {})
    lines = ["# GPU check", "", f"- GPU: {env.get('gpu_name')} ({env.get('nvidia_smi')}); torch {env.get('torch')} "
             f"(CUDA {env.get('cuda_runtime')}); Python {env.get('python')}; {env.get('cpus')} CPUs; "
             f"commit {env.get('commit')}", f"- total {c.summary.get('total_s')} s", ""]
    for name, r in s.items():
        if name == "environment":
            continue
        lines.append(f"## {name} ({r.get('seconds')} s)")
        lines.append("```")
        lines.append(json.dumps({k: v for k, v in r.items() if k not in ("seconds",)}, indent=1, default=str)[:4000])
        lines.append("```")
    if c.summary["skipped"]:
        lines += ["## skipped", *[f"- {x['step']}: {x['why']}" for x in c.summary["skipped"]]]
    (c.out / "summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
