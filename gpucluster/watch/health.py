"""The `check` phase: every node's health, judged before anything is staged or started.

A launcher starts `gpucluster/node/node_check.py` on every node at once (its own way: a local process,
an ssh session, a pod exec) and hands the processes to `run()`, which reads what they print (each
line timestamped on arrival, and written to the node's log), stops them all at the deadline or
when done (the launcher's `stop`), judges, records and, when a node is bad, raises
`HealthCheckFailed` naming each bad node and why.

What is judged (`judge`, a pure function of what the nodes said):
- a node whose program ended without its final record: lost (the launcher's `lost_why` says why:
  killed, unreachable) or broken (its last lines);
- a node's own problems (GPUs fewer than promised or unusable, DCGM, disk), a GPU whose test
  matmul runs under MATMUL_FLOOR of its model's fp32 peak (FP32_PEAK_TFLOPS), and GPUs other than
  the ones the shape promises (`wrong_gpus`: nvidia-smi's name and memory.total against the expected
  model and its memory, within GPU_MEMORY_TOLERANCE);
- its clock, more than CLOCK_SKEW_S from this machine's when its first line arrived;
- the links, only when every node passed its own checks: a pair slower than LINK_FLOOR of the
  shape's expectation, or (three nodes or more) than RELATIVE_FLOOR of the fastest pair; a node
  in every slow pair is the slow node, else the slow pairs are named. A pair of nodes on one network
  stack (one kernel, one network namespace: the `stack` of their hello records, node_check.py's
  `network_stack`) is loopback, not a link: it is measured and recorded (`loopback`), never judged,
  nor taken as the fastest pair (its speed is the shared CPUs' load: 1.5 against 44 Gbit/s between
  four local nodes under `make test`). A node that could not reach
  node 0's store names itself, unless no node could (then node 0 is named).

Records (the run's metrics): `node_check` per node, `link` per pair, `allreduce`, `check`; each
bad node also gets a `node_lost` record (gpucluster/watch/nodeloss.py), which the recovery loop reads.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

from gpucluster.errors import LaunchError
from gpucluster.events import RunEvents
from gpucluster.states import JsonMapping, JsonObject
from gpucluster.watch.procs import piped

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import Launcher

PREFIX = "@gpucluster-check "
PROGRAM = Path(__file__).parents[1] / "node" / "node_check.py"  # gpucluster/node/: shipped as it is
CLOCK_SKEW_S = 30.0  # more than this off this machine's clock is not sane (TLS, S3 signatures, logs)
LINK_FLOOR = 0.1  # a pair under a tenth of the shape's expected bandwidth is slow
RELATIVE_FLOOR = 0.125  # ... or, with 3+ nodes, under an eighth of the fastest pair
MIN_FREE_GB = 2.0
MATMUL_FLOOR = 0.25  # a GPU whose fp32 test matmul runs under a quarter of its model's fp32 peak is slow

# FP32 (non-tensor-core) dense peaks in TFLOP/s, from NVIDIA's data sheets, by the name nvidia-smi
# gives; more specific names first ("H100 PCIe" before "H100", "L40S" before "L4"). The check's
# 4096^3 fp32 matmul (TF32 off) reaches 50-80 % of these on a healthy GPU; a GPU stuck at low clocks
# (HW slowdown, a power cap) or on a broken link to its memory falls far under. Unknown names are
# not judged.
FP32_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH200 NVL\b", 60.0), (r"\bH200\b", 67.0),  # H200 data sheet (SXM / NVL)
    (r"\bH100 PCIe\b", 51.0), (r"\bH100 NVL\b", 60.0), (r"\bH100\b", 67.0),  # H100 data sheet
    (r"\bA100\b", 19.5),  # A100 data sheet
    (r"\bL40S\b", 91.6), (r"\bL4\b", 30.3),  # L40S, L4 data sheets
    (r"\bA10G\b", 31.2), (r"\bA10\b", 31.2),  # A10 data sheet (AWS's A10G: the same GA102 part)
    (r"\bV100\b", 14.0),  # V100 PCIe (SXM2: 15.7)
    (r"\bT4\b", 8.1),  # T4 data sheet
)


# nvidia-smi's memory.total runs a little under or over the catalog's figure (L4: 23034 MiB against
# 22888; H100: 81559 against 81920): a GPU within this fraction of the expected memory has it.
GPU_MEMORY_TOLERANCE = 0.06


def wrong_gpus(own: JsonMapping, spec: "HealthSpec") -> list[str]:
    """A node's GPUs that are not the model the shape promises (`spec.gpu`, gpucluster.catalog.gpus):
    nvidia-smi's name must carry the model's name and its memory.total (when reported) be the model's,
    so an A100 40 GB is not taken for the 80 GB one. Nothing is judged without an expected model; a MIG
    slice is a share of a GPU: not judged."""
    import re

    from gpucluster.catalog.gpus import GPUS

    model = GPUS.get(spec.gpu or "")
    if model is None:
        return []
    names = [str(n) for n in own.get("gpu_names") or []]
    mems = list(own.get("gpu_memory_mib") or [])
    token = re.compile(r"\b" + re.escape(model.name.split("-")[0]) + r"\b")
    expected = f"{spec.gpus} × {model.name} ({model.memory_mib} MiB each)" if spec.gpus else model.name
    out = []
    for i, name in enumerate(names[:spec.gpus] if spec.gpus else names):
        if "MIG" in name.split():
            continue
        mem = mems[i] if i < len(mems) and isinstance(mems[i], (int, float)) else None
        same_memory = mem is None or abs(mem - model.memory_mib) <= GPU_MEMORY_TOLERANCE * model.memory_mib
        if not token.search(name) or not same_memory:
            found = f"{name}" + (f" with {mem:g} MiB" if mem is not None else "")
            out.append(f"GPU {i} is {found}, not the GPU this shape promises: expected {expected}")
    return out


def fp32_peak(name: str) -> float | None:
    """The FP32 peak (TFLOP/s) of the GPU model nvidia-smi calls `name`, or None when unknown."""
    import re

    return next((peak for pattern, peak in FP32_PEAK_TFLOPS if re.search(pattern, name)), None)


def slow_gpus(own: JsonMapping) -> list[str]:
    """A node's GPUs whose test matmul ran under MATMUL_FLOOR of their model's fp32 peak. The name
    is the CUDA device's own (the one the matmul ran on; nvidia-smi's list, by index, from an older
    node program). A MIG slice ("... MIG 1g.10gb") has a share of the GPU's units: not judged."""
    names = [str(n) for n in own.get("gpu_names") or []]
    out = []
    for m in own.get("matmul") or []:
        if not isinstance(m, Mapping) or not m.get("ok") or not isinstance(m.get("tflops"), (int, float)):
            continue
        i = int(m.get("gpu", 0))
        name = str(m.get("name") or (names[i] if i < len(names) else (names[0] if names else "")))
        peak = None if "MIG" in name.split() else fp32_peak(name)
        if peak and m["tflops"] < MATMUL_FLOOR * peak:
            out.append(f"GPU {i} ({name}) is slow: its fp32 test matmul ran at {m['tflops']:g} TFLOP/s, under "
                       f"{MATMUL_FLOOR:.0%} of the model's {peak:g} (clocks held low, a power cap, or a fault?)")
    return out


class NodeProgram(Protocol):
    """What is read of a node's check program: a `subprocess.Popen` with its stdout piped, or the
    Kubernetes launcher's view of an exec stream (infra/kubernetes/check.py)."""

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...


class HealthCheckFailed(LaunchError):
    """One or more nodes failed the health check (each named, with why); nothing was started."""

    def __init__(self, message: str, bad: Mapping[int, Sequence[str]]):
        super().__init__(message)
        self.bad = {int(k): list(v) for k, v in bad.items()}


@dataclass(frozen=True)
class HealthSpec:
    """What the check expects of every node: the GPUs the shape promises, the link bandwidth it
    should give one flow between two nodes (None: unknown, not judged), the free disk needed."""

    gpus: int = 0
    link_gbps: float | None = None
    gpu: str | None = None  # the GPU model every node should show (gpucluster.catalog.gpus name); None: not judged
    min_free_gb: float = MIN_FREE_GB
    timeout_s: float = 60.0
    pair_mib: int = 0  # 0: the program's default (1 MiB on gloo, 64 on NCCL)
    allreduce_mib: int = 0


def spec_for(spec: ClusterSpec, backend: Plugin, check: bool | None, launcher: Launcher | None = None) -> HealthSpec | None:
    """The run's health check (None: skipped): on when asked (--check), off when refused
    (--no-check), else on for backends that make their machines (aws, gcp) where the launcher can
    run it (`Launcher.checks_nodes`; --check is refused where it cannot: UsageError, exit 2); it
    expects the GPUs the shape promises and the per-flow link bandwidth the backend states."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.contract import Capability

    able = launcher is None or launcher.checks_nodes
    if check and not able:
        raise UsageError(f"--check is not supported yet with --cloud {spec.cloud}: its launcher cannot run the "
                         "health check on the nodes (use --no-check, or leave it out)")
    on = check if check is not None else (backend.can(Capability.PROVISIONS) and able)
    if not on:
        return None
    return HealthSpec(gpus=int(spec.gpus_per_node or 0), link_gbps=backend.spec.link_gbps(spec),
                      gpu=expected_gpu(spec, backend))


def expected_gpu(spec: ClusterSpec, backend: Plugin) -> str | None:
    """The GPU model the spec's nodes carry: its accelerator (any spelling), else the one the backend's
    shape of that machine type carries (`SpecRules.gpu_shapes`); None where neither says."""
    from gpucluster.catalog.gpus import lookup

    if not spec.gpus_per_node:
        return None
    named = lookup(spec.accelerator) if spec.accelerator else None
    if named is not None:
        return named.name
    shapes = [s for s in backend.spec.gpu_shapes() if s["machine"] == spec.instance_type]
    return str(shapes[0]["gpu"]) if shapes else None


def program_args(spec: HealthSpec, *, rank: int, world: int, store: str, addr: str, disk: str) -> list[str]:
    """node_check.py's arguments for one node (after the interpreter and the program's path)."""
    args = ["--rank", str(rank), "--world", str(world), "--store", store, "--addr", addr, "--gpus", str(spec.gpus),
            "--disk", disk, "--min-free-gb", f"{spec.min_free_gb:g}", "--timeout", f"{spec.timeout_s:g}"]
    if spec.pair_mib:
        args += ["--pair-mib", str(spec.pair_mib)]
    if spec.allreduce_mib:
        args += ["--allreduce-mib", str(spec.allreduce_mib)]
    return args


@dataclass
class NodeRun:
    """What one node's check program said: its records by kind, when its first line arrived,
    its exit status, its last other lines."""

    rank: int
    label: str
    records: dict[str, JsonObject] = field(default_factory=dict)
    hello_arrived: float | None = None
    rc: int | None = None
    lines: list[str] = field(default_factory=list)
    timed_out: bool = False
    stopped: bool = False  # still running when another node was lost: stopped, not judged


def _pump(proc: NodeProgram, node: NodeRun, log: Path | None) -> None:
    out = None
    try:
        out = open(log, "ab") if log is not None else None
    except OSError:
        out = None
    try:
        for raw in piped(proc.stdout):
            now = time.time()
            if out is not None:
                try:
                    out.write(raw)
                    out.flush()
                except OSError:
                    pass
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith(PREFIX):
                try:
                    rec = json.loads(line[len(PREFIX):])
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("kind"), str):
                    node.records[rec["kind"]] = rec
                    if rec["kind"] == "hello" and node.hello_arrived is None:
                        node.hello_arrived = now
            elif line.strip():
                node.lines = (node.lines + [line])[-20:]
    except (OSError, ValueError):
        pass
    finally:
        if out is not None:
            out.close()


def collect(procs: Mapping[int, NodeProgram], labels: Mapping[int, str], spec: HealthSpec,
            stop: Callable[[], None], log_dir: Path | None = None,
            lost_why: Callable[[int, int | None], str | None] | None = None) -> dict[int, NodeRun]:
    """Read every node's program until all have ended, one is lost (`lost_why` says so of its exit
    status: the others would only wait for it) or the deadline (the program's own timeout twice
    over, plus a margin for importing torch) passes; `stop()` always runs before returning."""
    nodes = {r: NodeRun(r, labels[r]) for r in procs}
    threads = []
    for r, proc in procs.items():
        log = None if log_dir is None else Path(log_dir) / f"node-{r}.log"
        t = threading.Thread(target=_pump, args=(proc, nodes[r], log), name=f"check-node-{r}", daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + 2 * spec.timeout_s + 60
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            if lost_why is not None and any(p.poll() is not None and "done" not in nodes[r].records
                                            and lost_why(r, p.poll()) for r, p in procs.items()):
                break
            time.sleep(0.1)
        for r, proc in procs.items():
            if proc.poll() is None:  # past the deadline, or another node was lost: stopped here
                nodes[r].timed_out = time.monotonic() >= deadline
                nodes[r].stopped = not nodes[r].timed_out
    finally:
        stop()
    for t in threads:
        t.join(timeout=5)
    for r, proc in procs.items():
        nodes[r].rc = proc.poll()
    return nodes


# what `judge` finds: problems by node rank, lost nodes' causes by rank, link records
Verdict = tuple[dict[int, list[str]], dict[int, str], list[JsonObject]]


def judge(nodes: Mapping[int, NodeRun], spec: HealthSpec,
          lost_why: Callable[[int, int | None], str | None] | None = None) -> Verdict:
    """(problems by node rank, lost nodes' causes by rank, link records). A pure function of what
    the nodes said; `lost_why(rank, exit status)`: the launcher's reason a node is gone, or None."""
    problems: dict[int, list[str]] = {}
    causes: dict[int, str] = {}
    for r, n in sorted(nodes.items()):
        if "done" not in n.records and n.stopped:
            continue  # what it would have said waited on a node that is gone
        found = _node_problems(r, n, spec, lost_why, causes)
        if found:
            problems[r] = found
    if problems:  # the links of a check that already failed are consequences, not findings
        return problems, causes, []
    unreached = [r for r, n in nodes.items() if (n.records.get("links") or {}).get("unreached")]
    if unreached and len(unreached) == len(nodes) - 1 and 0 not in unreached:
        return {0: ["no other node could reach the check's store on it (a firewall, or the wrong address?)"]}, {}, []
    for r, n in sorted(nodes.items()):
        for p in (n.records.get("links") or {}).get("problems") or []:
            problems.setdefault(r, []).append(str(p))
    if problems:
        return problems, causes, []
    return _links(nodes, spec)


def _node_problems(r: int, n: NodeRun, spec: HealthSpec, lost_why: Callable[[int, int | None], str | None] | None,
                   causes: dict[int, str]) -> list[str]:
    """One node's problems, in order: its program's end (when it did not finish), its own
    checks, its GPUs, its clock. A lost node's cause goes into `causes`."""
    problems = [] if "done" in n.records else [_unfinished(r, n, spec, lost_why, causes)]
    own = n.records.get("node")
    if own:
        problems.extend(str(p) for p in own.get("problems") or [])
        problems.extend(wrong_gpus(own, spec))
        problems.extend(slow_gpus(own))
    skew = _clock_skew(n)
    if skew is not None and abs(skew) > CLOCK_SKEW_S:
        problems.append(f"its clock is {skew:+.0f} s off this machine's "
                        f"(more than {CLOCK_SKEW_S:g} s: is NTP running?)")
    return problems


def _unfinished(r: int, n: NodeRun, spec: HealthSpec, lost_why: Callable[[int, int | None], str | None] | None,
                causes: dict[int, str]) -> str:
    """Why a node's program ended without its final record: lost, timed out, or broken."""
    from gpucluster.watch.nodeloss import cause_of

    why = lost_why(r, n.rc) if lost_why is not None and not n.timed_out else None
    if why:
        causes[r] = cause_of(why)  # killed, unreachable, or (a deleted pod) interruption
        return f"lost during the check: {why}"
    if n.timed_out:
        stage = "its own checks" if n.records.get("node") is None else "the link test"
        return f"the check did not finish ({stage}) within {2 * spec.timeout_s + 60:g} s"
    last = " | ".join(ln.strip()[:200] for ln in n.lines[-3:])
    return f"the check program ended with exit code {n.rc} before reporting" + (f": {last}" if last else "")


def _clock_skew(n: NodeRun) -> float | None:
    """How far the node's clock is off this machine's when its first line arrived (kept as its
    `clock` record); None when it did not say."""
    hello = n.records.get("hello")
    if not (hello and n.hello_arrived is not None and isinstance(hello.get("time"), (int, float))):
        return None
    skew = float(hello["time"]) - n.hello_arrived
    n.records.setdefault("clock", {"skew_s": round(skew, 3)})
    return skew


def _links(nodes: Mapping[int, NodeRun], spec: HealthSpec) -> Verdict:
    pairs = _pairs(nodes)
    loopback = {k for k in pairs if _one_stack(nodes, *k)}
    floor = _floors(spec, len(nodes), max((g for k, g in pairs.items() if k not in loopback), default=0.0))
    records: list[JsonObject] = []
    slow: dict[tuple[int, int], str] = {}
    for (a, b), gbps in sorted(pairs.items()):
        why = None if (a, b) in loopback else next((w for limit, w in floor if gbps < limit), None)
        if why:
            slow[(a, b)] = why
        record: JsonObject = {"kind": "link", "a": a, "b": b, "gbps": round(gbps, 3), "expected_gbps": spec.link_gbps,
                              "slow": why is not None}
        if (a, b) in loopback:
            record["loopback"] = True
        records.append(record)
    if not slow:
        return {}, {}, records
    return _slow_links(sorted(nodes), pairs, slow), {}, records


def _one_stack(nodes: Mapping[int, NodeRun], a: int, b: int) -> bool:
    """Whether nodes a and b said they share one network stack (their hello records' `stack`)."""
    if a not in nodes or b not in nodes:
        return False
    mine = (nodes[a].records.get("hello") or {}).get("stack")
    return isinstance(mine, str) and bool(mine) and mine == (nodes[b].records.get("hello") or {}).get("stack")


def _pairs(nodes: Mapping[int, NodeRun]) -> dict[tuple[int, int], float]:
    """Each pair's bandwidth in Gbit/s: the most the link gave at least once, either way."""
    pairs: dict[tuple[int, int], float] = {}
    for r, n in nodes.items():
        for p in (n.records.get("links") or {}).get("pairs") or []:
            key = (min(r, int(p["peer"])), max(r, int(p["peer"])))
            pairs[key] = max(pairs.get(key, 0.0), float(p["gbps"]))  # what the link gave at least once
    return pairs


def _floors(spec: HealthSpec, nodes: int, fastest: float) -> list[tuple[float, str]]:
    """The bandwidths under which a pair is slow, each with why."""
    floor = []
    if spec.link_gbps:
        floor.append((LINK_FLOOR * spec.link_gbps, f"under {LINK_FLOOR:.0%} of the {spec.link_gbps:g} Gbit/s this shape "
                                                   "should give one flow"))
    if nodes >= 3 and fastest > 0:
        floor.append((RELATIVE_FLOOR * fastest, f"under 1/{1 / RELATIVE_FLOOR:g} of the fastest pair ({fastest:.2f} Gbit/s)"))
    return floor


def _slow_links(everyone: list[int], pairs: Mapping[tuple[int, int], float],
                slow: Mapping[tuple[int, int], str]) -> dict[int, list[str]]:
    """A node in every slow pair is the slow node (unless all are); else the slow pairs are named."""
    problems: dict[int, list[str]] = {}
    culprits = [r for r in everyone if all(((min(r, o), max(r, o)) in slow) for o in everyone if o != r)]
    if culprits and len(culprits) < len(everyone):
        for r in culprits:
            worst = max((pairs[k] for k in slow if r in k), default=0.0)
            problems[r] = [f"slow link: every pair with this node is slow (at best {worst:.3g} Gbit/s, "
                           f"{slow[next(k for k in slow if r in k)]})"]
    else:
        for (a, b), why in sorted(slow.items()):
            problems.setdefault(a, []).append(f"slow link to node {b}: {pairs[(a, b)]:.3g} Gbit/s, {why}")
    return problems


def run(procs: Mapping[int, NodeProgram], labels: Mapping[int, str], spec: HealthSpec, events: RunEvents,
        stop: Callable[[], None], *, log_dir: Path | None = None,
        lost_why: Callable[[int, int | None], str | None] | None = None, phase: str = "check") -> JsonObject:
    """Read, judge, record; the `check` record, or HealthCheckFailed naming each bad node."""
    from gpucluster.watch.nodeloss import lost_record

    start = time.monotonic()
    nodes = collect(procs, labels, spec, stop, log_dir, lost_why)
    problems, causes, links = judge(nodes, spec, lost_why)
    seconds = round(time.monotonic() - start, 3)
    for r, n in sorted(nodes.items()):
        own = n.records.get("node") or {}
        rec: JsonObject = {"kind": "node_check", "ok": r not in problems, "problems": problems.get(r, [])}
        for key in ("gpus_promised", "gpus_visible", "cuda_devices", "gpu_names", "dcgm", "disk_free_gb"):
            if key in own:
                rec[key] = own[key]
        if own.get("matmul"):
            rec["matmul_tflops"] = [m.get("tflops") for m in own["matmul"]]
        if "clock" in n.records:
            rec["clock_skew_s"] = n.records["clock"]["skew_s"]
        events.on_metric(r, rec)
    for rec in links:
        events.on_metric(rec["a"], rec)
    head = (nodes[min(nodes)].records.get("links") or {}) if nodes else {}
    if head.get("allreduce"):
        events.on_metric(0, {"kind": "allreduce", "backend": head.get("backend"), "world": len(nodes),
                             **head["allreduce"]})
    summary = {"kind": "check", "ok": not problems, "seconds": seconds, "nodes": len(nodes),
               "failed": {str(r): p for r, p in sorted(problems.items())}}
    events.on_metric(0, summary)
    if problems:
        for r, why in sorted(problems.items()):
            events.on_metric(r, lost_record(r, labels[r], causes.get(r, "health"), "; ".join(why), phase))
        text = "; ".join(f"node {r} ({labels[r]}): {', '.join(p)}" for r, p in sorted(problems.items()))
        raise HealthCheckFailed(f"health check failed: {text}", problems)
    slowest = min(links, key=lambda x: x["gbps"], default=None)
    bus = head.get("allreduce", {}).get("busbw_gbps")
    events.message(f"health check: {len(nodes)} node(s) ok in {seconds:.1f} s"
                   + (f"; all-reduce bus bandwidth {bus:.2f} Gbit/s ({head.get('backend')})" if bus else "")
                   + (f"; slowest pair {slowest['a']}-{slowest['b']} {slowest['gbps']:.2f} Gbit/s" if slowest else ""))
    return summary
