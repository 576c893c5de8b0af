"""What a node prints, made fit to keep and to show: lines cut at `LINE_CAP` (the node log keeps
them whole), the last lines of a node bounded by `TAIL_BYTES`, metric records picked out of a read,
the rate-limited console feed, and the root cause of a failed torchrun (the worker's own lines, the
failing rank and exit code). Used by `gpucluster.watch.supervisor.NodeSupervisor`."""

from __future__ import annotations

import collections
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from gpucluster.events import RunEvents

TAIL_LINES = 80
TAIL_BYTES = 64 * 1024  # the most of a node's last lines kept (and stored in the ledger)
LINE_CAP = 4096  # bytes of one line kept for the tail and the console; the log file keeps it whole
_LONG = LINE_CAP + 96  # longer than this gets cut (a line already cut and marked is not)
CONSOLE_BACKLOG = 1000  # lines waiting for the console; beyond that lines are counted, not queued
CONSOLE_RATE = 2000.0  # lines a second the console shows at most (the rest: a summary line)
READ_SIZE = 1 << 16
LOG_HOLD = 16 << 20  # bytes of an unfinished line held back so the node log gets it whole
_PIPE_SIZE = 1 << 20
METRIC_PREFIX = b"@gpucluster-metric "


# -- lines -------------------------------------------------------
def cut_line(line: bytes, total: int | None = None) -> bytes:
    """A line of at most LINE_CAP bytes (+ a marker saying it was cut and how long it was)."""
    total = len(line) if total is None else total
    if total <= _LONG:
        return line
    return line[:LINE_CAP] + f" ... [line cut: {total} bytes in all, whole in the node log]".encode()


def cap_last_lines(lines: Sequence[str], limit: int = TAIL_BYTES) -> list[str]:
    """The last of `lines` that fit in `limit` bytes (UTF-8, one newline each); a line longer
    than LINE_CAP is cut and marked. What the ledger stores per node."""
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        raw = line.encode("utf-8", "replace")
        if len(raw) > _LONG:
            raw = cut_line(raw)
            line = raw.decode("utf-8", "replace")
        size += len(raw) + 1
        if size > limit:
            break
        out.append(line)
    out.reverse()
    return out


def grow_pipe(stream: Any) -> None:
    """A 1 MiB pipe (Linux) between a node's process and us, so that a moment in which our
    reader thread is not scheduled does not stall the training's writes. Best effort."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)
    except (OSError, ValueError, AttributeError, ImportError):
        pass


class LineSplitter:
    """Bytes chunks -> runs of complete lines, holding at most LINE_CAP bytes of an unfinished
    line. Works per chunk, not per line: a run is one bytes object, lines joined by b"\\n"."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.length = 0  # the unfinished line's full length so far

    def _hold(self, data: bytes) -> None:
        room = LINE_CAP - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.length += len(data)

    def _finish(self, data: bytes) -> bytes:
        self._hold(data)
        line = cut_line(bytes(self.head), self.length)
        self.head = bytearray()
        self.length = 0
        return line

    def feed(self, chunk: bytes) -> tuple[bytes | None, bool]:
        """(the complete lines this chunk ends, or None; whether the first began earlier)."""
        last = chunk.rfind(b"\n")
        if last < 0:
            self._hold(chunk)
            return None, False
        carried = self.length > 0
        if carried:
            first = chunk.find(b"\n")
            run = self._finish(chunk[:first])
            if first < last:
                run += b"\n" + chunk[first + 1:last]
        else:
            run = chunk[:last]
        if last + 1 < len(chunk):
            self._hold(chunk[last + 1:])
        return run, carried

    def close(self) -> bytes | None:
        return self._finish(b"") if self.length else None


def count_lines(run: bytes) -> int:
    return run.count(b"\n") + 1


def metric_lines(run: bytes) -> list[bytes]:
    """The lines of a run that carry a metric record (found without splitting the whole run)."""
    found = []
    i = run.find(METRIC_PREFIX)
    while i >= 0:
        start = run.rfind(b"\n", 0, i) + 1
        end = run.find(b"\n", i)
        end = len(run) if end < 0 else end
        found.append(run[start:end])
        i = run.find(METRIC_PREFIX, end)
    return found


class ConsoleFeed:
    """Lines on their way to `events.on_line`, delivered by a thread of their own.

    The console must never slow the training: producers never wait for it, and it shows at most
    `rate` lines a second (a person reads far fewer; more would only burn a CPU core that the
    training needs). While it is behind by more than `backlog` lines, further lines are only
    counted, and "... N lines not shown; full log: <node log>" is shown where they were left
    out. The node log files get every line regardless (they are written before anything is
    offered here).
    """

    def __init__(self, events: RunEvents, log_dir: Path, backlog: int = CONSOLE_BACKLOG,
                 rate: float = CONSOLE_RATE):
        self.events = events
        self.log_dir = log_dir
        self.backlog = backlog
        self.rate = rate
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[int, bytes | int, int]] = collections.deque()
        self._queued = 0
        self._hidden: dict[int, int] = {}
        self.hidden_total = 0
        self.shown_total = 0
        self._closed = False
        self._cutoff: float | None = None
        self._thread = threading.Thread(target=self._run, name="console-feed", daemon=True)
        self._started = False

    def _start(self) -> None:  # caller holds the lock
        if not self._started and not self._closed:
            self._started = True
            self._thread.start()

    def offer(self, node_rank: int, run: bytes, nlines: int) -> None:
        with self._cond:
            if self._closed:  # the run is over: the log file has the lines, the console is done
                return
            room = self.backlog - self._queued
            taken = nlines if nlines <= room else max(room, 0)
            self._start()
            if taken:
                if taken < nlines:
                    run = b"\n".join(run.split(b"\n", taken)[:taken])
                gap = self._hidden.pop(node_rank, 0)
                if gap:  # the summary goes where the lines were left out
                    self._items.append((node_rank, gap, 0))
                self._items.append((node_rank, run, taken))
                self._queued += taken
                self._cond.notify()
            self._hide(node_rank, nlines - taken)

    def _summaries(self) -> None:  # caller holds the lock
        for rank, n in sorted(self._hidden.items()):
            self._items.append((rank, n, 0))
        self._hidden.clear()

    def _hide(self, rank: int, n: int) -> None:  # caller holds the lock
        if n > 0:
            self._hidden[rank] = self._hidden.get(rank, 0) + n
            self.hidden_total += n

    def _late(self) -> bool:
        return self._cutoff is not None and time.monotonic() > self._cutoff

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            with self._cond:
                while not self._items and not self._hidden and not self._closed:
                    self._cond.wait(0.5)
                if not self._items:
                    if self._hidden:  # caught up: say what was left out
                        self._summaries()
                    else:
                        return  # closed and nothing left
                rank, payload, n = self._items.popleft()
                if not isinstance(payload, int) and self._late():  # out of time: count, don't show
                    self._queued -= n
                    self._hide(rank, n)
                    continue
            shown = 0
            try:
                if isinstance(payload, int):
                    self.events.on_line(rank, f"... {payload} lines not shown; full log: "
                                              f"{self.log_dir / f'node-{rank}.log'}")
                    continue
                for line in payload.split(b"\n"):
                    if shown and self._late():
                        break
                    if len(line) > _LONG:
                        line = cut_line(line)
                    self.events.on_line(rank, line.decode("utf-8", "replace").rstrip("\r"))
                    shown += 1
            except Exception:  # noqa: BLE001 - a broken console must not stop the run
                pass
            finally:
                if not isinstance(payload, int):
                    with self._cond:
                        self._queued -= n
                        self.shown_total += shown
                        self._hide(rank, n - shown)
            # Pace: at most `rate` lines a second on average, so the backlog fills (and lines are
            # summarised) instead of this thread taking a core from the training.
            if not self._closed:
                ahead = self.shown_total / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(min(ahead, 1.0))

    def close(self, timeout: float = 2.0) -> None:
        """Show what is queued for at most `timeout` seconds more, count the rest, show the
        summaries, and let the thread end (not waiting on a console that is stuck for good)."""
        with self._cond:
            self._closed = True
            if not self._started:
                return
            self._cutoff = time.monotonic() + timeout
            self._cond.notify()
        self._thread.join(timeout + 2.0)


class Tail:
    """A node's last lines (at most TAIL_LINES, TAIL_BYTES), kept as the runs they came in."""

    def __init__(self) -> None:
        self._runs: collections.deque[tuple[bytes, int]] = collections.deque()
        self._lines = 0
        self._lock = threading.Lock()

    def add(self, run: bytes, nlines: int) -> None:
        with self._lock:
            self._runs.append((run, nlines))
            self._lines += nlines
            while len(self._runs) > 1 and self._lines - self._runs[0][1] >= TAIL_LINES:
                self._lines -= self._runs.popleft()[1]

    def lines(self) -> list[str]:
        with self._lock:
            runs = [r for r, _ in self._runs]
        lines = b"\n".join(runs).split(b"\n")[-TAIL_LINES:] if runs else []
        return cap_last_lines([ln.decode("utf-8", "replace").rstrip("\r") for ln in lines])


_AGENT_ERROR = re.compile(r"^E\d{4} .*elastic/multiprocessing/api\.py.*failed \(exitcode")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def worker_lines(lines: Sequence[str]) -> list[str]:
    """A node's log lines up to torchrun's own failure report (the worker's last words)."""
    for i, line in enumerate(lines):
        if _AGENT_ERROR.match(line):
            return list(lines[:i])
    return list(lines)


def root_cause(lines: Sequence[str]) -> str | None:
    """'worker rank R exit code C' from torchrun's root-cause summary, when it printed one."""
    rank = code = None
    for line in lines:
        if (m := _ROOT_RANK.match(line)) and rank is None:
            rank = m.group(1)
        elif (m := _ROOT_EXIT.match(line)) and code is None:
            code = m.group(1)
    if rank is None or code is None:
        return None
    return f"worker rank {rank} exit code {code}"


# the last line of a Python traceback: "OSError: [Errno 28] No space left on device: '/out/x'", with
# torch's per-rank prefix ("[rank0]: ") where torchrun adds one
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)"
                        r"(?::\s.*)?)$")
_AGENT_OWN = ("ChildFailedError", "torch.distributed.elastic")


def last_error(lines: Sequence[str]) -> str | None:
    """The worker's own last exception line ("OSError: [Errno 28] No space left on device"), not
    torchrun's report about it (ChildFailedError); None when the worker printed none. A rank that
    failed on a full --output folder was said only as "exited with code 1" (issue 45 item 13)."""
    for line in reversed(worker_lines(lines)):
        m = _EXCEPTION.match(line.strip())
        if m and not any(own in m.group(1) for own in _AGENT_OWN):
            return m.group(1)[:300]
    return None


_SIGNALLED = re.compile(r"^\s*exitcode\s*:\s*-(\d+)")
_ERROR_LINE = re.compile(r"Traceback|Error|Exception|terminate called|Fatal|Segmentation|core dumped")


_FINISHED = re.compile(r"\b(done|finished|complete[d]?|saved|success(ful(ly)?)?|exiting)\b", re.I)
# what a signal death means, said beside it (issue 46 item 1: a SIGKILL mid-training, the out-of-memory
# killer's signal, was reported as "its work may be complete")
SIGNAL_MEANS = {
    "SIGKILL": "killed, e.g. by the out-of-memory killer (`dmesg` on the node says which process and why)",
    "SIGSEGV": "a crash in native code (a CUDA or C extension fault)",
    "SIGBUS": "a bad memory access (a file mapped in memory that shrank, or shared memory /dev/shm full)",
    "SIGTERM": "asked to stop by another process",
}


def signal_note(lines: list[str]) -> str:
    """'; worker ended with SIGNAME: what it means', from torchrun's root cause when a worker died
    by a signal. '...after its last line; its work may be complete' only for SIGABRT (torch's abort
    at interpreter exit, after the script finished) and only when the worker's own last line says
    it finished and no error line precedes it."""
    m = next((m for m in map(_SIGNALLED.match, lines) if m), None)
    if not m:
        return ""
    try:
        name = signal.Signals(int(m.group(1))).name
    except ValueError:
        name = f"signal {m.group(1)}"
    own = [ln for ln in worker_lines(lines) if "@gpucluster-metric" not in ln and ln.strip()]
    if name == "SIGABRT" and own and _FINISHED.search(own[-1]) and not any(_ERROR_LINE.search(ln) for ln in own[-10:]):
        return f"; worker ended with {name} after its last line; its work may be complete"
    return f"; worker ended with {name}" + (f": {SIGNAL_MEANS[name]}" if name in SIGNAL_MEANS else "")
