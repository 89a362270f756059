"""The dashboard's HTTP server: the page, its live stream, and one write.

Theory of operation
-------------------
A Starlette application served by uvicorn on the caller's event loop:

=============================  ==============================================
``GET /``                      the page (``static/index.html``)
``GET /static/{name}``         its script and style sheet (package data)
``GET /api/snapshot``          every section now (JSON)
``GET /api/events``            server-sent events: ``snapshot`` first, then
                               one ``update`` per changed section
``POST /api/audit/answer``     ``{"id", "text"}``: answer an escalation
                               (the ``audit.answer`` command)
``GET /api/health``            the dashboard's own counters
=============================  ==============================================

Nothing is fetched at run time: the page, its script (no framework, no
build step) and its charts (drawn as SVG by that script) are files of the
package.

**Who may ask.** Bound to a loopback address, the dashboard answers the
local machine without a token, but only requests naming a loopback host
(``Host: 127.0.0.1:PORT`` or ``localhost``): a web page on another site
that rebinds its DNS name to 127.0.0.1 is refused
(:class:`~hivemesh.faces.dashboard.errors.DashboardForbidden`, 403). Bound
to any other address it needs a token (:class:`DashboardServer` refuses to
start without one), and every request without it -- the page, the script,
the API, the stream -- is refused with 401
(:class:`~hivemesh.faces.dashboard.errors.DashboardUnauthorized`). The token
is accepted as ``Authorization: Bearer TOKEN``, or as ``?token=TOKEN`` on
the page's URL, which sets an HttpOnly, same-site cookie and redirects to
the bare URL (so the token does not stay in the address bar or the
history). A write (``POST``) must be JSON, and if the browser names its
origin, from the dashboard's own. Every refusal is counted by its code.

**Backpressure.** Each stream reads from its own bounded queue of the
:class:`~hivemesh.faces.dashboard.hub.Hub`; a browser that falls behind is
dropped and counted, and reconnects to a fresh snapshot. A browser that
stops reading altogether is cut off once one write to it has waited
``write_timeout_s`` (counted as ``dashboard_client_stalled``), so it holds
its slot among ``max_clients`` no longer than that. A write's body is read
up to :data:`MAX_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
from collections import Counter
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from hivemesh.commands import AuditAnswer
from hivemesh.errors import ConfigError, HivemeshError, InvalidArgument, PeerBusy
from hivemesh.faces.dashboard.errors import (
    DashboardClientStalled,
    DashboardForbidden,
    DashboardUnauthorized,
)
from hivemesh.faces.dashboard.hub import Hub, Subscriber
from hivemesh.faces.dashboard.live import Live
from hivemesh.faces.dashboard.source import Source
from hivemesh.faces.httpguard import is_loopback
from hivemesh.runtime.supervise import FATAL, Supervisor, TaskFailed

__all__ = ["COOKIE", "MAX_BODY_BYTES", "DashboardServer", "is_loopback"]

log = logging.getLogger("hivemesh.faces.dashboard")

#: The cookie that carries the token after ``/?token=...``.
COOKIE = "hivemesh_dashboard"
#: The largest request body read (an answer is at most 2,000 characters).
MAX_BODY_BYTES = 16 * 1024
#: A comment line on a quiet stream this often, so proxies keep it open.
KEEPALIVE_S = 15.0

_STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
#: The page may load nothing but its own files and talk to nothing but its server.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
        " connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_STATUS_OF = {"unknown_escalation": 404, "invalid_argument": 400, "peer_busy": 503}


def _static(name: str) -> bytes:
    return (resources.files("hivemesh.faces.dashboard") / "static" / name).read_bytes()


def _error(exc: HivemeshError, status: int) -> JSONResponse:
    return JSONResponse({"error": {"code": exc.code, "message": str(exc)}}, status_code=status)


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str, separators=(',', ':'))}\n\n"


class _Guard:
    """ASGI middleware: host, token and origin checks (see module docs)."""

    def __init__(self, app: ASGIApp, server: DashboardServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.server.refusal(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _EventStream:
    """The ASGI response of ``/api/events`` for one subscriber: ``snapshot``,
    then each update, a comment line on a quiet stream. Ends when the
    browser leaves (``http.disconnect``), when the hub drops it as too slow,
    or when one write to it takes longer than ``write_timeout_s`` (a browser
    that stopped reading: counted as ``dashboard_client_stalled``, and the
    connection is closed). Always gives its subscriber back to the hub."""

    def __init__(self, server: DashboardServer, sub: Subscriber) -> None:
        self.server = server
        self.sub = sub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = self.server.hub
        try:
            async with asyncio.TaskGroup() as tg:
                streaming = tg.create_task(self._stream(send))

                async def until_gone() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    streaming.cancel()

                listener = tg.create_task(until_gone())
                streaming.add_done_callback(lambda _t: listener.cancel())
        except* TimeoutError:
            self.server.counters[DashboardClientStalled.code] += 1
            log.info("dashboard: a page stopped reading its stream; closing it")
        finally:
            hub.unsubscribe(self.sub)

    async def _write(self, send: Send, chunk: str, *, more: bool = True) -> None:
        async with asyncio.timeout(self.server.write_timeout_s):
            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": more})

    async def _stream(self, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        async with asyncio.timeout(self.server.write_timeout_s):
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._write(send, "retry: 1000\n\n" + _sse("snapshot", self.server.hub.snapshot()))
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    update = await self.sub.queue.get()
            except TimeoutError:
                await self._write(send, ": keep-alive\n\n")
                continue
            if update is None:  # too slow: dropped (the browser reconnects)
                await self._write(send, _sse("dropped", {"reason": "too slow"}), more=False)
                return
            await self._write(send, _sse("update", update))


class DashboardServer:
    """Serve the dashboard of the node behind ``source`` (see module docs).

    ``token`` is required unless ``host`` is a loopback address. ``port`` 0
    picks a free port (:attr:`url` says which)."""

    def __init__(
        self,
        source: Source,
        *,
        host: str = "127.0.0.1",
        port: int = 7480,
        token: str | None = None,
        queue_max: int = 256,
        max_clients: int = 32,
        write_timeout_s: float = 10.0,
        live_options: dict[str, Any] | None = None,
    ) -> None:
        self.loopback = is_loopback(host)
        if not self.loopback and not token:
            raise ConfigError(f"a dashboard bound to {host} (not loopback) needs a token")
        self.source = source
        self.host = host
        self.port = port
        self.token = token or None
        self.write_timeout_s = write_timeout_s
        self.hub = Hub(queue_max=queue_max, max_clients=max_clients)
        self.live = Live(source, self.hub, **(live_options or {}))
        self.counters: Counter[str] = self.hub.counters
        self.failed = asyncio.Event()
        self.supervisor = Supervisor(self.counters, self._fatal)
        self.app = Starlette(
            routes=[
                Route("/", self._index),
                Route("/static/{name}", self._asset),
                Route("/api/snapshot", self._snapshot),
                Route("/api/events", self._events),
                Route("/api/health", self._health),
                Route("/api/audit/answer", self._answer, methods=["POST"]),
            ]
        )
        self._asgi = _Guard(self.app, self)
        self._server: Any = None
        self._sock: socket.socket | None = None

    # -- life ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The page's address (without the token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        """Bind, start serving and start the live loops."""
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.create_server((self.host, self.port), family=family)
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            self._asgi,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        sock = self._sock
        self.supervisor.spawn("dashboard_http", lambda: self._server.serve([sock]), FATAL)
        self.live.start(self.supervisor)
        async with asyncio.timeout(10):
            while not self._server.started:
                if self.failed.is_set():
                    raise ConfigError("the dashboard's HTTP server failed to start")
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Stop serving and stop the loops."""
        self.supervisor.closing()
        if self._server is not None:
            self._server.should_exit = True
        await self.supervisor.close(timeout_s=5.0)
        if self._sock is not None:
            self._sock.close()

    async def __aenter__(self) -> DashboardServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _fatal(self, exc: TaskFailed) -> None:
        log.error("dashboard: %s", exc)
        self.failed.set()

    # -- who may ask ---------------------------------------------------------------

    def refusal(self, request: Request) -> Response | None:
        """The response refusing ``request``, or None to let it through."""
        if self.loopback:
            host = (request.url.hostname or "").strip("[]")
            if host not in _LOOPBACK_NAMES:
                return self._refuse(DashboardForbidden(f"host {host!r:.60} is not this dashboard"))
        if self.token is not None and not self._has_token(request):
            resp = self._refuse(DashboardUnauthorized("this dashboard needs its token"))
            resp.headers["WWW-Authenticate"] = 'Bearer realm="hivemesh"'
            return resp
        if request.method not in ("GET", "HEAD"):
            ctype = request.headers.get("content-type", "").split(";")[0].strip()
            origin = request.headers.get("origin")
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if ctype != "application/json" or (origin is not None and origin != own):
                return self._refuse(DashboardForbidden("writes must be JSON from this page"))
        return None

    def _refuse(self, exc: HivemeshError) -> JSONResponse:
        self.counters[exc.code] += 1
        return _error(exc, 401 if isinstance(exc, DashboardUnauthorized) else 403)

    def _has_token(self, request: Request) -> bool:
        assert self.token is not None
        auth = request.headers.get("authorization", "")
        offered = [
            auth[7:].strip() if auth.lower().startswith("bearer ") else "",
            request.cookies.get(COOKIE, ""),
            request.query_params.get("token", "") if request.url.path == "/" else "",
        ]
        want = self.token.encode()
        return any(o and hmac.compare_digest(o.encode(), want) for o in offered)

    # -- routes --------------------------------------------------------------------

    async def _index(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token and self.token is not None:  # checked by the guard: keep it in a cookie
            resp = RedirectResponse("/", status_code=303)
            resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            return resp
        return Response(
            _static("index.html"), media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS
        )

    async def _asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return JSONResponse({"error": {"code": "not_found", "message": name}}, 404)
        return Response(_static(name), media_type=_STATIC[name])

    async def _snapshot(self, request: Request) -> Response:
        return JSONResponse(self.hub.snapshot())

    async def _health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "clients": self.hub.clients,
                "events_seen": self.live.events_seen,
                "counters": dict(self.counters),
                "tasks": self.supervisor.statistics(),
            }
        )

    async def _events(self, request: Request) -> Response:
        try:
            sub = self.hub.subscribe()
        except PeerBusy as exc:
            return _error(exc, 503)
        return _EventStream(self, sub)  # type: ignore[return-value]

    async def _answer(self, request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return _error(InvalidArgument("the request body is too large"), 413)
        try:
            args = json.loads(body or b"null")
            request_ = AuditAnswer.from_wire(args)
        except ValueError as exc:  # InvalidArgument is a ValueError too
            err = exc if isinstance(exc, InvalidArgument) else InvalidArgument("not JSON")
            return _error(err, 400)
        try:
            reply = await self.source.run(request_)
        except HivemeshError as exc:
            return _error(exc, _STATUS_OF.get(exc.code, 502))
        finally:
            self.live.mark_stale("audit")
        return JSONResponse(reply.to_wire())
