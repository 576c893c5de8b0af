"""`NodeSupervisor`: runs one local process per node (a torchrun agent for `local`, an `ssh` client
for `ssh`; the Kubernetes launcher feeds it pod logs) and watches them: node logs, metrics through
the one parser, tails, fail fast when any node fails, the job's deadline; and `terminate_groups`,
SIGTERM then SIGKILL to process groups, reaping as it goes."""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping, Protocol, Sequence

from gpucluster.watch.control import AGENT_EXIT, NODE_EXIT, WORKER_START, Gate, NodeKeys
from gpucluster.errors import LaunchError
from gpucluster.domain import UNWITNESSED
from gpucluster.events import Phase, RunEvents
from gpucluster.states import JsonMapping, JsonObject
from gpucluster.costing.guards import Guard
from gpucluster.watch.launch import JobResult, JobSpec, NodeResult
from gpucluster.watch.metrics import MetricsState, read_line
from gpucluster.watch.nodeloss import NOTICE_KIND, REAPER_KILLED, cause_of, lost_record, notice_failure, save_grace
from gpucluster.node.reaper import DONE_KIND as REAPER_DONE, START_KIND as REAPER_START
from gpucluster.watch.staging import SETUP_END
from gpucluster.watch.text_metrics import TextScan, text_record, world_record  # world_record: imported from here too
from gpucluster.ledger.node_output import (CONSOLE_BACKLOG, CONSOLE_RATE, LOG_HOLD, METRIC_PREFIX, READ_SIZE, ConsoleFeed,
                                    LineSplitter, Tail, count_lines, grow_pipe, last_error, metric_lines, root_cause,
                                    signal_note)  # signal_note: imported from here too


NODE_EXIT_KIND = NODE_EXIT
# the records that show a job is alive (guards.py's stall clock): its own metrics, printed losses, its start
_LIVE_KINDS = frozenset({"start", "epoch", "step", "final", "world", "text_metric", "pg_join", WORKER_START})
# A node's shell, after its reaper: one metric record with the reaper's exit status and the node's
# node_exit key, which the shell read into $gk_exit from its stdin (gpucluster.watch.control) (sh syntax)
NODE_EXIT_SH = ("rc=$?; printf '%s{\"kind\": \"" + NODE_EXIT_KIND + "\", \"rc\": %d, \"key\": \"%s\"}\\n' "
                "'@gpucluster-metric ' \"$rc\" \"$gk_exit\" >&2; exit $rc")
DRAIN_S = 10.0  # how long a node's session may stay open once its job has ended


class NodeProcess(Protocol):
    """What `NodeSupervisor.run` watches of a node: a `subprocess.Popen`, or the Kubernetes
    launcher's pod handle."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


class Stage(Protocol):
    """What `NodeSupervisor.run` asks of its `stage` (the Kubernetes launcher's health check and
    stager): a failure or None every loop, whether it is done, and the phase it is in."""

    @property
    def phase(self) -> Phase: ...

    @property
    def done(self) -> bool: ...

    def poll(self) -> str | None: ...


class NodeSupervisor:
    """Watches one local process per node: pumps its output, fails fast, enforces the deadline.

    Output is read in chunks and written to node-N.log as it comes (every byte, nothing
    dropped). Metric records go to the main loop (ledger, phases); log lines go to the console
    through `ConsoleFeed`, which shows a summary instead of lines when it falls behind; the
    last lines (at most TAIL_BYTES, long lines cut) are kept for the report and the ledger.

    `stop(procs)` is the launcher's way of making everything it started go away (process groups,
    remote process groups); it is called on failure, timeout, interrupt and exception alike.
    """

    def __init__(self, job: JobSpec, events: RunEvents, log_dir: Path, hosts: Sequence[str],
                 console_backlog: int = CONSOLE_BACKLOG, console_rate: float = CONSOLE_RATE,
                 reaper: bool = False, keys: Mapping[int, NodeKeys] | None = None, grace: float = 3.0):
        self.job = job
        self.events = events
        self.log_dir = log_dir
        self.usual_grace = float(grace)  # the launcher's grace when stopping the ranks
        self.hosts = list(hosts)
        # the ranks gpucluster launched: a script's own "world_size" or "rank" never overrides them
        self.metrics = MetricsState(launched_world=job.nproc_per_node * len(hosts))
        self._queue: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._tails: dict[int, Tail] = {i: Tail() for i in range(len(hosts))}
        self._log_locks: dict[int, threading.Lock] = {}
        self._threads: list[threading.Thread] = []
        self._open_streams = 0
        self.train_started_at: float | None = None
        self.rendezvous_started_at: float | None = None
        self.setup_done: set[int] = set()  # nodes whose --setup succeeded
        self._release: Callable[[], None] | None = None
        self.incomplete_logs: dict[int, str] = {}  # node rank -> why its log could not be written
        self.reaper = reaper  # each node runs under gpucluster/node/reaper.py, which reports its own start and end
        self.reapers: dict[int, str] = {}  # node rank -> "started" | "done" (as the reaper said)
        self.node_exits: dict[int, tuple[int, float]] = {}  # node rank -> (reaper's exit status, when said)
        self.undrained: set[int] = set()  # nodes whose session stayed open after their job ended
        self.agent_exits: dict[int, tuple[object, float]] = {}  # node rank -> (its agent's exit status, when said)
        self.stuck: set[int] = set()  # nodes whose reaper said nothing within its grace after its agent ended
        # control records (reaper, node exit, setup) are taken only with the node's key for them
        self.gate = Gate(keys)
        self.phase: Phase | None = None  # the phase this supervisor last reported
        self.notice: tuple[int, JsonObject] | None = None  # a node's interruption notice (nodeloss.py)
        # after a notice: how long the launcher's stop gives the ranks to save (nodeloss.save_grace)
        self.stop_grace: float | None = None
        log_dir.mkdir(parents=True, exist_ok=True)
        self.console = ConsoleFeed(events, log_dir, console_backlog, console_rate)
        # --max-cost and --stall-minutes (gpucluster/costing/guards.py): asked every loop once the nodes start their job
        self.guard = Guard(max_cost=job.max_cost, stall_s=job.stall_s, cost_before=job.cost_before,
                           accrued=events.accrued_cost, say=lambda text: _say(events, text),
                           record=lambda rec: events.on_metric(None, {**rec, "run_id": job.run_id}))

    def notify(self, node_rank: int, record: JsonMapping) -> None:
        """A node's interruption notice read by the launcher from its platform (GKE: host maintenance), not
        from the node's output: acted on as a keyed `node_notice` record is (only the first counts)."""
        if self.notice is None:
            self.notice = (node_rank, {**record, "kind": NOTICE_KIND, "node_rank": node_rank})
            self.events.on_metric(node_rank, self.notice[1])

    def attach(self, node_rank: int, stream: Iterable[bytes]) -> None:
        log_path = self.log_dir / f"node-{node_rank}.log"
        read1 = getattr(stream, "read1", None)
        if read1 is not None:
            grow_pipe(stream)
        tail = self._tails.setdefault(node_rank, Tail())
        # A node's streams (the job, and the utilisation sampler beside a user's script) share one
        # log file: only whole lines go in, under the node's lock, so a line is never split by
        # another stream's (an unfinished line longer than LOG_HOLD is written as it comes).
        lock = self._log_locks.setdefault(node_rank, threading.Lock())

        def pump() -> None:
            splitter = LineSplitter()
            scan = TextScan()  # loss/accuracy lines of a script that prints them (text_metrics)
            chunks = iter(lambda: read1(READ_SIZE), b"") if read1 is not None else iter(stream)
            pending = bytearray()
            log: IO[bytes] | None = None
            broken: list[str] = []  # why the node log cannot be written (then only the tail is kept)

            def write(data: bytes) -> None:
                # A log that cannot be written (disk full, I/O error, a folder where the log belongs)
                # never stops the draining of the job's output: the workers would block writing
                # their stdout and the run would hang. Reading goes on; the tail and metrics are kept.
                if broken or log is None:  # no log: broken says why
                    return
                try:
                    with lock:
                        log.write(data)
                        log.flush()
                except (OSError, ValueError) as exc:
                    self._log_broken(node_rank, log_path, exc, broken)

            try:
                log = open(log_path, "ab")
            except OSError as exc:
                self._log_broken(node_rank, log_path, exc, broken)
            try:
                for chunk in chunks:
                    if not chunk:
                        continue
                    end = chunk.rfind(b"\n") + 1
                    if end:
                        write(bytes(pending) + chunk[:end] if pending else chunk[:end])
                        pending = bytearray(chunk[end:])
                    else:
                        pending += chunk
                        if len(pending) > LOG_HOLD:
                            write(bytes(pending))
                            pending = bytearray()
                    run, carried = splitter.feed(chunk)
                    if run is not None:
                        self._take(node_rank, tail, run, METRIC_PREFIX in chunk or carried, scan)
            except (OSError, ValueError):
                pass  # the stream itself broke (closed): the process is gone or going
            finally:
                if pending:
                    write(bytes(pending))
                if log is not None:
                    try:
                        log.close()
                    except OSError as exc:
                        self._log_broken(node_rank, log_path, exc, broken)
                rest = splitter.close()
                if rest is not None:
                    self._take(node_rank, tail, rest, True, scan)
                for ln in scan.close():
                    self._queue.put((node_rank, ln))
                self._queue.put((node_rank, None))

        t = threading.Thread(target=pump, name=f"log-node-{node_rank}", daemon=True)
        self._open_streams += 1
        self._threads.append(t)
        t.start()

    def _log_broken(self, node_rank: int, log_path: Path, exc: BaseException, broken: list[str]) -> None:
        """Said once per node: its log is incomplete from here on (its output is still read)."""
        if broken:
            return
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        broken.append(why)
        with self._log_locks.setdefault(node_rank, threading.Lock()):  # a node's streams share its log
            said = node_rank in self.incomplete_logs
            self.incomplete_logs.setdefault(node_rank, why)
        if said:
            return
        _say(self.events, f"node {node_rank}: its log {log_path} is incomplete: it could not be written "
                          f"({why}); the job's output is still read, its last lines and metrics kept")

    def _take(self, node_rank: int, tail: Tail, run: bytes, maybe_metric: bool, scan: TextScan) -> None:
        nlines = count_lines(run)
        tail.add(run, nlines)
        said = metric_lines(run) if maybe_metric else []
        for ln in said:
            self._queue.put((node_rank, ln.decode("utf-8", "replace").rstrip("\r")))
        if nlines > len(said):  # a line of the job's own (not a metric record): a sign of life
            self.guard.alive(node_rank)
        for text in scan.lines(run):
            self._queue.put((node_rank, text))
        self.console.offer(node_rank, run, nlines)

    def _drain(self, timeout: float) -> None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            node_rank, line = item
            if line is None:
                self._open_streams -= 1
            else:
                self._handle(node_rank, line)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return

    def _handle(self, node_rank: int, line: str) -> None:
        record = read_line(line)
        if isinstance(record, str):  # the script's line is data: counted, said once, never acted on
            self._refuse(node_rank, record)
            return
        if record is None:
            record = world_record(line) or text_record(line)
        if record is None:
            return
        kind = record.get("kind")
        if not self._admit(node_rank, record, kind):
            return
        record.setdefault("node_rank", node_rank)
        # A built-in workload says "start" once its process group is up; a user's command
        # is started through the announcer, whose record says the worker process exists.
        control = _CONTROL.get(kind) if isinstance(kind, str) else None
        if control is not None:
            control(self, node_rank, record)
        self._note_life(node_rank, record, kind)
        self.events.on_metric(node_rank, record)

    def _admit(self, node_rank: int, record: JsonObject, kind: object) -> bool:
        """Whether a metric record is acted on: its key (control records), its order (no worker
        before the node's setup ended), its shape (`MetricsState.update`). A refused one is data."""
        why = self.gate.admit(node_rank, record)
        if why is None and kind == WORKER_START and self.job.setup and node_rank not in self.setup_done:
            why = f"a {kind!r} record before node {node_rank}'s setup ended (the job's own line)"
        refused = self.metrics.refused
        if why is None:
            self.metrics.update(record, node_rank)
        if why is not None or self.metrics.refused > refused:  # forged or bad: data, never acted on
            self._refuse(node_rank, why or self.metrics.first_refusal or "refused", counted=why is None)
            return False
        return True

    def _on_reaper_start(self, node_rank: int, record: JsonObject) -> None:
        self.reapers.setdefault(node_rank, "started")

    def _on_reaper_done(self, node_rank: int, record: JsonObject) -> None:
        survived = record.get("survived")
        self.reapers[node_rank] = "done" if survived == 0 else f"survived:{survived}"

    def _on_agent_exit(self, node_rank: int, record: JsonObject) -> None:
        self.agent_exits.setdefault(node_rank, (record.get("rc"), time.monotonic()))

    def _on_node_exit(self, node_rank: int, record: JsonObject) -> None:
        rc = record.get("rc")
        if isinstance(rc, int):
            self.node_exits.setdefault(node_rank, (rc, time.monotonic()))

    def _on_setup_end(self, node_rank: int, record: JsonObject) -> None:
        if record.get("rc") == 0:
            self.setup_done.add(node_rank)

    def _on_notice(self, node_rank: int, record: JsonObject) -> None:
        if self.notice is None:  # a node's interruption notice (keyed: gpucluster/watch/control.py)
            self.notice = (node_rank, record)

    def _note_life(self, node_rank: int, record: JsonObject, kind: object) -> None:
        """What a record says of the job's life to the guards (utilisation, a sign of life) and to
        the phases (its first worker: the job trains)."""
        if kind == "util":
            self.guard.utilisation(node_rank, record)
        elif kind in _LIVE_KINDS:
            self.guard.alive(node_rank)
        if kind in ("start", WORKER_START) and self.train_started_at is None:
            self.train_started_at = time.time()
            self.guard.start()  # the stall clock runs from the job's first worker
            self._phase(Phase.TRAIN)

    def _refuse(self, node_rank: int, why: str, counted: bool = False) -> None:
        """A metric line that is not acted on: counted (unless `metrics` counted it), said once."""
        if not counted:
            self.metrics.refuse(why)
        if self.metrics.refused == 1:
            _say(self.events, f"node {node_rank}: a metric line was ignored ({why}); "
                              "further bad metric lines are counted in the run's metrics")

    def _undrained(self, procs: Mapping[int, NodeProcess], exit_codes: dict[int, int | None]) -> list[int]:
        now = time.monotonic()
        late = [r for r, (_, said) in self.node_exits.items()
                if r in procs and r not in exit_codes and procs[r].poll() is None and now - said > DRAIN_S]
        self.undrained.update(late)
        return late

    def _stuck(self, procs: Mapping[int, NodeProcess], exit_codes: dict[int, int | None]) -> list[int]:
        """Nodes whose agent ended (`agent_exit`) more than the reaper's grace for its final pass
        ago (twice the launcher's, and 5 s) while their reaper has still not said `reaper_done`: a
        job can stop its reaper (SIGSTOP), which then never ends. Taken as ended with the agent's
        status; the launcher's stop() kills the reaper (SIGKILL works on a stopped process); the
        node has no witness."""
        now, late = time.monotonic(), 2 * self.usual_grace + 5.0
        stuck = [r for r, (_, said) in self.agent_exits.items() if r in procs and r not in exit_codes
                 and self.reapers.get(r) == "started" and procs[r].poll() is None and now - said > late]
        for r in stuck:
            self.stuck.add(r)
            _say(self.events, f"node {r}: its reaper said nothing {late:g} s after the job's agent ended (stopped by "
                              "the job?): it is stopped, and the node has no witness")
        return stuck

    def _maybe_release(self) -> None:
        """Once every node's --setup succeeded (and staging is over), rendezvous begins: the
        launcher's `release` lets the nodes start torchrun together."""
        if self._release is not None and len(self.setup_done) == len(self.hosts):
            release, self._release = self._release, None
            self._rendezvous()
            release()

    def _phase(self, phase: Phase) -> None:
        self.phase = phase
        self.events.on_phase(phase)

    def _lost(self, rank: int, why: str, cause: str | None = None) -> str:
        """A lost node (nodeloss.py): its `node_lost` record, and the run's failure line."""
        self.events.on_metric(rank, lost_record(rank, self.hosts[rank], cause or cause_of(why), why,
                                                self.phase.value if self.phase else None))
        return f"node {rank} ({self.hosts[rank]}) lost: {why}"

    def _rendezvous(self) -> None:
        self._phase(Phase.RENDEZVOUS)
        self.rendezvous_started_at = time.time()

    def _setup_failure(self, rank: int, code: int | None) -> str:
        lines = [ln for ln in self.tail(rank) if "@gpucluster-metric" not in ln and ln.strip()]
        last = " | ".join(ln.strip()[:200] for ln in lines[-5:])
        return (f"setup failed on node {rank} ({self.hosts[rank]}): exit code {code}"
                + (f"; last lines: {last}" if last else ""))

    def _node_failure(self, rank: int, code: int | None) -> str:
        failure = f"node {rank} ({self.hosts[rank]}) exited with code {code}"
        cause, error = root_cause(self.tail(rank)), last_error(self.tail(rank))
        return failure + (f" ({cause})" if cause else "") + (f": {error}" if error else "") + signal_note(self.tail(rank))

    def tail(self, node_rank: int) -> list[str]:
        tail = self._tails.get(node_rank)
        return tail.lines() if tail else []

    def close(self) -> None:
        """Let the console show what it still can (bounded), then stop its thread."""
        self.console.close()

    def run(self, procs: Mapping[int, NodeProcess], stop: Callable[[], None],
            watch: Callable[[], str | None] | None = None,
            release: Callable[[], None] | None = None, stage: Stage | None = None,
            lost: Callable[[int, int | None], str | None] | None = None) -> JobResult:
        """Watch until every node exits 0, one fails, or the deadline passes; always calls stop().

        `watch`, when given, is asked every loop for a failure of something beside the nodes
        (the local launcher also lets go of its rendezvous store there); a string ends the run as
        that failure.
        With a job `setup`, the run starts in the "setup" phase (which counts against the time
        limit) and `release()` is called once every node has reported its setup done; an
        exception from it ends the run as a failure.
        `stage`, when given, stages data into the nodes while they run (the Kubernetes launcher:
        pods exist only once the job does; its health check goes first, and `stage.phase` names the
        phase it is in): the run opens in the "stage" phase, `stage.poll()` is
        asked every loop (a string ends the run as that failure), and once `stage.done` is true
        the run moves on to "setup" (or "rendezvous"); the setup's release waits for it.
        `lost(rank, exit status)`, when given, says why a node that ended is a lost node (killed,
        unreachable) rather than a failed job; a node's interruption notice ends the run the same
        way. Either is reported as a `node_lost` record (gpucluster/watch/nodeloss.py).

        The loop is a state machine (`_Watch`): each turn runs the step of the state it is in,
        which returns the next state, until `ENDED`."""
        setup = bool(self.job.setup)
        self._release = release if setup else None
        limit = self.job.max_seconds
        run = _Run(procs=procs, watch=watch, stage=stage, lost=lost, setup=setup, limit=limit,
                   deadline=time.monotonic() + limit if limit else None, staged=stage is None)
        self.rendezvous_started_at = time.time() if run.staged and not setup else None
        steps: dict[_Watch, Callable[[_Run], _Watch]] = {
            _Watch.STAGING: self._staging, _Watch.SETUP: self._setting_up, _Watch.WATCHING: self._watching}
        try:
            self._phase(_stage_phase(stage) if stage is not None else Phase.SETUP if setup else Phase.RENDEZVOUS)
            state = _Watch.STAGING if stage is not None else _Watch.SETUP if setup else _Watch.WATCHING
            while state is not _Watch.ENDED:
                state = steps[state](run)
        finally:
            self._collect(stop)
        return self._verdict(run)

    # -- the states of run()'s loop ----------------------------------------------------------------
    def _staging(self, run: _Run) -> _Watch:
        """`stage` stages data into the nodes (or checks them first): asked every turn."""
        self._drain(0.2)
        if run.failure is None and run.stage is not None:
            self._poll_stage(run, run.stage)
        if run.staged:
            self._release_nodes(run)
        return self._watch_nodes(run, _Watch.STAGING)

    def _setting_up(self, run: _Run) -> _Watch:
        """The nodes run their --setup; released together once every one said it ended well."""
        self._drain(0.2)
        self._release_nodes(run)
        return self._watch_nodes(run, _Watch.SETUP)

    def _watching(self, run: _Run) -> _Watch:
        """The job runs (rendezvous, then training)."""
        self._drain(0.2)
        return self._watch_nodes(run, _Watch.WATCHING)

    def _poll_stage(self, run: _Run, stage: Stage) -> None:
        run.failure = stage.poll()
        now = _stage_phase(stage)
        if run.failure is None and not stage.done and now != self.phase:
            self._phase(now)  # the Kubernetes launcher's check, then its staging
        if run.failure is None and stage.done:
            run.staged = True
            self._phase(Phase.SETUP) if run.setup else self._rendezvous()

    def _release_nodes(self, run: _Run) -> None:
        try:
            self._maybe_release()
        except LaunchError as exc:  # the release of the nodes after setup failed
            run.failure = run.failure or str(exc)

    def _watch_nodes(self, run: _Run, state: _Watch) -> _Watch:
        """Every state's checks of the nodes, in order; then the state the loop goes on in."""
        self._check_node_exits(run)
        self._check_stuck(run)
        self._check_undrained(run)
        self._check_notice(run)
        self._check_procs(run)
        if run.failure is None and run.watch is not None:
            run.failure = run.watch()
        self._check_guard(run)
        return self._next_state(run, state)

    def _next_state(self, run: _Run, state: _Watch) -> _Watch:
        if run.failure is not None or len(run.exit_codes) == len(run.procs):
            return _Watch.ENDED
        if run.limit and run.deadline is not None and time.monotonic() > run.deadline:
            run.timed_out = True
            run.failure = f"the run exceeded its time limit of {run.limit / 60:g} minutes"
            return _Watch.ENDED
        if state is _Watch.STAGING and run.staged:
            return _Watch.SETUP if self._release is not None else _Watch.WATCHING
        if state is _Watch.SETUP and self._release is None:
            return _Watch.WATCHING
        return state

    # -- the checks of every turn ------------------------------------------------------------------
    def _check_node_exits(self, run: _Run) -> None:
        """A node's shell said its agent was killed: a lost node, when `lost` says so."""
        for rank, (code, _) in list(self.node_exits.items()):
            lost = run.lost
            why = lost(rank, code) if lost is not None and rank not in run.exit_codes and run.failure is None else None
            if why and code == 128 + 9 and self.reapers.get(rank) == "started":  # no reaper_done: the reaper
                why = REAPER_KILLED
            if why:
                run.exit_codes[rank], run.failed_node, run.failure = code, rank, self._lost(rank, why)

    def _check_stuck(self, run: _Run) -> None:
        for rank in self._stuck(run.procs, run.exit_codes):
            rc = self.agent_exits[rank][0]
            run.exit_codes[rank] = rc if isinstance(rc, int) else None
            if rc != 0 and run.failure is None:
                run.failed_node, run.failure = rank, self._node_failure(rank, run.exit_codes[rank])

    def _check_undrained(self, run: _Run) -> None:
        for rank in self._undrained(run.procs, run.exit_codes):
            # the node's job is over but its session is not: something the job left holds
            # its output open. Its exit status is the one its shell reported; stop() ends it.
            run.exit_codes[rank] = self.node_exits[rank][0]
            if run.exit_codes[rank] != 0 and run.failure is None:
                run.failed_node, run.failure = rank, self._node_failure(rank, run.exit_codes[rank])

    def _check_notice(self, run: _Run) -> None:
        if self.notice is None or run.failure is not None:
            return
        # the cloud takes a node back
        failed_node, notice = self.notice
        run.failed_node = failed_node
        run.failure = notice_failure(failed_node, self.hosts[failed_node], notice)
        self._lost(failed_node, run.failure.split(" lost: ", 1)[1], "interruption")
        self.stop_grace = save_grace(notice, self.usual_grace)
        _say(self.events, f"node {failed_node} gave notice: the ranks get up to {self.stop_grace:g} s to "
                          "save (SIGTERM) before they are stopped")

    def _check_procs(self, run: _Run) -> None:
        for rank, proc in run.procs.items():
            if rank not in run.exit_codes and proc.poll() is not None:
                run.exit_codes[rank] = proc.returncode
                if proc.returncode != 0 and run.failure is None:
                    run.failed_node = rank
                    run.failure = self._ended_failure(run, rank, proc.returncode)

    def _ended_failure(self, run: _Run, rank: int, code: int | None) -> str:
        """Why the run fails when a node's process ended with `code` (not 0)."""
        why = run.lost(rank, code) if run.lost is not None else None
        if why:
            return self._lost(rank, why)
        if not run.staged and run.stage is not None:
            self._drain(0)
            return run.stage.poll() or self._node_failure(rank, code)
        if run.setup and rank not in self.setup_done:
            self._drain(0)  # the node's last lines
            return self._setup_failure(rank, code)
        return self._node_failure(rank, code)

    def _check_guard(self, run: _Run) -> None:
        if run.failure is not None or not self.guard.active:
            return
        stop_now = self.guard.poll()
        if stop_now is not None:  # a money guard: stopped as on a notice, with time to save
            run.failure, run.stopped_by = stop_now.reason, stop_now.kind
            self.stop_grace = save_grace({}, self.usual_grace)
            _say(self.events, f"{run.failure}: stopping the job (the ranks get up to {self.stop_grace:g} s "
                              "to save, SIGTERM), copying its outputs home, tearing down")

    # -- after the loop ----------------------------------------------------------------------------
    def _collect(self, stop: Callable[[], None]) -> None:
        stop()
        # Collect what the processes printed before they went, so the report shows it.
        end = time.monotonic() + 5
        while self._open_streams > 0 and time.monotonic() < end:
            self._drain(0.1)
        self._drain(0)
        self.close()

    def _verdict(self, run: _Run) -> JobResult:
        procs, failure = run.procs, run.failure
        for rank, proc in procs.items():
            if rank not in run.exit_codes and proc.poll() is not None and failure is None:
                run.exit_codes[rank] = proc.returncode
        nodes = [NodeResult(r, self.hosts[r], run.exit_codes.get(r), self.tail(r)) for r in sorted(procs)]
        ok = failure is None and all(n.exit_code == 0 for n in nodes)
        missing = self._missing_finals(len(procs)) if ok else None
        if missing:
            ok = False
            failure = (f"every node exited 0 but rank(s) {', '.join(map(str, missing[:8]))} wrote no final "
                       "record (a worker died after its work, or the script does not report)")
        return JobResult(
            ok=ok, nodes=nodes, metrics=self.metrics, failure=failure, failed_node=run.failed_node,
            timed_out=run.timed_out, train_started_at=self.train_started_at,
            rendezvous_started_at=self.rendezvous_started_at, log_dir=str(self.log_dir),
            unwitnessed=self._unwitnessed(procs), stopped_by=run.stopped_by,
        )

    def _missing_finals(self, nodes: int) -> list[int]:
        """The ranks with no final record, for a job that speaks the metrics protocol.

        Built-in workloads, and any script that speaks the metrics protocol, must show a final
        record from every rank: a rank can exit 0 without finishing its work. A script that
        reports nothing is judged by its exit codes alone (it runs unmodified)."""
        speaks_protocol = self.job.workload is not None or bool(
            self.metrics.start or self.metrics.epochs or self.metrics.finals)
        if not speaks_protocol:
            return []
        world = self.job.nproc_per_node * nodes  # what was launched, not what the script says
        return sorted(set(range(world)) - set(self.metrics.finals))

    def _unwitnessed(self, procs: Mapping[int, NodeProcess]) -> list[str]:
        """No verdict without its witness: a node whose reaper started but never said its final
        pass was over (it was killed) cannot vouch that nothing of the job survived there."""
        unwitnessed = [f"{UNWITNESSED}node {r} ({self.hosts[r]}): its reaper ended without finishing its final "
                       "pass (killed?): a process the job detached there may survive unseen"
                       for r in sorted(procs) if self.reaper and self.reapers.get(r) == "started" and r not in self.stuck]
        unwitnessed += [f"{UNWITNESSED}node {r} ({self.hosts[r]}): its reaper said nothing within its grace after the "
                        "job's agent ended (stopped by the job?) and was killed: a process the job detached there may "
                        "survive unseen" for r in sorted(self.stuck)]
        unwitnessed += [f"{UNWITNESSED}node {r} ({self.hosts[r]}): its reaper saw "
                        f"{self.reapers[r].split(':', 1)[1]} process(es) survive SIGKILL"
                        for r in sorted(procs) if self.reapers.get(r, "").startswith("survived:")]
        unwitnessed += [f"{UNWITNESSED}node {r} ({self.hosts[r]}): its session stayed open {DRAIN_S:g} s after its job "
                        "ended (a process the job left holds its output) and was cut"
                        for r in sorted(self.undrained)]
        return unwitnessed


class _Watch(Enum):
    """The states of `NodeSupervisor.run`'s loop."""

    STAGING = "staging"  # `stage` stages data into the nodes (or checks them first)
    SETUP = "setup"  # the nodes run their --setup; released together once all ended it well
    WATCHING = "watching"  # the job runs (rendezvous, training)
    ENDED = "ended"  # a failure, every node ended, or the deadline passed


@dataclass
class _Run:
    """What one `NodeSupervisor.run` watches and what it found so far."""

    procs: Mapping[int, NodeProcess]
    watch: Callable[[], str | None] | None
    stage: Stage | None
    lost: Callable[[int, int | None], str | None] | None
    setup: bool
    limit: float | None
    deadline: float | None
    staged: bool
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    failure: str | None = None
    failed_node: int | None = None
    timed_out: bool = False
    stopped_by: str | None = None


# what a control record does to the supervisor's state (`NodeSupervisor._handle`), by its kind
_CONTROL: dict[str, Callable[[NodeSupervisor, int, JsonObject], None]] = {
    REAPER_START: NodeSupervisor._on_reaper_start, REAPER_DONE: NodeSupervisor._on_reaper_done,
    AGENT_EXIT: NodeSupervisor._on_agent_exit, NODE_EXIT_KIND: NodeSupervisor._on_node_exit,
    SETUP_END: NodeSupervisor._on_setup_end, NOTICE_KIND: NodeSupervisor._on_notice,
}


def _stage_phase(stage: Stage) -> Phase:
    """The phase `stage` is in (the Kubernetes launcher's health check, then its staging)."""
    return stage.phase


def _say(events: RunEvents, text: str) -> None:
    """A message for the person running gpucluster (every events object takes messages)."""
    try:
        events.message(text)
    except Exception:  # noqa: BLE001 - a broken console must not stop the run
        pass
