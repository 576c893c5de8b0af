"""Issue 47, item 3: run events to webhooks (`run --notify URL`, `notify:` in the config file) and to the
Python API's `on_event=`: JSON with a Slack-compatible `text`, retried twice, a failing webhook never
raised (logged, returned). Against a real HTTP server on loopback (http.server in a thread)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpucluster.errors import UsageError
from gpucluster.lifecycle.notify import RunEvent, check_urls, deliver, events_of, post
from gpucluster.ledger.records import RunRecord, RunRow

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


class Hook:
    """A webhook on 127.0.0.1: answers each POST with the next status of `answers` (then 200)."""

    def __init__(self, answers=()):
        self.answers = list(answers)
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.bodies.append(json.loads(body))
                hook.headers.append(dict(self.headers))
                self.send_response(hook.answers.pop(0) if hook.answers else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def _record(**run) -> RunRecord:
    row = dict(id="r1", status="succeeded", cloud="local", cluster="c1", exit_code=0, teardown="verified",
               cost={"total": "1.25"})
    row.update(run)
    return RunRecord(run=RunRow(**row))


def test_a_finished_run_is_posted_as_json_with_a_slack_text(hook):
    [event] = events_of(_record())
    assert post(hook.url, event, backoff=0) is None
    [body] = hook.bodies
    assert body["kind"] == "succeeded" and body["run_id"] == "r1" and body["status"] == "succeeded"
    assert body["verdict"] == "verified" and body["cost"] == "1.25" and body["cluster"] == "c1"
    assert body["text"].startswith("gpucluster run r1 on local (cluster c1) succeeded") and "$1.25" in body["text"]
    assert "gpucluster show r1" in body["text"]
    assert hook.headers[0]["Content-Type"] == "application/json"


def test_a_run_that_left_something_gives_its_end_and_a_not_verified_event():
    events = events_of(_record(status="failed", exit_code=3, teardown="leftovers", failure="rank 1 exited 1"))
    assert [e.kind for e in events] == ["failed", "not_verified"]
    assert "FAILED; rank 1 exited 1; teardown: leftovers" in events[0].text
    assert [e.kind for e in events_of(_record(teardown="kept"))] == ["succeeded"]
    assert [e.kind for e in events_of(_record(status="interrupted", teardown="not verified"))] == \
        ["interrupted", "not_verified"]
    [stopped] = events_of(_record(status="stopped", exit_code=4, failure="stopped at its --max-cost"))
    assert stopped.kind == "stopped" and "was stopped at its cost cap" in stopped.text


def test_a_failing_webhook_is_retried_twice_then_logged_never_raised(caplog):
    hook = Hook(answers=[500, 502, 503, 200])
    try:
        [event] = events_of(_record())
        with caplog.at_level(logging.WARNING, logger="gpucluster.lifecycle.notify"):
            why = post(hook.url, event, backoff=0)
        assert len(hook.bodies) == 3  # the first try and two retries, no fourth
        assert why is not None and "HTTP 503" in why and "after 3 tries" in why
        assert why in caplog.text
        hook.answers = [500, 200]
        assert post(hook.url, event, backoff=0) is None and len(hook.bodies) == 5  # a retry that succeeds
    finally:
        hook.close()


def test_an_unreachable_webhook_and_a_raising_callback_are_said_not_raised(hook):
    closed = Hook()
    closed.close()  # nothing listens on its port now
    seen: list[RunEvent] = []

    def callback(event):
        seen.append(event)
        raise RuntimeError("the notebook's bug")

    failed = deliver(events_of(_record()), [closed.url, hook.url], callback, backoff=0, timeout=2)
    assert [e.kind for e in seen] == ["succeeded"]
    assert len(hook.bodies) == 1  # the working webhook still got it
    assert any("on_event callback raised" in f for f in failed)
    assert any(closed.url in f and "not delivered" in f for f in failed)


def test_webhook_urls_are_checked_for_form():
    assert check_urls(["https://hooks.slack.com/services/x", "http://127.0.0.1:8/h"]) == \
        ("https://hooks.slack.com/services/x", "http://127.0.0.1:8/h")
    for bad in ("hooks.slack.com/x", "ftp://host/x", "https://", "file:///etc/passwd"):
        with pytest.raises(UsageError, match="--notify"):
            check_urls([bad])


def test_notify_in_the_config_file_is_a_url_or_a_list(tmp_path, monkeypatch):
    from gpucluster.api.jobs import all_webhooks
    from gpucluster.errors import ConfigError
    from gpucluster.plan.userconfig import load_config

    cfg = tmp_path / "config.yaml"
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(cfg))
    cfg.write_text("notify: https://a.example/h\n")
    assert load_config(cfg).notify == ["https://a.example/h"]
    cfg.write_text("cloud: local\nnotify:\n  - https://a.example/h\n  - http://b.example/h\n")
    assert load_config(cfg).notify == ["https://a.example/h", "http://b.example/h"]
    # the given ones first, then the file's, each once
    assert all_webhooks(["http://b.example/h", "http://c.example/h"]) == \
        ("http://b.example/h", "http://c.example/h", "https://a.example/h")
    cfg.write_text("notify:\n  - {url: x}\n")
    with pytest.raises(ConfigError, match="notify: a string is needed"):
        load_config(cfg)
    cfg.write_text("notify: not-a-url\n")
    with pytest.raises(UsageError, match="--notify 'not-a-url'"):
        all_webhooks(())


def test_a_recovered_chain_tells_each_lost_attempt_then_how_it_ended():
    from gpucluster.lifecycle.notify import chain_events

    records = {"a1": _record(id="a1", status="failed", exit_code=1, failure="node 1 lost (spot interruption)"),
               "a2": _record(id="a2", status="succeeded", teardown="leftovers")}

    class Ledger:
        def get_run(self, run_id):
            return records.get(run_id)

    events = chain_events(Ledger(), ["a1", "a2"], [True, False])
    assert [(e.kind, e.run_id) for e in events] == [("recovered", "a1"), ("succeeded", "a2"), ("not_verified", "a2")]
    assert "lost a node and was recovered; node 1 lost (spot interruption)" in events[0].text


def test_the_cost_warning_and_a_recovery_are_told_as_they_happen_and_once():
    """notify.LiveEvents wraps the run's UI: the guard's `cost_warning` record and recovery.py's
    `attempt` record with `recovering` are told at once, from a thread (a slow webhook never holds
    the job), each once; every record still reaches the wrapped UI."""
    import threading

    from gpucluster.lifecycle.notify import LiveEvents

    records = {"r1": _record(id="r1", status="running")}
    shown, told, arrived = [], [], threading.Event()

    class UI:
        def metric(self, node, record):
            shown.append(record["kind"])

        def message(self, text):
            shown.append(text)

    class Ledger:
        def get_run(self, run_id):
            return records.get(run_id)

    def on_event(event):
        told.append(event)
        arrived.set()

    live = LiveEvents(UI(), Ledger(), [], on_event)
    live.metric(None, {"kind": "cost_warning", "run_id": "r1", "accrued": 8.2, "cap": 10.0})
    assert arrived.wait(5)  # before the run ends (close)
    live.metric(None, {"kind": "cost_warning", "run_id": "r1", "accrued": 8.9, "cap": 10.0})  # said once
    live.metric(0, {"kind": "epoch", "loss": 0.1})
    live.metric(None, {"kind": "attempt", "run_id": "r1", "interruption": None})  # not recovering: nothing told
    live.metric(None, {"kind": "attempt", "run_id": "r1", "recovering": True, "interruption": "node 1 lost"})
    live.message("hello")  # the rest goes to the wrapped UI (lifecycle.RunUI)
    assert live.close() == []
    assert [(e.kind, e.cost, e.status) for e in told] == [("cost_warning", "8.2", "running"),
                                                         ("recovered", "1.25", "running")]
    assert "80% of its cost cap" in told[0].text
    assert shown == ["cost_warning", "cost_warning", "epoch", "attempt", "attempt", "hello"]
    assert live.sent == {("cost_warning", "r1"), ("recovered", "r1")}
