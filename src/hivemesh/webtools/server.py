"""The web-tools MCP server: fetch, extract, paginate, snapshot.

Theory of operation
-------------------
:func:`build_server` returns an ``mcp`` 2.x ``MCPServer`` whose tools wrap a
:class:`~hivemesh.webtools.fetch.Fetcher` and the extractors of
:mod:`hivemesh.webtools.extract`:

``list_routes``         the configured routes and the default one;
``fetch_page``          GET a URL through a route; status, timing, HTML;
``extract_tables``      the tables of a page (``url`` or ``html``);
``extract_structured``  its JSON-LD and microdata;
``extract_prices``      its products and prices (strategy ``auto`` or one of
                        ``jsonld``, ``microdata``, ``table``, ``blocks``), and
                        the next page's URL;
``follow_pagination``   every page from a first one, following "next" links
                        (loop-safe, at most ``max_pages``), with its prices;
``dom_snapshot``        the canonical HTML of the parsed DOM, its SHA-256 and its
                        hivemesh blob address (BLAKE2b-256, as ``blob.put`` uses).

Results are JSON objects (MCP structured content, mirrored as text). A
failure is an MCP error result whose text starts with the stable code of the
:mod:`hivemesh.errors` class (``captcha_required: ...``, ``fetch_timeout:
...``, ``extract_failed: ...``, ``invalid_argument: ...``), so a client can
react by class: switch route, retry, ask a human. Wrong argument types and
unknown tools are refused by the MCP layer itself; an unexpected exception
in a tool becomes a generic error result and is counted. No input ends the
server: it runs until its transport closes (stdio) or it is stopped (HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from hivemesh.core.views.blobs import blob_digest
from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.webtools import extract as ex
from hivemesh.webtools.errors import ExtractError
from hivemesh.webtools.fetch import Fetcher

__all__ = ["build_server", "serve_http", "serve_stdio"]

log = logging.getLogger("hivemesh.webtools")

P = ParamSpec("P")
R = TypeVar("R")
MAX_PAGES = 100


def _typed(
    counters: Counter[str],
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Turn hivemesh errors into MCP tool errors that start with their code."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            counters[f"calls.{fn.__name__}"] += 1
            try:
                return await fn(*args, **kwargs)
            except HivemeshError as exc:
                counters[f"errors.{exc.code}"] += 1
                raise ToolError(f"{exc.code}: {exc}") from None
            except Exception:
                counters["errors.unexpected"] += 1
                raise

        return run

    return wrap


def build_server(fetcher: Fetcher, *, name: str = "hivemesh-web") -> tuple[MCPServer, Counter[str]]:
    """The web-tools server over ``fetcher``, and its call/error counters."""

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield None
        finally:  # on the loop that opened the connections
            await fetcher.aclose()

    app = MCPServer(
        name,
        lifespan=lifespan,
        instructions=(
            "Web tools: fetch pages through named routes (proxies), extract tables, "
            "structured data and prices, follow pagination, snapshot the DOM. Errors start "
            "with a code: captcha_required (switch route), fetch_timeout/fetch_failed "
            "(retry), access_code_required (ask a human), extract_failed (other strategy)."
        ),
        log_level="WARNING",
    )
    counters: Counter[str] = Counter()
    typed = _typed(counters)

    async def load(url: str, html: str, route: str, timeout_s: float) -> tuple[Any, str]:
        if bool(url) == bool(html):
            raise InvalidArgument("give exactly one of url or html")
        if html:
            if len(html) > ex.MAX_HTML_BYTES:
                raise InvalidArgument(f"html over {ex.MAX_HTML_BYTES} characters")
            return ex.parse_html(html), ""
        page = await fetcher.fetch(url, route=route or None, timeout_s=timeout_s or None)
        return ex.parse_html(page.html), page.final_url

    @app.tool()
    @typed
    async def list_routes() -> dict[str, Any]:
        """The routes (egress paths: direct or a proxy) pages can be fetched through."""
        return {"routes": sorted(fetcher.routes), "default": fetcher.default_route}

    @app.tool()
    @typed
    async def fetch_page(
        url: str, route: str = "", timeout_s: float = 0, include_html: bool = True
    ) -> dict[str, Any]:
        """Fetch a web page (http/https) through a route (default: the default route).

        Returns status, final URL, timing and the HTML. Fails with
        captcha_required when the site challenges this route (try another),
        access_code_required when only a human can open it, fetch_timeout or
        fetch_failed otherwise.
        """
        page = await fetcher.fetch(url, route=route or None, timeout_s=timeout_s or None)
        out = page.summary()
        if include_html:
            out["html"] = page.html
        return out

    @app.tool()
    @typed
    async def extract_tables(
        url: str = "", html: str = "", route: str = "", timeout_s: float = 0
    ) -> dict[str, Any]:
        """The tables of a page (given by url, fetched, or as html): caption, headers, rows."""
        doc, _ = await load(url, html, route, timeout_s)
        return {"tables": ex.extract_tables(doc)}

    @app.tool()
    @typed
    async def extract_structured(
        url: str = "", html: str = "", route: str = "", timeout_s: float = 0
    ) -> dict[str, Any]:
        """The structured data of a page: JSON-LD blocks and microdata items."""
        doc, _ = await load(url, html, route, timeout_s)
        return ex.extract_structured(doc)

    @app.tool()
    @typed
    async def extract_prices(
        url: str = "",
        html: str = "",
        route: str = "",
        strategy: str = "auto",
        timeout_s: float = 0,
        base_url: str = "",
    ) -> dict[str, Any]:
        """Products and prices of a page (name, sku, price as decimal text, ISO currency).

        strategy: auto (the one finding most products), jsonld, microdata,
        table or blocks. Also returns next_page, the URL of the next page
        (for html, resolved against base_url, the page's own URL).
        """
        doc, final = await load(url, html, route, timeout_s)
        result = ex.extract_prices(doc, strategy=strategy)
        if not result["products"]:
            raise ExtractError(f"no prices found with strategy {strategy}")
        base = final or base_url
        result["next_page"] = ex.next_page_url(doc, base) if base else None
        return result

    @app.tool()
    @typed
    async def follow_pagination(
        url: str, route: str = "", max_pages: int = 20, strategy: str = "auto", timeout_s: float = 0
    ) -> dict[str, Any]:
        """Every page from url on, following next links; the prices of all pages.

        Stops at the last page, at a page already seen, or after max_pages
        (then complete is false). Fails on the first page that cannot be
        fetched or read, naming it.
        """
        if not 1 <= max_pages <= MAX_PAGES:
            raise InvalidArgument(f"max_pages must be 1..{MAX_PAGES}")
        pages: list[dict[str, Any]] = []
        products: list[dict[str, Any]] = []
        seen: set[str] = set()
        nxt: str | None = url
        while nxt is not None and nxt not in seen and len(pages) < max_pages:
            seen.add(nxt)
            try:
                page = await fetcher.fetch(nxt, route=route or None, timeout_s=timeout_s or None)
                doc = ex.parse_html(page.html)
            except HivemeshError as exc:
                exc.args = (f"page {len(pages) + 1} ({nxt}): {exc}",)
                raise
            found = ex.extract_prices(doc, strategy=strategy)
            if not found["products"]:
                raise ExtractError(f"page {len(pages) + 1} ({nxt}): no prices with {strategy}")
            pages.append(
                {"url": nxt, "count": len(found["products"]), "strategy": found["strategy"]}
            )
            products.extend(found["products"])
            nxt = ex.next_page_url(doc, page.final_url)
        complete = nxt is None or nxt in seen
        currencies = sorted({p["currency"] for p in products if p["currency"]})
        return {
            "pages": pages,
            "products": products,
            "currency": currencies[0] if len(currencies) == 1 else None,
            "complete": complete,
        }

    @app.tool()
    @typed
    async def dom_snapshot(
        url: str = "", html: str = "", route: str = "", timeout_s: float = 0
    ) -> dict[str, Any]:
        """The page's HTML after parsing, normalised (same DOM, same bytes): its
        sha256, its hivemesh blob address (blob: blake2b-256) and the HTML."""
        doc, _ = await load(url, html, route, timeout_s)
        text, digest = ex.dom_snapshot(doc)
        data = text.encode("utf-8")
        return {"sha256": digest, "blob": blob_digest(data).hex(), "bytes": len(data), "html": text}

    return app, counters


def serve_stdio(fetcher: Fetcher) -> None:
    """Serve the web tools over stdio until stdin closes."""
    app, _ = build_server(fetcher)
    app.run("stdio")


def serve_http(fetcher: Fetcher, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve the web tools over streamable HTTP at ``http://host:port/mcp``;
    prints that URL on stdout (the port may be ephemeral)."""
    import uvicorn

    app, _ = build_server(fetcher)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # clients that connect before uvicorn runs wait in the backlog
    bound = sock.getsockname()[1]
    web = app.streamable_http_app(host=host)
    server = uvicorn.Server(uvicorn.Config(web, log_level="warning", lifespan="on"))
    print(f"http://{host}:{bound}/mcp", flush=True, file=sys.stdout)

    asyncio.run(server.serve(sockets=[sock]))
