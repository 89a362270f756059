"""Serve a :class:`~hivemesh.faces.mcp.server.MeshMcp` over stdio or streamable HTTP.

stdio is what a desktop assistant or an IDE agent starts (``hivemesh mcp``).
Streamable HTTP (``hivemesh mcp --http``) binds to a loopback address unless
a token is configured; with a token every request must carry it as
``Authorization: Bearer <token>`` (compared in constant time), wherever the
server is bound. A refused request is answered 401 and counted
(``refused_http_unauthorized``).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from hivemesh.errors import ConfigError
from hivemesh.faces.mcp.server import MeshMcp

__all__ = ["BearerGate", "check_binding", "is_loopback", "serve_http", "serve_stdio"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse (:class:`~hivemesh.errors.ConfigError`) a non-loopback address without a token."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to serve on {host}: off localhost a token is required "
            "(--token or HIVEMESH_MCP_TOKEN)"
        )


class BearerGate:
    """ASGI middleware: HTTP requests must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str, counters: Any) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.counters = counters

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass authorised requests (and lifespan events) through; answer 401 otherwise."""
        if scope.get("type") == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self._expected):
                self.counters["refused_http_unauthorized"] += 1
                body = b'{"error": "unauthorized: a bearer token is required"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def serve_stdio(face: MeshMcp) -> None:
    """Serve ``face`` on this process's stdin/stdout until the client hangs up."""
    from mcp.server.stdio import stdio_server

    async with face.running(), stdio_server() as (read, write):
        await face.server.run(read, write, face.server.create_initialization_options())


async def serve_http(
    face: MeshMcp,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    on_ready: Any = None,
) -> None:
    """Serve ``face`` over streamable HTTP at ``http://host:port/mcp``.

    ``on_ready(port)`` is called once the socket listens (the port chosen
    when ``port`` is 0).
    """
    import uvicorn

    check_binding(host, token)
    app: Any = face.server.streamable_http_app(streamable_http_path="/mcp", host=host)
    if token:
        app = BearerGate(app, token, face.counters)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    async with face.running():
        if on_ready is None:
            await server.serve()
            return
        import asyncio

        task = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                if task.done():
                    await task
                    return
                await asyncio.sleep(0.02)
            sockets = [s for srv in server.servers for s in srv.sockets]
            on_ready(sockets[0].getsockname()[1] if sockets else port)
            await task
        finally:
            if not task.done():
                server.should_exit = True
                await asyncio.wait({task}, timeout=5)
