"""The dashboard's web app (Starlette) and its server (uvicorn): the page and its assets (its plots are its own
SVG: no chart library, no CDN), and a small JSON API the page polls for what changed.

Security: every API request carries the secret token (header `X-Autotune-Token`), so a page from another origin
can read nothing. The URL printed carries no token but a one-time code in its fragment (`#code=...`, never sent
with the page), which the page exchanges for the token (`POST /api/session`): what the browser's history keeps
of it opens nothing. Cancelling is a POST of JSON with the token in its header, refused unless the server was
started with `--allow-cancel`. `guard.Guard` wraps it all: the Host and Origin checked against the names served,
the security headers (no framing), no traceback for a broken request. Files are served only from inside a
sweep's directory (`files.inside`). A malformed request is a 4xx.
"""
from __future__ import annotations

import hmac
import json
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..spec.metrics import metric_named
from ..sweep.cancel import cancel
from ..views.compare import compare
from .discover import Served, Sweeps, check_roots
from .eta import Planner
from .feed import read, runner_pid
from .files import Refused, inside, read_piece
from .guard import Guard
from .listen import Listening
from .readings import of_experiment
from .summary import brief, standing, summary

log = logging.getLogger("autotuner.dashboard")

ASSETS = Path(__file__).parent / "assets"
STATIC = {name: ASSETS / name for name in ("app.js", "app.css", "chart.js", "plots.js")}
TOKEN_HEADER = "x-autotune-token"
CODE_HEADER = "x-autotune-code"
MAX_BODY = 64 * 1024
MAX_NAMES = 10_000
RUNNER_SECONDS = 1.0  # how long a look-up of the sweep's runner is kept


@dataclass
class Dashboard:
    """What one server serves and allows."""

    roots: list[Path]
    allow_cancel: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    code: str = field(default_factory=lambda: secrets.token_urlsafe(24))  # the one-time code of the URL printed
    on_sign_in: Callable[[str], None] = lambda code: None  # told the next code when one is spent
    sweeps: Sweeps = field(init=False)
    planner: Planner = field(init=False, default_factory=Planner)
    _summaries: dict[str, tuple[tuple[int, JSON, str], JSONObject]] = field(init=False, default_factory=dict)
    _standing: dict[str, tuple[int, JSONObject]] = field(init=False, default_factory=dict)
    _runners: dict[Path, tuple[float, int | None]] = field(init=False, default_factory=dict)
    _signing: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.sweeps = Sweeps(self.roots)

    def summary_of(self, served: Served) -> tuple[str, JSONObject]:
        """The sweep's summary and its version: a new one only when the ledger, the runner or the plan moved.
        What the ledger says is worked out once per transition; the runner is looked up at most every second."""
        feed = served.feed
        feed.refresh()
        snap = feed.snapshot()
        seq = feed.seq
        kept = self._standing.get(served.id)
        if kept is None or kept[0] != seq:
            self._standing[served.id] = kept = (seq, {**standing(snap, served.id, served.root),
                                                      "training": feed.training(), "gpu_hours": feed.gpu_hours()})
        made = summary(snap, kept[1], seq, self.runner_of(feed.directory), self.planner)
        key = (seq, made["runner"], json.dumps(made["eta"]))
        last = self._summaries.get(served.id)
        if last is None or last[0] != key:
            self._summaries[served.id] = last = (key, made)
        return f"{seq}.{abs(hash(key)) % 10**9}", last[1]

    def sign_in(self, code: str) -> bool:
        """Whether `code` is the current one-time code: if so it is spent, and the next one announced."""
        with self._signing:
            if not hmac.compare_digest(code.encode(), self.code.encode()):
                return False
            self.code = secrets.token_urlsafe(24)
            self.on_sign_in(self.code)
            return True

    def runner_of(self, directory: Path) -> int | None:
        """`runner_pid`, kept for a second: the kernel's lock table can be long on a busy machine."""
        now = time.monotonic()
        kept = self._runners.get(directory)
        if kept is None or now - kept[0] > RUNNER_SECONDS:
            self._runners[directory] = kept = (now, runner_pid(directory))
        return kept[1]


def _authorized(request: Request, dashboard: Dashboard) -> None:
    given = request.headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(given.encode(), dashboard.token.encode()):
        raise Refused(403, "the token printed with the dashboard's URL is needed (open that URL)")


def _int(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise Refused(400, f"{name} must be a whole number") from None


def _sweep(request: Request, dashboard: Dashboard, key: str | None = None) -> Served:
    sid = key if key is not None else str(request.path_params["sweep"])
    served = dashboard.sweeps.get(sid)
    if served is None:
        raise Refused(404, f"no sweep {sid[:40]!r} is served here")
    return served


def api(handler: Callable[[Request, Dashboard], Response]) -> Callable[[Request], Response]:
    """A JSON endpoint: the token checked first; refusals and bad sweeps become 4xx answers, never a crash."""
    def endpoint(request: Request) -> Response:
        dashboard: Dashboard = request.app.state.dashboard
        started = time.perf_counter()
        try:
            _authorized(request, dashboard)
            response = handler(request, dashboard)
        except Refused as e:
            response = JSONResponse({"error": str(e)}, status_code=e.status)
        except UserError as e:
            response = JSONResponse({"error": str(e)}, status_code=409)
        response.headers["Cache-Control"] = "no-store"
        # What the server spent on it, before compression (benchmarks/dashboard.py reads it).
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
        return response
    return endpoint


# --- the API -------------------------------------------------------------------------------------------------
def config(request: Request, dashboard: Dashboard) -> Response:
    return JSONResponse({"version": __version__, "allow_cancel": dashboard.allow_cancel,
                         "roots": [str(r) for r in dashboard.roots]})


def sweeps(request: Request, dashboard: Dashboard) -> Response:
    listed = []
    for served in dashboard.sweeps.scan():
        try:
            listed.append(brief(dashboard.summary_of(served)[1]))
        except UserError as e:  # one unreadable sweep is listed as such; the others are shown
            listed.append({"id": served.id, "name": served.feed.directory.name, "error": str(e)})
    return JSONResponse({"sweeps": listed})


def sweep(request: Request, dashboard: Dashboard) -> Response:
    """What changed since transition `since` (everything when -1) and readings `p` (the running rows whose steps so
    far moved: readings.py), and the summary when its version moved."""
    served = _sweep(request, dashboard)
    since = _int(request, "since", -1)
    version, made = dashboard.summary_of(served)
    changes = served.feed.changes(since, request.query_params.get("p"))
    body: JSONObject = {"seq": changes.seq, "full": changes.full, "rows": changes.rows, "sv": version,
                        "p": changes.mark}
    if changes.full:
        body["columns"] = changes.columns
        body["axes"] = served.feed.axes
    if request.query_params.get("sv") != version:
        body["summary"] = made
    return JSONResponse(body)


def experiment(request: Request, dashboard: Dashboard) -> Response:
    """One experiment: its spec and every attempt, each with what its steps said (`measured`: readings.py; live
    while it runs), the sweep's metric, and its runner's pid (None: no runner follows it, so a run recorded running
    is read by nobody until a resume), for its own page."""
    served = _sweep(request, dashboard)
    name = str(request.path_params["name"])
    found, attempts, meta, measured = read(served.feed.directory, lambda reader: (
        reader.ledger.experiments([name]), reader.ledger.attempts(name), reader.ledger.meta(),
        of_experiment(reader.db, reader.ledger.version(), name)))
    if not found:
        raise Refused(404, "no such experiment in this sweep")
    where = _run_directory(served.feed.directory, attempts[-1].dir if attempts else None, name)
    return JSONResponse({"sweep": meta.name, "metric": metric_named(meta.metric).name, "spec": found[0].to_json(),
                         "runner": dashboard.runner_of(served.feed.directory),
                         "attempts": [a.to_json() | {"measured": measured.get(a.attempt)} for a in attempts],
                         "logs": {k: f"{where}/{k}.log" for k in ("stdout", "stderr")}})


def _run_directory(sweep_dir: Path, recorded: str | None, name: str) -> str:
    """Where the latest attempt's files are, relative to the sweep (as recorded; the experiment's name else)."""
    if recorded:
        try:
            return Path(recorded).resolve().relative_to(sweep_dir.resolve()).as_posix()
        except ValueError:
            pass
    return name


def file(request: Request, dashboard: Dashboard) -> Response:
    """A piece of a file inside the sweep, from `offset` (negative: its end): a log followed as it grows."""
    served = _sweep(request, dashboard)
    path = inside(served.feed.directory, request.query_params.get("path", ""))
    piece = read_piece(path, _int(request, "offset", 0))
    return Response(piece.data, media_type="text/plain; charset=utf-8",
                    headers={"X-Offset": str(piece.offset), "X-Next": str(piece.next), "X-Size": str(piece.size),
                             "Cache-Control": "no-store"})


def comparison(request: Request, dashboard: Dashboard) -> Response:
    """Two sweeps side by side, paired by experiment (`autotune compare`'s pairs)."""
    a = _sweep(request, dashboard, request.query_params.get("a", ""))
    b = _sweep(request, dashboard, request.query_params.get("b", ""))
    for served in (a, b):
        served.feed.refresh()
    c = compare(a.feed.snapshot(), b.feed.snapshot(), (a.feed.experiment_hours(), b.feed.experiment_hours()))
    ratio = c.geomean_ratio()
    rows = [{k: (str(v) if k.endswith(("_state", "_reason")) and v is not None else v) for k, v in r.items()}
            | {"verdict": c.verdict(r["ratio"])} for r in c.rows]
    return JSONResponse({"metric": c.metric, "minimize": c.minimize, "rows": rows, "only_a": c.only_a,
                         "only_b": c.only_b, "geomean_ratio": ratio, "verdict": c.verdict(ratio),
                         "a": a.feed.snapshot().name, "b": b.feed.snapshot().name,
                         "gpu_hours": {"a": c.hours_a.line(), "b": c.hours_b.line()}})


def cancel_runs(request: Request, dashboard: Dashboard) -> Response:
    """Cancel experiments (or the whole sweep: no names) through `autotuner.cancel`, as `autotune cancel` does.
    A foreign Origin never gets here (`Guard`)."""
    if not dashboard.allow_cancel:
        raise Refused(403, "cancelling from the page is off: start the dashboard with --allow-cancel")
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Refused(415, "send JSON: {\"names\": [...]}")
    served = _sweep(request, dashboard)
    names = _names(request.state.body)
    done = cancel(served.feed.directory, names)
    return JSONResponse(done.to_json())


def _names(body: bytes) -> list[str]:
    try:
        data = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise Refused(400, "the body is not JSON") from None
    names = data.get("names", []) if isinstance(data, dict) else None
    if not isinstance(names, list) or len(names) > MAX_NAMES or not all(isinstance(n, str) and n for n in names):
        raise Refused(400, "names must be a list of experiment names (empty: the whole sweep)")
    return names


async def cancel_endpoint(request: Request) -> Response:
    """The body is read here (bounded), then the cancel runs on a worker thread: it may wait on the ledger."""
    from starlette.concurrency import run_in_threadpool

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:  # refused before waiting for a body it would not read
        return JSONResponse({"error": "the body is too large"}, status_code=413)
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return JSONResponse({"error": "the body is too large"}, status_code=413)
    except ClientDisconnect:  # a body shorter than its Content-Length, broken chunks: nobody left to answer
        return JSONResponse({"error": "the request broke off"}, status_code=400)
    request.state.body = body
    return await run_in_threadpool(api(cancel_runs), request)


def session(request: Request) -> Response:
    """The one-time code of a printed URL exchanged for the token (the page keeps it for its tab). Spent once,
    so the link the browser's history keeps opens nothing; the terminal prints the next one."""
    dashboard: Dashboard = request.app.state.dashboard
    if not dashboard.sign_in(request.headers.get(CODE_HEADER, "")):
        return JSONResponse({"error": "this link was used already, or is not this dashboard's (a link opens it "
                             "once): open the link its terminal printed last"}, status_code=403,
                            headers={"Cache-Control": "no-store"})
    return JSONResponse({"token": dashboard.token}, headers={"Cache-Control": "no-store"})


# --- the page ------------------------------------------------------------------------------------------------
def index(request: Request) -> Response:
    return FileResponse(ASSETS / "index.html", headers={"Cache-Control": "no-store"})


def static(request: Request) -> Response:
    path = STATIC.get(str(request.path_params["name"]))
    if path is None:
        return JSONResponse({"error": "no such asset"}, status_code=404)
    return FileResponse(path, headers={"Cache-Control": "max-age=3600"})


def create_app(dashboard: Dashboard) -> Starlette:
    routes = [
        Route("/", index),
        Route("/static/{name}", static),
        Route("/api/session", session, methods=["POST"]),
        Route("/api/config", api(config)),
        Route("/api/sweeps", api(sweeps)),
        Route("/api/compare", api(comparison)),
        Route("/api/sweeps/{sweep}", api(sweep)),
        Route("/api/sweeps/{sweep}/file", api(file)),
        Route("/api/sweeps/{sweep}/experiments/{name}", api(experiment)),
        Route("/api/sweeps/{sweep}/cancel", cancel_endpoint, methods=["POST"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=1024, compresslevel=5)])
    app.state.dashboard = dashboard
    return app


# --- serving -------------------------------------------------------------------------------------------------
def url(host: str, port: int, code: str) -> str:
    """The link to open: its one-time code in the fragment, which the browser never sends to the server."""
    return f"http://{host}:{port}/#code={code}"


class _Relay(logging.Handler):
    """uvicorn's own log lines into the dashboard's (`autotune: ...`, one line each): what a malformed request
    makes it say only with --verbose, since anyone who reaches the port could fill the terminal with it."""

    NOISE = ("Invalid HTTP request received", "Unsupported upgrade request", "No supported WebSocket library")

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        log.log(logging.DEBUG if text.startswith(self.NOISE) else record.levelno, "%s", text.strip(),
                exc_info=record.exc_info)


def server_for(app: Starlette, listening: Listening) -> uvicorn.Server:
    """uvicorn serving the app behind its guard: no WebSocket, no proxy headers trusted (nothing stands between
    the browser and this server), its log relayed."""
    relay = logging.getLogger("uvicorn")
    relay.handlers, relay.propagate = [_Relay()], False
    return uvicorn.Server(uvicorn.Config(Guard(app, listening), log_level="warning", access_log=False,
                                         lifespan="off", ws="none", proxy_headers=False, server_header=False,
                                         log_config=None))


def serve(directories: Sequence[Path], listening: Listening, *, allow_cancel: bool = False,
          announce: Callable[[str], None] = lambda line: None, token: str | None = None) -> None:
    """Serve the sweeps under `directories` on the sockets bound (`listen.listen`; closed here) until interrupted;
    `announce` is told the URL to open (with a one-time code; the next one each time one is spent) and, when
    not on loopback, what that exposes."""
    try:
        dashboard = Dashboard(check_roots(directories), allow_cancel=allow_cancel)
        if token is not None:
            dashboard.token = token
        shown = listening.shown
        dashboard.on_sign_in = lambda code: announce(f"open {url(shown, listening.port, code)} in another browser "
                                                     "(the link before it was used)")
        # A cancel from the page with no runner alive holds the sweep's lock for a moment; `autotune cancel` run
        # meanwhile signals the holder (SIGUSR1), whose default action would end this server.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        server = server_for(create_app(dashboard), listening)
        announce(f"serving {len(dashboard.sweeps.scan())} sweep(s) under {', '.join(map(str, dashboard.roots))}")
        if listening.exposed:
            announce(f"listening on {listening.host}: anyone who can reach this machine's port {listening.port} and "
                     "has the link can read these sweeps" + (" and cancel their runs" if allow_cancel else "") +
                     "; the traffic is plain HTTP")
        announce(f"open {url(shown, listening.port, dashboard.code)} (the link opens the dashboard once)")
        try:
            server.run(sockets=list(listening.sockets))
        finally:
            dashboard.planner.close()
    finally:
        listening.close()
