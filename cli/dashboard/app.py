"""The dashboard's web app (Starlette): pages at `/`, `/runs/RUN_ID`, `/clusters`, `/costs`; JSON at
`/api/runs` and `/api/runs/RUN_ID`; a run's node logs as server-sent events at
`/api/runs/RUN_ID/logs`. Every route needs the token (`TokenGate`). The HTML is rendered from the
templates in data/ (Jinja2, escaped); the charts are SVG drawn here (svg.py).

Each request opens the ledger afresh (a reader sees what the runs wrote since), on a worker thread."""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Concatenate, ParamSpec, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gpucluster.cli.dashboard import svg, views
from gpucluster.errors import GpuclusterError, UsageError
from gpucluster.states import RunStatus

if TYPE_CHECKING:
    from jinja2 import Environment
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from gpucluster.ledger.store import Ledger
    from gpucluster.states import JsonObject

DATA = Path(__file__).resolve().parent / "data"


class TokenGate:
    """ASGI middleware: a request is served only with the token, as the `token` query parameter
    (then kept in a cookie for this port) or that cookie. None given: 401; a wrong one: 403."""

    def __init__(self, app: ASGIApp, token: str, cookie: str):
        self.app, self.token, self.cookie = app, token, cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        held = request.cookies.get(self.cookie)
        shown = given if given is not None else held
        if shown is None:
            await PlainTextResponse("401: this dashboard needs its token: open the URL `gpucluster dashboard` "
                                    "printed (it ends in ?token=...)\n", status_code=401)(scope, receive, send)
            return
        if not hmac.compare_digest(shown.encode(), self.token.encode()):
            await PlainTextResponse("403: wrong token: open the URL `gpucluster dashboard` printed\n",
                                    status_code=403)(scope, receive, send)
            return
        if given is None or given == held:
            await self.app(scope, receive, send)
            return

        async def with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())]}
            await send(message)

        await self.app(scope, receive, with_cookie)


def _templates() -> Environment:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(str(DATA)), autoescape=select_autoescape(["html"]))
    env.filters["money"] = views.money
    return env


def _ledger() -> Ledger:
    from gpucluster.ledger.store import Ledger

    return Ledger.open_default()


P = ParamSpec("P")
R = TypeVar("R")


def _reading(fn: Callable[Concatenate[Ledger, P], R]) -> Callable[P, R]:
    """Run `fn(ledger, ...)` with a ledger opened for this request, closed after."""
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        ledger = _ledger()
        try:
            return fn(ledger, *args, **kwargs)
        finally:
            ledger.close()

    return call


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and value not in allowed:
        from gpucluster.errors import not_allowed

        raise UsageError(not_allowed(name, value, allowed))
    return value


class Dashboard:
    """The pages and their state: the token, whether actions are allowed, the `down`s started here."""

    def __init__(self, token: str, *, allow_actions: bool = False):
        self.token, self.allow_actions = token, allow_actions
        self.env = _templates()
        self.downs: dict[str, JsonObject] = {}  # cluster -> {state, lines, verdict, error}
        self.lock = threading.Lock()

    def page(self, name: str, **context: object) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(allow_actions=self.allow_actions, **context))

    # -- the runs ---------------------------------------------------------------------------------
    def runs_page(self, request: Request) -> Response:
        from gpucluster.infra.registry import NAMES

        status = _choice(request, "status", views.RUN_STATUSES)
        cloud = _choice(request, "cloud", NAMES)
        q = request.query_params.get("q") or ""
        rows = _reading(views.runs_view)(cloud=cloud, status=status, q=q)
        context = dict(rows=[views.run_cells(r) for r in rows], status=status or "", cloud=cloud or "", q=q,
                       statuses=views.RUN_STATUSES, clouds=NAMES, query=request.url.query)
        if request.query_params.get("fragment"):
            return self.page("runs_table.html", **context)
        return self.page("runs.html", title="runs", nav="runs", **context)

    def api_runs(self, request: Request) -> Response:
        from gpucluster.infra.registry import NAMES

        limit = request.query_params.get("limit") or "200"
        if not limit.isdigit() or int(limit) < 1:
            raise UsageError(f"limit {limit!r} is not allowed: an integer of 1 or more")
        rows = _reading(views.runs_view)(limit=int(limit), cloud=_choice(request, "cloud", NAMES),
                                         status=_choice(request, "status", views.RUN_STATUSES),
                                         q=request.query_params.get("q"))
        return JSONResponse(json.loads(json.dumps(rows, default=str)))

    def api_run(self, request: Request) -> Response:
        def read(ledger: Ledger) -> JsonObject:
            record = views.run_view(ledger, request.path_params["run_id"])
            return {**record.to_dict(), "live": views.is_live(record), "cost_now": views.run_cost_now(record)}

        return JSONResponse(json.loads(json.dumps(_reading(read)(), default=str)))

    def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        context = _reading(self._run_context)(run_id)
        if request.query_params.get("fragment"):
            return self.page("run_live.html", **context)
        return self.page("run.html", title=f"run {context['run'].id}", nav="runs", **context)

    @staticmethod
    def _run_context(ledger: Ledger, run_id: str) -> JsonObject:
        from gpucluster.cli.render import fmt_secs, fmt_time

        now = time.time()
        record = views.run_view(ledger, run_id)
        run = record.run
        t0 = float(run.created_at or now)
        recs = record.metric_records or []
        gpu, cpu = views.util_series(recs, t0)
        charts = [
            svg.line_chart("loss", views.series(recs, "loss", t0), ylabel="loss", chart_id="loss"),
            svg.line_chart("accuracy", views.series(recs, "accuracy", t0), ylabel="accuracy", chart_id="accuracy"),
            svg.line_chart("samples per second", views.series(recs, "samples_per_s", t0), ylabel="samples/s",
                           chart_id="samples"),
            svg.line_chart("GPU utilisation (%)", gpu, ylabel="%", chart_id="gpu"),
            svg.line_chart("CPU busy (%)", cpu, ylabel="%", chart_id="cpu"),
        ]
        phases = [(p.name, p.started_at, p.ended_at, p.status) for p in record.phases]
        live = views.is_live(record)
        orphaned = run.status == RunStatus.RUNNING and not live
        outputs = {o.node_rank: o for o in record.outputs}
        nodes = [{"rank": n.node_rank, "host": n.host or "-", "exit_code": "-" if n.exit_code is None else n.exit_code,
                  "output": outputs.get(n.node_rank)} for n in record.nodes]
        cost = views.run_cost_now(record, now)
        return dict(run=run, record=record, live=live, orphaned=orphaned, nodes=nodes, charts=charts,
                    timeline=svg.timeline(phases, start=t0, now=now), cost=cost,
                    cost_lines=[ln for ln in (cost or {}).get("lines") or [] if ln.get("category") != "no charge"],
                    started=fmt_time(run.created_at), wall=fmt_secs(run.wall_s if run.ended_at else now - t0),
                    gpu=views.gpu_label(run), metrics=run.metrics or {}, attempts=record.attempts or [],
                    node_ranks=list(range(run.nodes or 0)) or [n["rank"] for n in nodes],
                    command=" ".join(run.command or []))

    async def logs_stream(self, request: Request) -> Response:
        """The run's node logs as server-sent events: what is there, then each line as it is written
        while the run is live; `event: end` once it is over. Metric lines are summarised, the
        supervisor's records hidden (as `gpucluster logs` shows them)."""
        from gpucluster.api.records import reader
        from gpucluster.cli.logs import LineView

        run_id = request.path_params["run_id"]
        read = await run_in_threadpool(lambda: reader(run_id, ledger=_ledger()))
        view = LineView(raw=False, metrics=False, prefix=False)

        def batch_of(lines: list) -> str:
            shown = ((ln.node, view.show(f"node-{ln.node}", ln.text)) for ln in lines)
            return "".join(f"event: line\ndata: {json.dumps({'node': node, 'text': text})}\n\n"
                           for node, text in shown if text is not None)

        async def events() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n\n"
                beat = time.monotonic()
                while True:
                    batch = await run_in_threadpool(read.read, whole_lines=True)
                    if batch:
                        yield batch_of(batch)
                        continue
                    over, _ = await run_in_threadpool(read.ended)
                    if over:
                        yield batch_of(await run_in_threadpool(read.read, whole_lines=False))
                        yield "event: end\ndata: {}\n\n"
                        return
                    if time.monotonic() - beat > 15:  # a comment: keeps proxies and the browser's connection open
                        beat = time.monotonic()
                        yield ": alive\n\n"
                    await asyncio.sleep(0.4)
            finally:
                read.ledger.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- clusters and costs -----------------------------------------------------------------------
    def clusters_page(self, request: Request) -> Response:
        now = time.time()
        rows = _reading(views.clusters_view)(now)
        with self.lock:
            downs = {k: dict(v) for k, v in self.downs.items()}
        context = dict(rows=rows, now=now, downs=downs, token=self.token)
        if request.query_params.get("fragment"):
            return self.page("clusters_table.html", **context)
        return self.page("clusters.html", title="clusters", nav="clusters", **context)

    def api_clusters(self, request: Request) -> Response:
        return JSONResponse(json.loads(json.dumps(_reading(views.clusters_view)(), default=str)))

    async def down(self, request: Request) -> Response:
        """POST: `gpucluster down CLUSTER` (the same `gpucluster.down`), on a thread; only with --allow-actions."""
        if not self.allow_actions:
            return PlainTextResponse("403: this dashboard is read-only: start it with --allow-actions to take "
                                     "clusters down from it\n", status_code=403)
        from urllib.parse import parse_qs

        form = parse_qs((await request.body()).decode("utf-8", "replace"))  # the form's one field, urlencoded
        if not hmac.compare_digest(((form.get("token") or [""])[0]).encode(), self.token.encode()):
            return PlainTextResponse("403: the form carries no or a wrong token\n", status_code=403)
        name = request.path_params["name"]
        with self.lock:
            if (self.downs.get(name) or {}).get("state") == "running":
                return RedirectResponse("/clusters", status_code=303)
            self.downs[name] = {"state": "running", "lines": [], "verdict": None, "error": None}
        threading.Thread(target=self._take_down, args=(name,), name=f"dashboard-down-{name}", daemon=True).start()
        return RedirectResponse("/clusters", status_code=303)

    def _take_down(self, name: str) -> None:
        from gpucluster.api.records import down

        said: list[str] = []

        def say(text: str) -> None:
            with self.lock:
                said.append(str(text))
                self.downs[name]["lines"] = list(said[-20:])

        result: JsonObject = {}
        try:
            downed = _reading(lambda ledger: down(name, ledger=ledger, say=say))()
            verdict = getattr(downed, "verdict", None)
            result = {"state": "done", "verdict": verdict.get("verdict") if isinstance(verdict, dict) else verdict}
        except GpuclusterError as exc:
            result = {"state": "failed", "error": exc.message}
        except Exception as exc:  # noqa: BLE001 - shown on the page; the server goes on
            result = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
        with self.lock:
            self.downs[name].update(result)

    def costs_page(self, request: Request) -> Response:
        data = _reading(views.costs_view)()
        by_day = {day: {c: float(v) for c, v in parts.items()} for day, parts in data["by_day"].items()}
        charts = [svg.stacked_bars("spend by day (USD), by cloud", by_day, chart_id="by-day"),
                  svg.stacked_bars("spend by cloud (USD)", {c: {c: float(v)} for c, v in data["by_cloud"].items()},
                                   width=460, chart_id="by-cloud"),
                  svg.stacked_bars("spend by cluster (USD), the 12 largest",
                                   {n: {"cost": float(v)} for n, v in list(data["by_cluster"].items())[:12] if v > 0},
                                   width=460, chart_id="by-cluster")]
        return self.page("costs.html", title="costs", nav="costs", charts=charts, rep=data["report"],
                         by_cluster=data["by_cluster"])


def build(token: str, *, allow_actions: bool = False) -> TokenGate:
    """The ASGI app: the routes behind the token gate."""
    d = Dashboard(token, allow_actions=allow_actions)

    async def threaded(fn: Callable[[Request], Response], request: Request) -> Response:
        try:
            return await run_in_threadpool(fn, request)
        except UsageError as exc:  # an unknown run, a bad filter: one line
            code = 404 if "not in the ledger" in exc.message else 400
            return PlainTextResponse(f"{code}: {exc.message}\n", status_code=code)
        except GpuclusterError as exc:
            return PlainTextResponse(f"500: {exc.message}\n", status_code=500)

    def sync(fn: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await threaded(fn, request)
        return endpoint

    async def logs(request: Request) -> Response:
        try:
            return await d.logs_stream(request)
        except UsageError as exc:
            return PlainTextResponse(f"404: {exc.message}\n", status_code=404)

    routes = [
        Route("/", sync(d.runs_page)),
        Route("/runs/{run_id}", sync(d.run_page)),
        Route("/clusters", sync(d.clusters_page)),
        Route("/clusters/{name}/down", d.down, methods=["POST"]),
        Route("/costs", sync(d.costs_page)),
        Route("/api/runs", sync(d.api_runs)),
        Route("/api/runs/{run_id}", sync(d.api_run)),
        Route("/api/runs/{run_id}/logs", logs),
        Route("/api/clusters", sync(d.api_clusters)),
        Mount("/static", StaticFiles(directory=str(DATA)), name="static"),  # dashboard.css, dashboard.js
    ]
    app = Starlette(routes=routes)
    app.state.dashboard = d
    return TokenGate(app, token, cookie_name(token))


def cookie_name(token: str) -> str:
    """Cookies are kept per host, not per port: each dashboard's has its own name."""
    return f"gpucluster_dashboard_{hmac.new(token.encode(), b'cookie', 'sha256').hexdigest()[:8]}"
