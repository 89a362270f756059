"""Serve a :class:`~hivemesh.faces.mcp.server.MeshMcp` over stdio or streamable HTTP.

stdio is what a desktop assistant or an IDE agent starts (``hivemesh mcp``).
Streamable HTTP (``hivemesh mcp --http``) binds to a loopback address unless
a token is configured; with a token every request must carry it as
``Authorization: Bearer <token>`` (compared in constant time), wherever the
server is bound. A refused request is answered 401 and counted
(``refused_http_unauthorized``; :mod:`hivemesh.faces.httpguard`).
"""

from __future__ import annotations

from typing import Any

from hivemesh.faces.asgi import serve_asgi
from hivemesh.faces.httpguard import BearerGate, check_binding
from hivemesh.faces.mcp.server import MeshMcp

__all__ = ["serve_http", "serve_stdio"]


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
    check_binding(host, token)
    app: Any = face.server.streamable_http_app(streamable_http_path="/mcp", host=host)
    if token:
        app = BearerGate(app, token, face.counters)
    async with face.running():
        await serve_asgi(app, host=host, port=port, on_ready=on_ready)
