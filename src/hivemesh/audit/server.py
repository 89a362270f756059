"""The fixture's HTTP server: the shops, their routes, and the market database.

Theory of operation
-------------------
One asyncio HTTP/1.1 server (keep-alive, ``Content-Length`` bodies only) on
127.0.0.1 serves the :class:`~hivemesh.audit.world.World` on several ports:
the **origin** (route ``direct``) and one **proxy** per other route
(``proxy-1`` ...). A proxy port behaves as an HTTP forward proxy for the
fixture's own shops only: a client configured with ``proxy=<route url>``
sends absolute-form requests (``GET http://127.0.0.1:<origin>/shop-07/``) and
the fixture answers them as seen from that route. It forwards nothing
anywhere else (502): the fixture never touches the internet.

Per request to a shop page, in order:

1. unknown shop or page: 404;
2. a slow shop waits its ``delay_ms`` first (whatever the answer);
3. the human-only shop needs ``?code=<operator code>`` (401 without, 403
   with a wrong one; its links then carry the code);
4. a CAPTCHA shop answers a challenge page on its ``captcha_routes``;
5. a flaky page fails on the attempts :meth:`World.outcome` picks (503 or
   500 with an error page, a reset connection, or a body cut short of its
   ``Content-Length``), deterministically from the seed and the page's
   request counter;
6. the layout-change shop serves its new layout once it has served
   ``layout_change_after`` pages;
7. 200 with the page.

``/`` and ``/shops.json`` list the shops; ``/market/prices`` (POST a
submission, GET the accepted prices) and ``/market/log`` are the fenced
market database (:mod:`hivemesh.audit.market`; a stale token gets 409);
``/_fixture/stats`` counts requests by shop, route and outcome. At start the
ground truth is written to ``<out_dir>/ground-truth.json``.

Limits: request head 16 KiB, body 1 MiB, 64 headers, 512 connections at
once (more get 503), connections idle for 30 s are closed; a malformed
request gets 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hivemesh.audit.market import MarketDB
from hivemesh.audit.pages import captcha_page, code_page, index_page, shop_page
from hivemesh.audit.world import ROUTES, Shop, World
from hivemesh.errors import HivemeshError

__all__ = ["FixtureServer", "serve_in_thread"]

log = logging.getLogger("hivemesh.audit.server")

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_HEADERS = 64
IDLE_TIMEOUT_S = 30.0
#: Connections served at once; more get 503 and are closed (counted in ``refused``).
MAX_CONNECTIONS = 512
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class _Request:
    method: str
    host: str | None  # from an absolute-form target
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    route: str


@dataclass(slots=True)
class _Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    #: "reset": close without answering; "truncate": send half the body, then close.
    fault: str | None = None
    #: Answer to a HEAD request: the headers only.
    head_only: bool = False


def _json(status: int, data: Any) -> _Response:
    body = json.dumps(data, ensure_ascii=False, sort_keys=True).encode()
    return _Response(status, body, "application/json")


def _error_page(status: int, text: str) -> _Response:
    return _Response(
        status, f"<!DOCTYPE html>\n<html><body><h1>{status} {text}</h1></body></html>\n".encode()
    )


class FixtureServer:
    """The fixture world over HTTP (see the module docs).

    ``await start()`` binds ephemeral ports (or ``port`` for the origin) and
    writes the ground truth; :attr:`url`, :attr:`routes`, :attr:`market_url`
    and :attr:`ground_truth_path` say where things are.
    """

    def __init__(
        self,
        world: World,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        out_dir: str | Path | None = None,
        routes: tuple[str, ...] = ROUTES,
    ) -> None:
        if "direct" not in routes:
            raise ValueError("the routes must include 'direct'")
        self.world = world
        self.host = host
        self.port = port
        self.out_dir = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="hm-shops-"))
        self.route_names = routes
        self.market = MarketDB()
        self._servers: dict[str, asyncio.Server] = {}
        self._ports: dict[str, int] = {}
        self._attempts: Counter[tuple[str, int]] = Counter()
        self._views: Counter[str] = Counter()
        self._counts: Counter[tuple[str, str, str]] = Counter()  # (shop, route, outcome)
        self.requests: deque[dict[str, Any]] = deque(maxlen=100_000)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Connections refused because :data:`MAX_CONNECTIONS` were open.
        self.refused = 0

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Listen on the origin and proxy ports; write the ground truth."""
        for route in self.route_names:
            port = self.port if route == "direct" else 0

            async def conn(
                r: asyncio.StreamReader, w: asyncio.StreamWriter, route: str = route
            ) -> None:
                await self._serve_conn(r, w, route)

            srv = await asyncio.start_server(conn, self.host, port, limit=MAX_HEAD_BYTES)
            self._servers[route] = srv
            self._ports[route] = srv.sockets[0].getsockname()[1]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        truth = json.dumps(self.world.ground_truth(self.url), indent=1, ensure_ascii=False)
        tmp = self.ground_truth_path.with_suffix(".tmp")
        tmp.write_text(truth + "\n", encoding="utf-8")
        tmp.replace(self.ground_truth_path)

    async def close(self) -> None:
        """Stop listening and close every connection."""
        for srv in self._servers.values():
            srv.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for srv in self._servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 2.0)
        self._servers.clear()

    async def __aenter__(self) -> FixtureServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- where things are ------------------------------------------------------

    @property
    def url(self) -> str:
        """The origin's base URL (no trailing slash)."""
        return f"http://{self.host}:{self._ports['direct']}"

    @property
    def routes(self) -> dict[str, str | None]:
        """Route name -> proxy URL (``None`` for ``direct``)."""
        return {
            r: None if r == "direct" else f"http://{self.host}:{self._ports[r]}"
            for r in self.route_names
        }

    @property
    def market_url(self) -> str:
        """Where prices are submitted (POST) and read (GET)."""
        return f"{self.url}/market/prices"

    @property
    def ground_truth_path(self) -> Path:
        """The ground-truth JSON file."""
        return self.out_dir / "ground-truth.json"

    def shop_url(self, shop_id: str) -> str:
        """The first page of ``shop_id``."""
        return f"{self.url}/{shop_id}/"

    def stats(self) -> dict[str, Any]:
        """Requests by shop, route and outcome, and successful page views."""
        by_shop: dict[str, dict[str, dict[str, int]]] = {}
        for (shop, route, outcome), n in sorted(self._counts.items()):
            by_shop.setdefault(shop, {}).setdefault(route, {})[outcome] = n
        return {"requests": len(self.requests), "by_shop": by_shop, "views": dict(self._views)}

    # -- HTTP ------------------------------------------------------------------

    async def _serve_conn(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: str
    ) -> None:
        if len(self._tasks) >= MAX_CONNECTIONS:
            self.refused += 1
            with contextlib.suppress(Exception):  # read the request so the 503 is not reset
                await asyncio.wait_for(self._read(reader, route), 1.0)
            await self._write(writer, _error_page(503, "too many connections"), close=True)
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT_S):
                        req = await self._read(reader, route)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                except (_BadRequest, asyncio.LimitOverrunError, ValueError) as exc:
                    status = exc.status if isinstance(exc, _BadRequest) else 400
                    await self._write(writer, _error_page(status, str(exc)[:200]), close=True)
                    return
                if req is None:
                    return
                try:
                    resp = await self._handle(req)
                except Exception:  # a bug here must not take the fixture down
                    log.exception("fixture handler failed for %s %s", req.method, req.path)
                    resp = _error_page(500, "fixture error")
                if req.method == "HEAD":
                    resp.head_only = True
                keep = req.headers.get("connection", "").lower() != "close"
                if resp.fault is not None or not await self._write(writer, resp, close=not keep):
                    return
                if not keep:
                    return
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, route: str) -> _Request | None:
        line = await reader.readline()
        if not line:
            return None
        parts = line.decode("latin-1").strip().split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, "malformed request line")
        method, target = parts[0], parts[1]
        headers: dict[str, str] = {}
        size = len(line)
        while True:
            h = await reader.readline()
            size += len(h)
            if size > MAX_HEAD_BYTES or len(headers) > MAX_HEADERS:
                raise _BadRequest(400, "request head too large")
            if h in (b"\r\n", b"\n", b""):
                break
            name, sep, value = h.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequest(400, "malformed header")
            headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise _BadRequest(400, "chunked request bodies are not supported")
        length = int(headers.get("content-length", "0") or "0")
        if not 0 <= length <= MAX_BODY_BYTES:
            raise _BadRequest(413, "request body too large")
        body = await reader.readexactly(length) if length else b""
        if method == "CONNECT":
            raise _BadRequest(405, "CONNECT is not supported")
        host = None
        if target.startswith(("http://", "https://")):
            u = urlsplit(target)
            host, path, query = u.netloc, u.path or "/", u.query
        elif target.startswith("/"):
            path, _, query = target.partition("?")
        else:
            raise _BadRequest(400, "bad request target")
        q = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        return _Request(method, host, path, q, headers, body, route)

    async def _write(self, writer: asyncio.StreamWriter, resp: _Response, *, close: bool) -> bool:
        if resp.fault == "reset":
            writer.transport.abort()
            return False
        head = [f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Status')}"]
        head.append(f"Content-Type: {resp.content_type}")
        head.append(f"Content-Length: {len(resp.body)}")
        head += [f"{k}: {v}" for k, v in resp.headers.items()]
        head.append("Connection: close" if close else "Connection: keep-alive")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):  # a client that stops reading
                if resp.fault == "truncate":
                    writer.write(data + resp.body[: len(resp.body) // 2])
                    await writer.drain()
                    writer.transport.abort()
                    return False
                writer.write(data if resp.head_only else data + resp.body)
                await writer.drain()
        except (ConnectionError, TimeoutError):
            writer.transport.abort()
            return False
        return True

    # -- what to answer --------------------------------------------------------

    def _own_host(self, host: str) -> bool:
        hostname, _, port = host.rpartition(":")
        return (
            hostname in (self.host, "localhost")
            and port.isdigit()
            and int(port) in self._ports.values()
        )

    async def _handle(self, req: _Request) -> _Response:
        if req.host is not None and not self._own_host(req.host):
            return _error_page(502, "this proxy reaches the fixture's shops only")
        path = req.path
        if path == "/market/prices":
            return self._market(req)
        if req.method not in ("GET", "HEAD"):
            return _error_page(405, "method not allowed")
        if path == "/":
            return _Response(200, index_page(self.world).encode())
        if path == "/shops.json":
            return _json(
                200,
                [
                    {"id": s.id, "name": s.name, "url": self.shop_url(s.id)}
                    for s in self.world.shops
                ],
            )
        if path == "/market/log":
            return _json(200, self.market.log())
        if path == "/_fixture/stats":
            return _json(200, self.stats())
        parts = [p for p in path.split("/") if p]
        shop = self.world.shop(parts[0]) if parts else None
        page = self._page_of(parts, req.query)
        if shop is None or page is None or not 1 <= page <= shop.pages:
            return _error_page(404, "not found")
        return await self._shop(req, shop, page)

    @staticmethod
    def _page_of(parts: list[str], query: dict[str, str]) -> int | None:
        if len(parts) == 1:
            p = query.get("page", "1")
        elif len(parts) == 3 and parts[1] == "page":
            p = parts[2]
        else:
            return None
        return int(p) if p.isdigit() and len(p) < 6 else None

    def _record(self, req: _Request, shop: Shop, page: int, outcome: str) -> None:
        self._counts[(shop.id, req.route, outcome)] += 1
        self.requests.append(
            {
                "shop": shop.id,
                "page": page,
                "route": req.route,
                "outcome": outcome,
                "t": time.monotonic(),
            }
        )

    async def _shop(self, req: _Request, shop: Shop, page: int) -> _Response:
        if shop.delay_ms:
            await asyncio.sleep(shop.delay_ms / 1000)
        code = None
        if "human-only" in shop.behaviours:
            code = req.query.get("code")
            if code != self.world.operator_code():
                self._record(req, shop, page, "needs-code")
                return _Response(403 if code else 401, code_page(shop, wrong=bool(code)).encode())
        if req.route in shop.captcha_routes:
            self._record(req, shop, page, "captcha")
            return _Response(403 if shop.index % 2 else 200, captcha_page(shop).encode())
        attempt = self._attempts[(shop.id, page)]
        self._attempts[(shop.id, page)] += 1
        fate = self.world.outcome(shop, page, attempt)
        if fate in ("503", "500"):
            self._record(req, shop, page, fate)
            resp = _error_page(int(fate), "try again later")
            resp.headers["Retry-After"] = "1"
            return resp
        changed = self._views[shop.id] >= self.world.options.layout_change_after
        self._views[shop.id] += 1
        body = shop_page(self.world, shop, page, changed=changed, code=code).encode()
        self._record(req, shop, page, "ok" if fate == "ok" else fate)
        return _Response(200, body, fault=None if fate == "ok" else fate)

    def _market(self, req: _Request) -> _Response:
        if req.method == "GET":
            return _json(200, self.market.prices())
        if req.method != "POST":
            return _error_page(405, "method not allowed")
        try:
            body = json.loads(req.body)
            sub = self.market.submit(body, int(time.time() * 1000))
        except ValueError as exc:  # bad JSON (InvalidArgument is a ValueError too)
            code = getattr(exc, "code", "invalid_argument")
            return _json(400, {"error": {"code": code, "message": str(exc)[:300]}})
        except HivemeshError as exc:  # StaleFencingToken
            shop = body.get("shop") if isinstance(body, dict) else None
            highest = self.market.highest(shop) if isinstance(shop, str) else 0
            return _json(
                409, {"error": {"code": exc.code, "message": str(exc), "highest": highest}}
            )
        return _json(200, {"accepted": True, "shop": sub.shop, "token": sub.token, "seq": sub.seq})


@contextlib.contextmanager
def serve_in_thread(world: World, **kwargs: Any) -> Iterator[FixtureServer]:
    """Run a :class:`FixtureServer` on its own event loop in a background
    thread (for synchronous code and tests); stops it on exit."""
    loop = asyncio.new_event_loop()
    server = FixtureServer(world, **kwargs)
    started = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.close())
        loop.close()

    thread = threading.Thread(target=run, name="hivemesh-fixture", daemon=True)
    thread.start()
    if not started.wait(30):
        raise TimeoutError("fixture server did not start in 30 s")
    if failure:
        raise failure[0]
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
