"""Serve a node as an A2A agent: the card at the well-known URL, JSON-RPC at ``/``.

``http://HOST:PORT/.well-known/agent-card.json`` is the Agent Card
(:mod:`hivemesh.faces.a2a.card`, rebuilt per request); JSON-RPC requests at
``http://HOST:PORT/`` (``SendMessage``, ``SendStreamingMessage``,
``GetTask``, ``CancelTask``, ...) are the a2a-sdk's request handler over
:class:`~hivemesh.faces.a2a.executor.PlanExecutor`, with tasks kept in
memory, at most ``max_tasks`` of them (:mod:`hivemesh.faces.a2a.tasks`: the
oldest ended task is forgotten first; when all are running a new one is
refused; a restart forgets them, the goals stay in the journal). The server binds to a loopback
address unless a token is configured, and then requires it as a bearer
token on every request, the card included (:mod:`hivemesh.faces.httpguard`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from hivemesh.faces.a2a.card import refresh
from hivemesh.faces.a2a.executor import PlanExecutor
from hivemesh.faces.a2a.tasks import DEFAULT_MAX_TASKS, BoundedTaskStore
from hivemesh.faces.asgi import serve_asgi
from hivemesh.faces.httpguard import BearerGate, check_binding

__all__ = ["build_app", "serve_a2a"]


def build_app(
    client: Any,
    url: str,
    *,
    token: str | None = None,
    goal_args: Mapping[str, Any] | None = None,
    timeout_s: float = 3600.0,
    counters: Counter[str] | None = None,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> Any:
    """The ASGI application of the A2A face of the node ``client`` reaches."""
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.types import AgentCard
    from starlette.applications import Starlette

    from hivemesh import __version__ as version
    from hivemesh.faces.a2a.card import build_card

    card = build_card(url, node="node", roles={}, version=version)

    async def current(_card: AgentCard) -> AgentCard:
        return await refresh(client, url, version)

    executor = PlanExecutor(client, goal_args=goal_args, timeout_s=timeout_s)
    handler = DefaultRequestHandler(
        agent_executor=executor, task_store=BoundedTaskStore(max_tasks), agent_card=card
    )
    routes = [
        *create_agent_card_routes(card, card_modifier=current),
        *create_jsonrpc_routes(handler, rpc_url="/"),
    ]
    app: Any = Starlette(routes=routes)
    if token:
        app = BearerGate(app, token, counters if counters is not None else Counter())
    return app


async def serve_a2a(
    client: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8766,
    token: str | None = None,
    goal_args: Mapping[str, Any] | None = None,
    timeout_s: float = 3600.0,
    public_url: str | None = None,
    on_ready: Callable[[int], None] | None = None,
    max_tasks: int = DEFAULT_MAX_TASKS,
) -> None:
    """Serve the A2A face until cancelled; ``on_ready(port)`` once it listens.
    ``public_url`` is the URL the card gives clients (default
    ``http://HOST:PORT/``; set it when clients reach the node by another name)."""
    check_binding(host, token)
    bound: dict[str, Any] = {}

    def ready(port_now: int) -> None:
        bound["port"] = port_now
        if on_ready is not None:
            on_ready(port_now)

    # the card's URL names the port, so an ephemeral port needs it first: bind, then build
    if port == 0:
        import socket

        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    url = public_url or f"http://{host}:{port}/"
    app = build_app(
        client, url, token=token, goal_args=goal_args, timeout_s=timeout_s, max_tasks=max_tasks
    )
    await serve_asgi(app, host=host, port=port, on_ready=ready)
