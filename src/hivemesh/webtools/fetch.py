"""Fetching pages through named routes (direct, or an HTTP proxy).

Theory of operation
-------------------
A :class:`Fetcher` knows a set of *routes*: ``{"direct": None, "proxy-1":
"http://127.0.0.1:8081", ...}``. Each route has its own ``httpx`` client
(``trust_env=False``: no proxy or certificate settings leak in from the
environment), so switching route is switching egress: the correction a
reflector makes when a site challenges one route with a CAPTCHA.

Every fetch has a deadline (``timeout_s``, the whole request including the
body) and a size cap (``max_bytes``, read as a stream and cut off). Failures
are typed, never raw ``httpx`` errors:

* :class:`~hivemesh.webtools.errors.FetchTimeout` -- the deadline passed;
* :class:`~hivemesh.webtools.errors.FetchError` -- connection refused or reset, a body
  cut short, an HTTP error status (``status`` set), too large, bad URL or an
  unknown route;
* :class:`~hivemesh.webtools.errors.CaptchaRequired` -- the answer is a challenge page
  (whatever its status);
* :class:`~hivemesh.webtools.errors.AccessCodeRequired` -- the page asks for an access
  code (only a human can help).

Only ``http``/``https`` URLs are fetched; ``allowed_hosts`` (when given)
limits which hosts may be reached.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from hivemesh.errors import InvalidArgument
from hivemesh.webtools.errors import (
    AccessCodeRequired,
    CaptchaRequired,
    ExtractError,
    FetchError,
    FetchTimeout,
)
from hivemesh.webtools.extract import detect_block, parse_html

__all__ = ["Fetcher", "Page"]

DEFAULT_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Page:
    """A fetched page."""

    url: str
    final_url: str
    route: str
    status: int
    content_type: str
    html: str
    elapsed_ms: int

    def summary(self) -> dict[str, Any]:
        """Everything but the HTML."""
        return {
            "url": self.url,
            "final_url": self.final_url,
            "route": self.route,
            "status": self.status,
            "content_type": self.content_type,
            "bytes": len(self.html.encode("utf-8")),
            "elapsed_ms": self.elapsed_ms,
        }


class Fetcher:
    """HTTP GET through named routes (see the module docs)."""

    def __init__(
        self,
        routes: dict[str, str | None] | None = None,
        *,
        default_route: str = "direct",
        timeout_s: float = 15.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        allowed_hosts: frozenset[str] | None = None,
        user_agent: str = "hivemesh-webtools/0.1",
    ) -> None:
        self.routes: dict[str, str | None] = dict(routes or {"direct": None})
        if default_route not in self.routes:
            raise InvalidArgument(f"default route {default_route!r} is not configured")
        for name, proxy in self.routes.items():
            if proxy is not None and urlsplit(proxy).scheme not in ("http", "https"):
                raise InvalidArgument(f"route {name}: proxy must be an http(s) URL")
        self.default_route = default_route
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.allowed_hosts = allowed_hosts
        self.user_agent = user_agent
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, route: str) -> httpx.AsyncClient:
        client = self._clients.get(route)
        if client is None:
            client = httpx.AsyncClient(
                proxy=self.routes[route],
                trust_env=False,
                follow_redirects=True,
                max_redirects=5,
                timeout=httpx.Timeout(self.timeout_s),
                headers={"User-Agent": self.user_agent, "Accept": "text/html,*/*;q=0.5"},
                limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
            )
            self._clients[route] = client
        return client

    def check_url(self, url: str) -> None:
        """Raise :class:`InvalidArgument` unless ``url`` may be fetched."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidArgument(f"only http(s) URLs can be fetched, not {url!r:.100}")
        if self.allowed_hosts is not None and u.hostname not in self.allowed_hosts:
            raise InvalidArgument(f"host {u.hostname} is not allowed")

    async def fetch(
        self, url: str, *, route: str | None = None, timeout_s: float | None = None
    ) -> Page:
        """GET ``url`` through ``route`` (see the module docs for the errors)."""
        route = route or self.default_route
        if route not in self.routes:
            known = ", ".join(sorted(self.routes))
            raise FetchError(f"unknown route {route!r} (configured: {known})")
        self.check_url(url)
        deadline = self.timeout_s if timeout_s is None else timeout_s
        if not 0 < deadline <= 600:
            raise InvalidArgument("timeout_s must be in (0, 600]")
        start = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                status, ctype, final, body = await self._get(url, route)
        except TimeoutError:
            raise FetchTimeout(f"{url} via {route}: no complete answer in {deadline:g} s") from None
        except httpx.TimeoutException:
            raise FetchTimeout(f"{url} via {route}: timed out") from None
        except httpx.ProxyError as exc:
            raise FetchError(f"route {route} failed: {exc}") from None
        except httpx.ConnectError as exc:
            where = f"route {route} ({self.routes[route]})" if self.routes[route] else url
            raise FetchError(f"{where} unreachable: {exc}") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise FetchError(f"{url} via {route}: {type(exc).__name__}: {exc}") from None
        html = body.decode("utf-8", "replace")
        page = Page(url, final, route, status, ctype, html, int((time.monotonic() - start) * 1000))
        self._raise_for_block(page)
        if status >= 400:
            raise FetchError(f"{url} via {route}: HTTP {status}", status=status)
        return page

    async def _get(self, url: str, route: str) -> tuple[int, str, str, bytes]:
        async with self._client(route).stream("GET", url) as resp:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise FetchError(
                        f"{url}: page over {self.max_bytes} bytes", status=resp.status_code
                    )
                chunks.append(chunk)
            ctype = resp.headers.get("content-type", "")
            return resp.status_code, ctype, str(resp.url), b"".join(chunks)

    @staticmethod
    def _raise_for_block(page: Page) -> None:
        if "html" not in page.content_type and page.content_type:
            return
        try:
            block = detect_block(parse_html(page.html))
        except ExtractError:
            return  # not readable HTML: the extractors will say so
        if block == "captcha":
            raise CaptchaRequired(
                f"{page.url} answered a CAPTCHA on route {page.route}: try another route",
                status=page.status,
            )
        if block == "access_code":
            raise AccessCodeRequired(
                f"{page.url} needs an access code: ask the operator, then fetch it with ?code=...",
                status=page.status,
            )

    async def aclose(self) -> None:
        """Close every route's connections."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
