"""Utilisation sampler: per node GPU utilisation, memory and power (NVML) and CPU utilisation.

Standard library only, plus two optional packages used when installed: nvidia-ml-py (`import
pynvml`) for the GPUs and psutil for the CPU (without it, /proc/stat is read). It writes "util"
records through the metrics protocol (see protocol.py), so they reach the ledger like every other
metric, whatever the backend.

Two ways to use it:

- inside a workload, on local rank 0, during training only::

      s = Sampler(node_rank=ctx.node_rank).start()
      ...train...
      s.stop()

- as a process beside any user script, one per node, until SIGTERM/SIGINT or its parent exits::

      python -m gpucluster.workloads.sampler --run-id RUN --node-rank 0 --interval 1

  (`sampler_argv(python, node_rank)` builds that command line for a launcher.)

GPUs: the ones this node's processes see. NVML numbers devices without regard to
CUDA_VISIBLE_DEVICES, so a CUDA_VISIBLE_DEVICES of indices or UUIDs selects among them; an empty
CUDA_VISIBLE_DEVICES means none. Without pynvml or without a driver, the gpu list is empty.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

try:
    from gpucluster.workloads.protocol import emit
except ImportError:  # run as a script from a shipped copy of this folder
    from protocol import emit  # type: ignore[no-redef, import-not-found]

DEFAULT_INTERVAL = 1.0
INTERVAL_ENV = "GPUCLUSTER_UTIL_INTERVAL"  # seconds between samples; "0" turns sampling off


def interval_from_env(default: float = DEFAULT_INTERVAL) -> float:
    """The sampling interval from GPUCLUSTER_UTIL_INTERVAL (0 = off); bad values fall back."""
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value >= 0 else default


# -- CPU ------------------------------------------------------------------------------------
class CpuMeter:
    """Whole-machine CPU busy percentage since the previous call.

    Computed from cumulative CPU times (/proc/stat, else psutil.cpu_times()), not from
    psutil.cpu_percent(None), whose state is kept per calling thread.
    """

    def __init__(self) -> None:
        self._last = self._times()
        self._previous: float | None = None

    @staticmethod
    def _times() -> tuple[float, float] | None:
        """(total, idle incl. iowait) cumulative seconds or ticks, or None when unknown."""
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()
            if fields and fields[0] == "cpu":
                values = [float(v) for v in fields[1:]]
                idle = values[3] + (values[4] if len(values) > 4 else 0.0)
                return sum(values[:8]), idle  # guest time is already counted in user/nice
        except (OSError, ValueError):
            pass
        try:
            import psutil
        except ImportError:
            return None
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        total = sum(v for k, v in t._asdict().items() if k not in ("guest", "guest_nice"))
        return total, idle

    def percent(self) -> float | None:
        now = self._times()
        if now is None or self._last is None:
            self._last = now
            return None
        total, idle = now[0] - self._last[0], now[1] - self._last[1]
        if total <= 0:  # no clock tick (10 ms) since the previous call: keep measuring from there
            return self._previous
        self._last = now
        self._previous = round(100.0 * (total - idle) / total, 1)
        return self._previous


class TreeCpuMeter:
    """CPU used by one process tree (a node's own processes: its torchrun agent, or its supervisor, and
    every descendant) since the previous call, as cores busy and as % of this machine's cores. Where
    several "nodes" share one machine (the local backend), each node's line is its own processes, not
    the machine's. psutil when installed, else /proc (Linux); None where neither can read the tree.

    A process's CPU time includes that of the children it has waited for (cutime/cstime, psutil's
    children_user/children_system), so a worker that exits and is reaped inside the tree still counts."""

    def __init__(self, root: int) -> None:
        self.root = int(root)
        self.cpus = os.cpu_count() or 1
        self._last = (time.monotonic(), self._seconds())
        self._previous: tuple[float | None, float | None] = (None, None)

    def _seconds(self) -> float | None:
        try:
            import psutil
        except ImportError:
            return self._proc_seconds()
        try:
            top = psutil.Process(self.root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue  # ended between the listing and the reading
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        return total

    def _proc_seconds(self) -> float | None:
        try:
            tick = float(os.sysconf("SC_CLK_TCK"))
            pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        except (OSError, ValueError, AttributeError):
            return None
        parent: dict[int, int] = {}
        ticks: dict[int, float] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parent[pid] = int(fields[1])  # after the command: state, ppid, ..., utime (12), stime, cutime, cstime
            ticks[pid] = sum(float(v) for v in fields[11:15])
        if self.root not in ticks:
            return None
        tree, todo = set(), [self.root]
        while todo:
            pid = todo.pop()
            tree.add(pid)
            todo += [c for c, pp in parent.items() if pp == pid and c not in tree]
        return sum(ticks[p] for p in tree) / tick

    def read(self) -> tuple[float | None, float | None]:
        """(cores busy, % of the machine's cores) since the previous call."""
        now, cpu = time.monotonic(), self._seconds()
        then, before = self._last
        if cpu is None or before is None:
            self._last = (now, cpu)
            return (None, None)
        if now - then < 0.02:  # too soon to tell: the last reading
            return self._previous
        cores = max(0.0, cpu - before) / (now - then)  # a process that left the tree unreaped: not negative
        self._last = (now, cpu)
        self._previous = (round(cores, 2), round(min(100.0, 100.0 * cores / self.cpus), 1))
        return self._previous


# -- GPU ------------------------------------------------------------------------------------
def _visible(index: int, uuid: str | None, visible: str | None) -> bool:
    if visible is None:
        return True
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    for w in wanted:
        if w.isdigit() and int(w) == index:
            return True
        if uuid and (w == uuid or (w.startswith("GPU-") and uuid.startswith(w))):
            return True
    return False


class GpuMeter:
    """NVML readings for the GPUs this node's processes see; `available` is False without NVML."""

    def __init__(self, nvml: Any = None, visible: str | None = None) -> None:
        self.handles: list[tuple[int, Any]] = []
        self.available = False
        self.error: str | None = None
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")  # nvidia-ml-py
            except ImportError:
                self.error = "pynvml (nvidia-ml-py) is not installed"
                return
        self.nvml = nvml
        if visible is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError: no driver, no device
            self.error = f"NVML unavailable: {exc}"
            return
        self.available = True
        try:
            count = nvml.nvmlDeviceGetCount()
            for i in range(count):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    uuid = nvml.nvmlDeviceGetUUID(h)
                    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                except Exception:
                    uuid = None
                if _visible(i, uuid, visible):
                    self.handles.append((i, h))
        except Exception as exc:
            self.error = f"NVML device query failed: {exc}"

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        nvml = getattr(self, "nvml", None)
        if nvml is None:  # without NVML there are no handles either
            return out
        for index, h in self.handles:
            rec: dict[str, Any] = {"index": index}
            try:
                rec["util"] = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                rec["util"] = None
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                rec["mem_used_mib"] = round(mem.used / 2**20, 1)
                rec["mem_total_mib"] = round(mem.total / 2**20, 1)
            except Exception:
                rec["mem_used_mib"] = rec["mem_total_mib"] = None
            try:
                rec["power_w"] = round(nvml.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)  # milliwatts
            except Exception:
                rec["power_w"] = None
            out.append(rec)
        return out

    def close(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False


# -- the sampler ----------------------------------------------------------------------------
class Sampler:
    """Writes one "util" record every `interval` seconds from a daemon thread, and one on stop.

    `emit_fn(kind, **fields)` defaults to protocol.emit on stdout. Sampling never raises into the
    training loop: a failing reading is recorded as None.
    """

    def __init__(self, node_rank: int = 0, interval: float = DEFAULT_INTERVAL, *, nvml: Any = None,
                 visible: str | None = None, emit_fn: Callable[..., None] | None = None,
                 extra: dict[str, Any] | None = None, root_pid: int | None = None) -> None:
        self.node_rank = node_rank
        self.interval = max(0.05, float(interval))
        self.emit = emit_fn or emit
        self.extra = dict(extra or {})
        # root_pid: the node's own processes (that tree); None: the whole machine
        self.tree = TreeCpuMeter(root_pid) if root_pid is not None else None
        self.cpu = CpuMeter()
        self.gpu = GpuMeter(nvml=nvml, visible=visible)
        self.count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> dict[str, Any]:
        """Take one reading and emit it; returns the fields written."""
        fields: dict[str, Any] = {"node_rank": self.node_rank, "gpu": self.gpu.read()}
        if self.tree is not None:
            fields["cpu_cores"], fields["cpu_percent"] = self.tree.read()
            fields["cpu_scope"] = "node"  # the node's processes, as % of the machine's cores
        else:
            fields["cpu_percent"], fields["cpu_scope"] = self.cpu.percent(), "machine"
        fields.update(self.extra)
        with self._lock:
            self.emit("util", **fields)
            self.count += 1
        return fields

    def _loop(self) -> None:
        # a short job still gets several points: the first samples come sooner (0.25 s, 0.5 s, ...)
        wait = min(self.interval, 0.25)
        while not self._stop.wait(wait):
            wait = min(self.interval, wait * 2)
            try:
                self.sample()
            except Exception:  # never take training down for a metric
                pass

    def start(self) -> "Sampler":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpucluster-util", daemon=True)
            self._thread.start()
        return self

    def stop(self, final_sample: bool = True) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            if final_sample:
                try:
                    self.sample()
                except Exception:
                    pass
        self.gpu.close()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def sampler_argv(python: str, node_rank: int, run_id: str | None = None,
                 interval: float = DEFAULT_INTERVAL, workload_dir: str | None = None,
                 root_pid: int | None = None) -> list[str]:
    """The command line a launcher starts beside a user's script on each node (argv list).

    With `workload_dir` (a copy of this folder shipped to the node) it runs sampler.py from
    there; otherwise the installed module.
    """
    prog = [f"{workload_dir.rstrip('/')}/sampler.py"] if workload_dir else ["-m", "gpucluster.workloads.sampler"]
    argv = [python, *prog, "--node-rank", str(int(node_rank)), "--interval", f"{float(interval):g}"]
    if run_id:
        argv += ["--run-id", run_id]
    if root_pid is not None:
        argv += ["--root-pid", str(int(root_pid))]
    return argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write per-node GPU/CPU utilisation records (gpucluster metrics protocol) "
                                            "until SIGTERM/SIGINT or the parent process exits.")
    p.add_argument("--node-rank", type=int, default=int(os.environ.get("GPUCLUSTER_NODE_RANK", "0")))
    p.add_argument("--run-id", default=os.environ.get("GPUCLUSTER_RUN_ID"),
                   help="the run this sampler belongs to (recorded on every record)")
    p.add_argument("--interval", type=float, default=interval_from_env(), help="seconds between samples")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--root-pid", type=int, default=None,
                   help="CPU of this process and its descendants (the node's own processes) instead of the machine's")
    args = p.parse_args(argv)
    if args.interval <= 0:
        return 0
    extra = {"source": "sampler"}
    if args.run_id:
        extra["run_id"] = args.run_id
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    parent = os.getppid()
    deadline = time.monotonic() + args.duration if args.duration else None
    sampler = Sampler(node_rank=args.node_rank, interval=args.interval, extra=extra, root_pid=args.root_pid)
    wait = min(sampler.interval, 0.25)  # as the thread does: early points for a short job
    try:
        while not stop.wait(wait):
            wait = min(sampler.interval, wait * 2)
            sampler.sample()
            if os.getppid() != parent:  # the launcher went away: do not outlive it
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        sampler.gpu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
