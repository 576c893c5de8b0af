"""The launch sequence, written once (issue 39 item 5): local processes, ssh and Kubernetes each
supply a `Transport` (their operations on their nodes); `launch_sequence` runs its steps in order:

1. `open`: what reaches the nodes (ssh: the connections, their ledger rows);
2. `wait_ready` (phase `ready` where the transport has nodes to wait for): the nodes answer;
3. `ship`: the run's tools and code on each node;
4. `check` (phase `check`, when the job asks for one and the transport checks before it starts):
   every node's health check;
5. `lay_work`, then `stage` (phase `stage` when it has something to stage): the nodes' run folders
   and the job's data;
6. `rendezvous`: the rendezvous port;
7. one attempt: `start` (an exception, Ctrl-C included: `stop` what was started, then it
   propagates), `watch` (the node supervisor streams the nodes, and stops them on every path),
   `end_attempt` whatever happened. When the head could not bind the rendezvous port
   (EADDRINUSE, `port_taken`) and the transport has a `port_retry`: once more, and only once, on
   `another_port` (said and recorded as an `rdzv_port` metric; `again` readies the nodes), a
   second taken port failing with both ports named (`taken_twice`);
8. whatever happened: with an output folder and the job started somewhere (`started`), `hold`
   keeps the run for `Launcher.collect_outputs`; else `clean` removes the nodes' run folders or
   objects. An exception then goes to `failed` (ssh: the nodes lost on the way), and what was not
   held is `release`d (connections closed);
9. `explain`: the result's failure said with what the transport knows (Kubernetes: a pod's reason).

Every step but `start` and `watch` is a no-op in `Transport`. What a launcher keeps between
`launch` and `collect_outputs` is one record per run in a `Runs` table (not a dict per field).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpucluster.events import Phase, RunEvents
from gpucluster.watch.launch import JobResult, JobSpec

_TAKEN = re.compile(r"EADDRINUSE|[Aa]ddress already in use|errno:? 98\b")


def port_taken(result: JobResult) -> bool:
    """The run failed in its rendezvous because the head could not bind the port."""
    if result.ok or result.timed_out or result.train_started_at is not None:
        return False
    head = next((n for n in result.nodes if n.node_rank == 0), None)
    return head is not None and any(_TAKEN.search(line) for line in head.last_lines)


def taken_twice(result: JobResult, taken: int, alt: int, head: str) -> JobResult:
    """`result` of a second try whose port was taken too, its failure naming both ports."""
    why = (f"the rendezvous port was taken by another process between its check and torchrun's bind "
           f"(EADDRINUSE) twice: port {taken}, then port {alt}, on node 0 ({head})")
    return dataclasses.replace(result, failure=f"{why}; {result.failure}" if result.failure else why)


@dataclass(frozen=True)
class PortRetry:
    """How a transport's rendezvous port retry is said: node 0's label, when the port was taken
    (in the message) and the `holder` of the `rdzv_port` record."""

    head: str
    when: str
    holder: str


class Transport:
    """One run's operations on one kind of node, the steps of `launch_sequence` (see the module's
    docstring). Subclass it and override what the transport does; `start` and `watch` are
    required, the rest are no-ops here."""

    ready_phase = False  # it waits for its nodes: the run opens in the `ready` phase
    checks_first = False  # it runs the health check (`check`) before it starts the job
    port_retry: PortRetry | None = None  # it retries a rendezvous port taken at torchrun's bind

    def open(self) -> None:
        """What reaches the nodes (connections, their ledger rows)."""

    def wait_ready(self) -> None:
        """The nodes answer and are ready for the run."""

    def ship(self, job: JobSpec) -> None:
        """The run's tools and code on every node."""

    def check(self, job: JobSpec) -> None:
        """Every node's health check (`job.check`), when `checks_first`."""

    def lay_work(self, job: JobSpec) -> JobSpec:
        """The nodes' run folders laid down; the job as the nodes run it."""
        return job

    def stages(self, job: JobSpec) -> bool:
        """The job has data for `stage` to send (the `stage` phase)."""
        return False

    def stage(self, job: JobSpec) -> None:
        """The job's data on every node."""

    def rendezvous(self, job: JobSpec) -> JobSpec:
        """The job with the rendezvous port its nodes use."""
        return job

    def another_port(self, taken: int) -> int:
        """A rendezvous port found free again, after `taken` was taken at the bind (`port_retry`)."""
        raise NotImplementedError

    def again(self, job: JobSpec) -> JobSpec:
        """The nodes readied for a second attempt on `job.rdzv_port`; the job it runs."""
        return job

    def start(self, job: JobSpec) -> None:
        """Every node's job started."""
        raise NotImplementedError

    def stop(self) -> None:
        """What `start` started, stopped (`start` failed or was interrupted)."""

    def watch(self, job: JobSpec) -> JobResult:
        """The nodes watched until the job ends (the node supervisor stops them on every path)."""
        raise NotImplementedError

    def end_attempt(self, job: JobSpec) -> None:
        """After each attempt, whatever happened."""

    def started(self, job: JobSpec) -> bool:
        """The job was started on some node: it has outputs to collect."""
        return False

    def hold(self, job: JobSpec) -> None:
        """The run kept for `Launcher.collect_outputs`, which copies the outputs and then cleans up."""

    def clean(self, job: JobSpec) -> None:
        """The nodes' run folders (or the run's objects) removed: nothing is collected."""

    def failed(self, exc: BaseException) -> None:
        """The run ended with `exc` (said before it propagates)."""

    def release(self) -> None:
        """What reaches the nodes let go (connections closed), unless the run is held."""

    def explain(self, result: JobResult) -> None:
        """The result's failure said with what the transport knows."""


def launch_sequence(transport: Transport, job: JobSpec, events: RunEvents) -> JobResult:
    """`job` through `transport`'s steps, in their order (see the module's docstring)."""
    held = False
    try:
        transport.open()
        if transport.ready_phase:
            events.on_phase(Phase.READY)
        transport.wait_ready()
        try:
            result, job = _job(transport, job, events)
        finally:
            if job.output_dir and transport.started(job):
                transport.hold(job)  # the outputs are copied back before the folders go (collect_outputs)
                held = True
            else:
                transport.clean(job)
    except BaseException as exc:
        transport.failed(exc)
        raise
    finally:
        if not held:
            transport.release()
    transport.explain(result)
    return result


def _job(transport: Transport, job: JobSpec, events: RunEvents) -> tuple[JobResult, JobSpec]:
    """The steps between ready nodes and the job's result: (the result, the job as last run)."""
    transport.ship(job)
    if job.check is not None and transport.checks_first:  # every node's health, before anything starts
        events.on_phase(Phase.CHECK)
        transport.check(job)
    job = transport.lay_work(job)
    if transport.stages(job):  # its own phase: time in the phases, bytes in a `stage` record per node
        events.on_phase(Phase.STAGE)
        transport.stage(job)
    job = transport.rendezvous(job)
    result = attempt(transport, job)
    retry = transport.port_retry
    if retry is None or not port_taken(result):
        return result, job
    taken = job.rdzv_port
    alt = transport.another_port(taken)
    events.message(f"rendezvous port {taken} on node 0 ({retry.head}) was taken by another process {retry.when} "
                   f"(EADDRINUSE): starting once more on port {alt}")
    events.on_metric(0, {"kind": "rdzv_port", "port": alt, "busy_port": taken,
                         "holder": f"another process, {retry.holder} (EADDRINUSE)"})
    job = transport.again(dataclasses.replace(job, rdzv_port=alt))
    second = attempt(transport, job)
    return (taken_twice(second, taken, alt, retry.head) if port_taken(second) else second), job


def attempt(transport: Transport, job: JobSpec) -> JobResult:
    """One start of the job: started (what was started stopped when that fails or is interrupted),
    watched to its end, then `end_attempt`."""
    try:
        try:
            transport.start(job)
        except BaseException:  # Ctrl-C included: what was started is stopped before it propagates
            transport.stop()
            raise
        return transport.watch(job)
    finally:
        transport.end_attempt(job)


R = TypeVar("R")


class Runs(Generic[R]):
    """A launcher's record of each run it launched, by run id: what `collect_outputs` (and the
    teardown's questions) need after `launch` returned."""

    def __init__(self) -> None:
        self._runs: dict[str, R] = {}

    def put(self, run_id: str, record: R) -> R:
        self._runs[run_id] = record
        return record

    def get(self, run_id: str) -> R | None:
        return self._runs.get(run_id)

    def take(self, run_id: str) -> R | None:
        """The run's record, forgotten here (collected)."""
        return self._runs.pop(run_id, None)
