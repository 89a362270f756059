"""Run an ASGI application (a face served over HTTP) on the running event loop.

uvicorn serves it; :func:`serve_asgi` returns when the server stops (or is
cancelled, which stops it within a grace period) and tells ``on_ready`` the
port it listens on once the socket is bound (the kernel's choice for port 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["serve_asgi"]

#: How long a stopping server may take to close its connections.
GRACE_S = 5.0


async def serve_asgi(
    app: Any,
    *,
    host: str,
    port: int,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until the server stops (see module docs)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:  # uvicorn has no ready callback: watch its flag
            if task.done():
                await task
                return
            await asyncio.wait({task}, timeout=0.02)
        if on_ready is not None:
            sockets = [s for srv in server.servers for s in srv.sockets]
            on_ready(sockets[0].getsockname()[1] if sockets else port)
        await task
    finally:
        if not task.done():
            server.should_exit = True
            await asyncio.wait({task}, timeout=GRACE_S)
            task.cancel()
