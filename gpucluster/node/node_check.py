"""The health check one node runs before training. gpucluster (gpucluster/watch/health.py) starts it on
every node at once, reads what it prints and judges. Standard library + torch: shipped to ssh/aws
nodes with the job's files, run in place on local nodes.

    python node_check.py --rank R --world N --store HOST:PORT --addr ADDR [--gpus G] [--disk PATH]
        [--min-free-gb X] [--pair-mib M] [--allreduce-mib M] [--timeout S]

What it checks (each finding is data, not an exit status):
- its own GPUs: nvidia-smi's list (only this node's, when CUDA_VISIBLE_DEVICES names them), the
  CUDA devices torch sees, a short fp32 matmul on each (TF32 off), checked against the diagonal of
  the same product computed another way; DCGM's quick diagnostic (`dcgmi diag -r 1`) when the
  node has dcgmi;
- the free space at --disk;
- then, once every node has said its own checks passed (through a TCP store on node 0), a process
  group of one process per node (NCCL on GPUs, gloo on CPU, bound to --addr): a timed all-reduce,
  and a timed exchange with every other node, one pair at a time (a round-robin schedule).

It prints one JSON object per line behind `@gpucluster-check ` (kinds: hello, node, links, done)
and exits 0 once it has reported, whatever it found; it leaves at once (os._exit) so that no
library's shutdown can turn a finished check into a crash.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # the node imports torch only where it checks with it (and says so when it cannot)
    from torch import Tensor
    from torch.distributed import Store

PREFIX = "@gpucluster-check "
ITERS = 3  # timed exchanges per pair (the fastest counts) and timed all-reduces, after one warm-up each


def say(kind: str, **fields: object) -> None:
    print(PREFIX + json.dumps({"kind": kind, **fields}, default=str), flush=True)


NVIDIA_BIN = "/usr/local/nvidia/bin"


def no_kernel_hint(error: str, torch, index: int) -> str:
    """Why CUDA says "no kernel image is available": the torch build in the image has no code for this
    GPU's compute capability (PyTorch's cu128/cu130 wheels dropped Volta, sm_70: pytorch/pytorch#172352;
    CUDA 13 dropped it too)."""
    if "no kernel image" not in error:
        return ""
    try:
        major, minor = torch.cuda.get_device_capability(index)
        archs = " ".join(torch.cuda.get_arch_list())
    except Exception:  # noqa: BLE001 - the hint goes without the figures
        return ": this torch build has no kernels for this GPU; use an image with a build that supports it"
    return (f": this torch build (CUDA {torch.version.cuda}, built for {archs}) has no kernels for this GPU "
            f"(compute capability {major}.{minor}); on a V100 (7.0) use a CUDA 12.6 build (e.g. the image "
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime, or pip's cu126 wheels)")


class NvidiaGpu(TypedDict):
    """One GPU as nvidia-smi lists it."""

    index: int
    uuid: str
    name: str


def nvidia_smi_gpus() -> tuple[list[NvidiaGpu] | None, str | None]:
    """This node's GPUs as nvidia-smi lists them: [{index, uuid, name}], or (None, why not)."""
    # GKE's driver installer puts the tools in /usr/local/nvidia/bin, mounted into GPU containers but not
    # on an image's PATH (GKE docs, "Run GPUs in GKE Standard node pools": CUDA libraries and tools)
    exe = shutil.which("nvidia-smi") or shutil.which("nvidia-smi", path=NVIDIA_BIN)
    if exe is None:
        return None, f"nvidia-smi not found on PATH or in {NVIDIA_BIN} (no NVIDIA driver?)"
    try:
        cp = subprocess.run([exe, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi did not answer within 60 s"
    if cp.returncode != 0:
        last = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or [f"exit code {cp.returncode}"]
        return None, f"nvidia-smi failed: {last[0][:200]}"
    rows: list[NvidiaGpu] = []
    for line in cp.stdout.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[0].isdigit():
            rows.append({"index": int(parts[0]), "uuid": parts[1], "name": parts[2]})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return rows, None
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    return [r for r in rows if str(r["index"]) in wanted or r["uuid"] in wanted
            or any(w.startswith("GPU-") and r["uuid"].startswith(w) for w in wanted)], None


def nvidia_smi_memory() -> dict[int, int]:
    """Each GPU's memory.total in MiB by index (nvidia-smi's own query), {} when it cannot say."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        cp = subprocess.run([exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {}
    out: dict[int, int] = {}
    for line in cp.stdout.splitlines() if cp.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = int(parts[1])
    return out


def matmul(device: int, n: int = 4096) -> dict:
    """A fp32 matmul on one GPU, timed; checked: finite, and diag(a @ a.T) == row sums of a * a."""
    import torch as t

    dev = t.device("cuda", device)
    t.backends.cuda.matmul.allow_tf32 = False
    g = t.Generator(device=dev).manual_seed(1234 + device)
    a = t.randn(n, n, device=dev, generator=g)
    c = a @ a.T
    t.cuda.synchronize(dev)
    start = time.perf_counter()
    for _ in range(ITERS):
        c = a @ a.T
    t.cuda.synchronize(dev)
    seconds = (time.perf_counter() - start) / ITERS
    want = (a * a).sum(dim=1)
    err = ((c.diagonal() - want).abs() / want.abs().clamp_min(1e-6)).max().item()
    ok = bool(t.isfinite(c).all().item()) and err < 1e-3
    return {"gpu": device, "name": t.cuda.get_device_name(dev), "tflops": round(2 * n ** 3 / seconds / 1e12, 2), "ok": ok,
            "rel_error": err}


def dcgm() -> tuple[str, str | None]:
    """('absent' | 'pass' | 'fail', problem or None): DCGM's quick (level 1) diagnostic."""
    exe = shutil.which("dcgmi")
    if exe is None:
        return "absent", None
    try:
        cp = subprocess.run([exe, "diag", "-r", "1"], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "fail", "DCGM's quick diagnostic (dcgmi diag -r 1) did not finish within 300 s"
    if cp.returncode == 0:
        return "pass", None
    lines = [ln.strip() for ln in (cp.stdout + cp.stderr).splitlines() if "fail" in ln.lower() or "error" in ln.lower()]
    return "fail", (f"DCGM's quick diagnostic (dcgmi diag -r 1) failed (exit {cp.returncode})"
                    + (f": {'; '.join(lines[:3])[:300]}" if lines else ""))


def free_gb(path: str) -> float:
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    return shutil.disk_usage(path or "/").free / 1e9


def own_checks(args: argparse.Namespace) -> tuple[dict, ModuleType | None]:
    """The node record, and torch (None when it cannot be imported)."""
    problems: list[str] = []
    rec: dict = {"rank": args.rank, "gpus_promised": args.gpus}
    torch: ModuleType | None
    try:
        torch = importlib.import_module("torch")
    except Exception as exc:  # noqa: BLE001 - whatever breaks the import is the finding
        problems.append(f"torch cannot be imported: {type(exc).__name__}: {exc}"[:300])
        torch = None
    if args.gpus > 0:
        rows, why = nvidia_smi_gpus()
        if rows is None:
            problems.append(why or "nvidia-smi failed")
        else:
            rec["gpu_names"] = [r["name"] for r in rows]
            memory = nvidia_smi_memory()  # the health check compares it with the promised model's
            if memory:
                rec["gpu_memory_mib"] = [memory.get(r["index"]) for r in rows]
            rec["gpus_visible"] = len(rows)
            if len(rows) < args.gpus:
                problems.append(f"{len(rows)} of {args.gpus} promised GPU(s) visible to nvidia-smi")
        if torch is not None:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            rec["cuda_devices"] = count
            if count < args.gpus:
                problems.append(f"{count} of {args.gpus} promised GPU(s) usable by CUDA (torch.cuda.device_count())")
            rec["matmul"] = []
            for i in range(min(count, args.gpus)):
                try:
                    got = matmul(i)
                except Exception as exc:  # noqa: BLE001 - a GPU that cannot multiply is the finding
                    got = {"gpu": i, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                rec["matmul"].append(got)
                if not got.get("ok"):
                    problems.append(f"GPU {i}: the test matmul failed ({got.get('error') or 'wrong result'})"
                                    + no_kernel_hint(str(got.get("error") or ""), torch, i))
        rec["dcgm"], why = dcgm()
        if why:
            problems.append(why)
    try:
        rec["disk_free_gb"] = round(free_gb(args.disk), 2)
        if rec["disk_free_gb"] < args.min_free_gb:
            problems.append(f"{rec['disk_free_gb']:g} GB free at {args.disk}, at least {args.min_free_gb:g} GB needed")
    except OSError as exc:
        problems.append(f"the free space at {args.disk} cannot be read: {exc}")
    rec["problems"] = problems
    return rec, torch


def schedule(world: int) -> list[dict[int, int]]:
    """Round-robin rounds (the circle method): in each, every node meets at most one other."""
    players: list[int | None] = list(range(world)) + ([None] if world % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        meet: dict[int, int] = {}
        for i in range(len(players) // 2):
            a, b = players[i], players[-1 - i]
            if a is not None and b is not None:
                meet[a], meet[b] = b, a
        rounds.append(meet)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


class Group:
    """One process per node: gloo bound to --addr, or NCCL on this node's first GPU."""

    def __init__(self, torch: ModuleType, store: Store, args: argparse.Namespace, use_cuda: bool):
        import torch as t
        import torch.distributed as dist

        self.t, self.dist = t, dist
        timeout = datetime.timedelta(seconds=args.timeout)
        self.device = t.device("cuda", 0) if use_cuda else t.device("cpu")
        self.backend = "nccl" if use_cuda else "gloo"
        if use_cuda:
            t.cuda.set_device(0)
            dist.init_process_group("nccl", store=dist.PrefixStore("nccl", store), rank=args.rank,
                                    world_size=args.world, timeout=timeout, device_id=self.device)
            self.pg: Any = None
        else:
            from torch.distributed import ProcessGroupGloo

            # Any: torch's stub of ProcessGroupGloo lacks what the runtime has and this uses: _Options,
            # the constructor that takes them, allreduce/send/recv
            gloo: Any = ProcessGroupGloo
            opts = gloo._Options()
            opts._devices = [gloo.create_device(hostname=args.addr)]
            opts._timeout = timeout
            self.pg = gloo(dist.PrefixStore("gloo", store), args.rank, args.world, opts)

    def tensor(self, mib: int) -> Tensor:
        return self.t.ones(mib * (1 << 20) // 4, dtype=self.t.float32, device=self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.t.cuda.synchronize(self.device)

    def allreduce(self, x: Tensor) -> None:
        if self.pg is not None:
            self.pg.allreduce([x]).wait()
        else:
            self.dist.all_reduce(x)

    def send(self, x: Tensor, peer: int, tag: int) -> None:
        if self.pg is not None:
            self.pg.send([x], peer, tag).wait()
        else:
            self.dist.send(x, peer)

    def recv(self, x: Tensor, peer: int, tag: int) -> None:
        if self.pg is not None:
            self.pg.recv([x], peer, tag).wait()
        else:
            self.dist.recv(x, peer)

    def close(self) -> None:
        if self.pg is None:
            self.dist.destroy_process_group()


def links(torch: ModuleType, store: Store, args: argparse.Namespace, use_cuda: bool) -> dict:
    """The all-reduce and every pair this node is part of."""
    group = Group(torch, store, args, use_cuda)
    n = args.world
    mib = args.allreduce_mib or (64 if use_cuda else 4)
    x = group.tensor(mib)
    group.allreduce(x)
    group.sync()
    start = time.perf_counter()
    for _ in range(ITERS):
        group.allreduce(x)
    group.sync()
    seconds = (time.perf_counter() - start) / ITERS
    algbw = mib * (1 << 20) * 8 / seconds / 1e9
    out: dict = {"backend": group.backend,
                 "allreduce": {"bytes": mib << 20, "seconds": round(seconds, 6), "algbw_gbps": round(algbw, 3),
                               "busbw_gbps": round(algbw * 2 * (n - 1) / n, 3)}, "pairs": []}
    y = group.tensor(args.pair_mib or (64 if use_cuda else 1))
    for rnd, meet in enumerate(schedule(n)):
        peer = meet.get(args.rank)
        if peer is None:
            continue
        first = args.rank < peer

        def exchange(tag: int) -> None:
            if first:
                group.send(y, peer, tag)
                group.recv(y, peer, tag + 1)
            else:
                group.recv(y, peer, tag)
                group.send(y, peer, tag + 1)

        exchange(1000 * rnd)  # warm-up: both ends are in this round from here on
        times = []
        for i in range(ITERS):
            group.sync()
            start = time.perf_counter()
            exchange(1000 * rnd + 2 * (i + 1))
            group.sync()
            times.append(time.perf_counter() - start)
        # the fastest exchange: what the link gives when nothing else on the node is in the way
        gbps = 2 * y.numel() * 4 * 8 / min(times) / 1e9
        out["pairs"].append({"peer": peer, "gbps": round(gbps, 3), "seconds": round(sum(times), 6)})
    group.close()
    return out


def stop_others() -> int:
    """`node_check.py --stop`: SIGKILL every other process on this machine (a pod's container) whose
    command line holds this program's path: the check of a run that is being stopped. Closing the
    exec stream a check runs in need not end it in a real container."""
    me, path = str(os.getpid()), os.path.abspath(__file__).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or d == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if path in cmd:
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass
    return 0


def network_stack() -> str | None:
    """This node's kernel and network namespace, as "BOOT_ID net:[INODE]" (None where /proc does not
    say): two nodes that report the same one share one network stack, so the "link" between them is
    loopback, whose speed is that of the CPUs the two share, not of a network. Processes on one machine
    (local, or ssh hosts that are one machine) share one; containers and network namespaces each have
    their own (their traffic crosses a veth pair, which traffic control can slow like a cable)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.readlink("/proc/self/ns/net")
    except OSError:
        return None
    return f"{boot} {net}" if boot and net else None


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:]) == ["--stop"]:
        return stop_others()
    p = argparse.ArgumentParser(description="gpucluster's health check of one node")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="HOST:PORT of the TCP store node 0 hosts")
    p.add_argument("--addr", required=True, help="the address this node's process group binds")
    p.add_argument("--gpus", type=int, default=0, help="GPUs the node's shape promises")
    p.add_argument("--disk", default=".")
    p.add_argument("--min-free-gb", type=float, default=2.0)
    p.add_argument("--pair-mib", type=int, default=0)
    p.add_argument("--allreduce-mib", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    say("hello", rank=args.rank, time=time.time(), host=socket.gethostname(), pid=os.getpid(), stack=network_stack())
    rec, torch = own_checks(args)
    say("node", **rec)
    ok = not rec["problems"]
    result: dict = {"rank": args.rank, "problems": []}
    if torch is not None and args.world > 1:
        result.update(collective(torch, args, ok, bool(args.gpus) and rec.get("cuda_devices", 0) > 0))
    say("links", **result)
    say("done", rank=args.rank, ok=ok and not result["problems"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def collective(torch: ModuleType, args: argparse.Namespace, ok: bool, use_cuda: bool) -> dict:
    """Through node 0's store: every node's own verdict, then (all ok) the process group's tests."""
    from torch.distributed import TCPStore

    host, _, port = args.store.rpartition(":")
    timeout = datetime.timedelta(seconds=args.timeout)
    try:
        store = TCPStore(host, int(port), args.world, args.rank == 0, timeout=timeout, wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - the store cannot be reached: that is the finding
        return {"problems": [f"could not reach node 0's check store at {args.store} within {args.timeout:g} s "
                             f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})"],
                "unreached": "store"}
    try:
        return _verdicts_then_links(torch, store, args, ok, use_cuda, timeout)
    finally:  # the store lives in node 0's process: it leaves only once every node is done with it
        try:
            if args.rank == 0:
                store.wait([f"bye/{r}" for r in range(1, args.world)], timeout)
            else:
                store.set(f"bye/{args.rank}", "1")
        except Exception:  # noqa: BLE001 - a node that is gone says so in its own record (or its absence)
            pass


def _verdicts_then_links(torch: ModuleType, store: Store, args: argparse.Namespace, ok: bool, use_cuda: bool,
                         timeout: datetime.timedelta) -> dict:
    store.set(f"own/{args.rank}", "ok" if ok else "bad")
    keys = [f"own/{r}" for r in range(args.world)]
    try:
        store.wait(keys, timeout)
    except Exception:  # noqa: BLE001 - who is missing is asked below
        try:
            missing = [r for r in range(args.world) if not store.check([f"own/{r}"])]
        except Exception:  # noqa: BLE001 - the store itself is gone (node 0 went away)
            return {"problems": [f"node 0's check store at {args.store} went away"]}
        return {"problems": [f"node(s) {', '.join(map(str, missing))} did not report their own checks within "
                             f"{args.timeout:g} s"], "silent": missing}
    bad = [r for r in range(args.world) if store.get(f"own/{r}") != b"ok"]
    if bad:
        return {"skipped": f"node(s) {', '.join(map(str, bad))} failed their own checks", "bad": bad}
    try:
        return links(torch, store, args, use_cuda)
    except Exception as exc:  # noqa: BLE001 - a collective that breaks is the finding
        return {"problems": [f"the {'NCCL' if use_cuda else 'gloo'} test failed: {type(exc).__name__}: "
                             f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"]}


if __name__ == "__main__":
    sys.exit(main())
