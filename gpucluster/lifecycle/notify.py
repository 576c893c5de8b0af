"""Run events for people: what `--notify URL` POSTs and what the Python API's `on_event=` is given.

A run that ends (succeeded, failed, interrupted, stopped at its cost cap), an attempt that was recovered (a lost node replaced,
docs/recovery.md), and a teardown that is not verified (leftovers, or a check that could not run)
each become one `RunEvent`. `post` sends it to each webhook as JSON with a Slack-compatible `text`
field, with the standard library only, retried twice; a webhook that fails never changes the run:
the failure is logged (logger `gpucluster.lifecycle.notify`) and returned for the caller to say.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypedDict

from gpucluster.domain import VERIFIED
from gpucluster.errors import UsageError
from gpucluster.states import JsonObject, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.records import RunRecord
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import RunUI

LOG = logging.getLogger("gpucluster.lifecycle.notify")
KINDS = ("succeeded", "failed", "interrupted", "stopped", "recovered", "not_verified", "cost_warning")
ENDS = ("succeeded", "failed", "interrupted", "stopped")  # stopped: at its --max-cost (gpucluster/costing/guards.py)
RETRIES = 2  # after the first try
TIMEOUT_S = 10.0
BACKOFF_S = 1.0


@dataclass(frozen=True)
class RunEvent:
    """One thing a person may want to hear about a run."""

    kind: str  # one of KINDS
    run_id: str
    status: str | None
    verdict: str | None  # the teardown verdict: verified, leftovers, not verified, kept, or None
    cost: str | None  # the run's total in USD, as a decimal string; None before it is known
    cluster: str | None
    cloud: str | None
    exit_code: int | None = None
    failure: str | None = None
    link: str | None = None  # the dashboard's page of the run, where one is served; else None
    show: str = ""  # the command that shows the whole record

    @property
    def text(self) -> str:
        """One line for a chat channel (Slack's `text`)."""
        head = {"succeeded": "succeeded", "failed": "FAILED", "interrupted": "was interrupted",
                "stopped": "was stopped at its cost cap",
                "recovered": "lost a node and was recovered", "not_verified": "may have left resources behind",
                "cost_warning": "has spent 80% of its cost cap (--max-cost) and is stopped at the cap"}
        parts = [f"gpucluster run {self.run_id} on {self.cloud or '?'} (cluster {self.cluster or '?'}) "
                 f"{head.get(self.kind, self.kind)}"]
        if self.failure and self.kind != "succeeded":
            parts.append(self.failure)
        if self.verdict:
            parts.append(f"teardown: {self.verdict}")
        if self.cost is not None:
            parts.append(f"cost ${self.cost}")
        return "; ".join(parts) + (f" ({self.link})" if self.link else f" (`{self.show}`)")

    def to_dict(self) -> JsonObject:
        return {**asdict(self), "text": self.text}


def check_urls(urls: Iterable[str]) -> tuple[str, ...]:
    """Webhook URLs checked for form (http or https, a host): a UsageError naming a bad one."""
    from urllib.parse import urlsplit

    out = []
    for url in urls:
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"--notify {url!r} is not allowed: an http:// or https:// webhook URL")
        out.append(str(url))
    return tuple(out)


def events_of(record: RunRecord, *, kind: str | None = None) -> list[RunEvent]:
    """The events of a run from its ledger record (`records.RunRecord`): its end, and a teardown
    that is not verified. `kind`: only the end, as this kind (e.g. "recovered" for an earlier attempt)."""
    run = record.run
    cost = (run.cost or {}).get("total")
    end = kind or (run.status if run.status in ENDS else "failed")
    event = RunEvent(kind=end, run_id=str(run.id), status=run.status, verdict=run.teardown,
                     cost=None if cost is None else str(cost), cluster=run.cluster, cloud=run.cloud,
                     exit_code=run.exit_code, failure=run.failure, show=f"gpucluster show {run.id}",
                     link=dashboard_link(str(run.id)))
    events = [event]
    if kind is None and run.teardown not in (None, VERIFIED, TeardownVerdict.KEPT):
        events.append(replace(event, kind="not_verified"))
    return events


def dashboard_link(run_id: str) -> str | None:
    """The run's page on the dashboard this home serves (`gpucluster dashboard` writes where, in
    `dashboard.json`, while it runs), without its token: it opens in the browser that already
    holds the dashboard's cookie. None when no dashboard is running."""
    import psutil

    from gpucluster.home import home_dir

    try:
        with open(home_dir(create=False) / "dashboard.json") as fh:
            note = json.load(fh)
        url, pid = str(note["url"]), int(note["pid"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not url.startswith("http://127.0.0.1:") or not psutil.pid_exists(pid):
        return None
    return f"{url}/runs/{run_id}"


def chain_events(ledger: Ledger, run_ids: Sequence[str], recovered: Sequence[bool]) -> list[RunEvent]:
    """The events of a run's attempts, oldest first: each recovered attempt's, then the last one's."""
    events: list[RunEvent] = []
    for i, run_id in enumerate(run_ids):
        record = ledger.get_run(run_id)
        if record is None:
            continue
        last = i == len(run_ids) - 1
        events += events_of(record, kind=None if last else ("recovered" if recovered[i] else None))
    return events


class How(TypedDict):
    """How webhooks are posted (`post`'s retries, timeout and backoff)."""

    retries: int
    timeout: float
    backoff: float


class LiveEvents:
    """A run's UI (`lifecycle.RunUI`) that tells, as they happen, what should not wait for the run's
    end: the cost cap's warning (guards.py's `cost_warning` record) and an attempt that is being
    recovered (recovery.py's `attempt` record with `recovering`). Each goes to `on_event` and every
    webhook from a thread of its own, so a slow webhook never holds the job; everything else goes
    to the wrapped UI. `close()` waits for what is being sent; `sent` holds (kind, run id)."""

    def __init__(self, ui: RunUI, ledger: Ledger, urls: Sequence[str], on_event: Callable[[RunEvent], object] | None,
                 *, retries: int = RETRIES, timeout: float = TIMEOUT_S, backoff: float = BACKOFF_S):
        import threading

        self.ui, self.ledger, self.urls, self.on_event = ui, ledger, list(urls), on_event
        self.how = How(retries=retries, timeout=timeout, backoff=backoff)
        self.sent: set[tuple[str, str]] = set()
        self.undelivered: list[str] = []
        self._threads: list[threading.Thread] = []

    # lifecycle.RunUI: to the wrapped UI
    def phase(self, name: str) -> None:
        self.ui.phase(name)

    def line(self, node_rank: int, text: str) -> None:
        self.ui.line(node_rank, text)

    def message(self, text: str) -> None:
        self.ui.message(text)

    def progress(self, text: str) -> None:
        self.ui.progress(text)

    def stopping(self, signal_name: str) -> None:
        self.ui.stopping(signal_name)

    def metric(self, node_rank: int | None, record: JsonObject) -> None:
        self.ui.metric(node_rank, record)
        kind, run_id = record.get("kind"), record.get("run_id")
        if not run_id or not (kind == "cost_warning" or (kind == "attempt" and record.get("recovering"))):
            return
        told = "cost_warning" if kind == "cost_warning" else "recovered"
        if (told, str(run_id)) in self.sent:
            return
        self.sent.add((told, str(run_id)))
        self._send(told, str(run_id), record.get("accrued"))

    def _send(self, kind: str, run_id: str, accrued: object) -> None:
        import threading

        def tell() -> None:
            try:
                found = self.ledger.get_run(run_id)
                event = events_of(found, kind=kind)[0] if found is not None else RunEvent(
                    kind=kind, run_id=run_id, status=None, verdict=None, cost=None, cluster=None, cloud=None)
                if accrued is not None:
                    event = replace(event, cost=str(accrued), status=RunStatus.RUNNING)
            except Exception as exc:  # noqa: BLE001 - a ledger that cannot be read now: the run goes on
                self.undelivered.append(f"no {kind} event sent for run {run_id}: {exc}")
                return
            self.undelivered.extend(deliver([event], self.urls, self.on_event, **self.how))

        thread = threading.Thread(target=tell, name=f"notify-{kind}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self, timeout: float = 60.0) -> list[str]:
        """Wait (at most `timeout` s each) for the events being sent; what could not be delivered."""
        for thread in self._threads:
            thread.join(timeout)
        return self.undelivered


def post(url: str, event: RunEvent, *, retries: int = RETRIES, timeout: float = TIMEOUT_S,
         backoff: float = BACKOFF_S) -> str | None:
    """POST the event to one webhook; None when it answered 2xx, else why it failed (logged)."""
    body = json.dumps(event.to_dict(), default=str).encode()
    why = "not sent"
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "gpucluster"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only (check_urls)
                if 200 <= resp.status < 300:
                    return None
                why = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:  # refused, timed out, DNS, a bad URL
            why = str(getattr(exc, "reason", None) or exc)
        if attempt < retries:
            time.sleep(backoff * (attempt + 1))
    said = f"webhook {url}: {event.kind} of run {event.run_id} not delivered after {retries + 1} tries ({why})"
    LOG.warning(said)
    return said


def deliver(events: Iterable[RunEvent], urls: Sequence[str], on_event: Callable[[RunEvent], object] | None = None,
            *, retries: int = RETRIES, timeout: float = TIMEOUT_S, backoff: float = BACKOFF_S) -> list[str]:
    """Each event to the callback and every webhook; what could not be delivered (never raised)."""
    failed: list[str] = []
    for event in events:
        if on_event is not None:
            try:
                on_event(event)
            except Exception as exc:  # the caller's callback: the run is over and stays as it is
                LOG.warning("on_event callback raised on %s of run %s: %r", event.kind, event.run_id, exc)
                failed.append(f"on_event callback raised {exc!r} on {event.kind} of run {event.run_id}")
        for url in urls:
            why = post(url, event, retries=retries, timeout=timeout, backoff=backoff)
            if why:
                failed.append(why)
    return failed
