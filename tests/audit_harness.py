"""Run an audit on one in-process node: supervisor, executor and reflector
together, over the real fixture server and real MCP tool servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hivemesh import Node
from hivemesh.audit import ops
from hivemesh.audit.live import LiveView
from hivemesh.audit.server import FixtureServer
from hivemesh.audit.worker import AuditExecutor, ExecutorOptions
from hivemesh.roles.reflector import Reflector
from hivemesh.roles.supervisor import Supervisor

ROUTES = ["direct", "proxy-1", "proxy-2", "proxy-3"]


async def audit_on_one_node(
    world: FixtureServer,
    ids: list[str],
    tools: Any,
    data_dir: Path,
    *,
    options: ExecutorOptions | None = None,
    before: Callable[[Node], Awaitable[None]] | None = None,
    timeout_s: float = 150.0,
) -> dict[str, Any]:
    """Audit shops ``ids``; answer every question with the operator's code;
    return the export once the supervisor wrote ``audit.done``."""
    node = Node(data_dir, trust_mode="open")
    async with node:
        live = LiveView.attach(node)
        ops.attach(node.daemon, live.view)
        sup = Supervisor(
            node,
            live,
            shops=[{"id": s, "url": world.shop_url(s)} for s in ids],
            routes=ROUTES,
            market=world.market_url,
            batch_size=4,
        )
        ex = AuditExecutor(node, live, tools, options or ExecutorOptions(reflect_wait_s=2.0))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(r.run(stop)) for r in (sup, ex, Reflector(node, live))]
        try:
            if before is not None:
                await before(node)
            async with asyncio.timeout(timeout_s):
                while True:
                    audit = live.view.latest()
                    if audit is not None and audit.finished is not None:
                        break
                    for q in ops.questions(live.view):
                        await ops.answer(node.daemon, q["id"], world.world.operator_code())
                    await live.wait(0.5)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        return ops.export(live.view)
