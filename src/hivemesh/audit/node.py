"""One audit role on one node process: ``hivemesh audit node --role ROLE``.

Theory of operation
-------------------
Each role runs on its own :class:`hivemesh.Node` (its own identity, store,
control socket), so its events form one feed, failure detection sees it as
one member, and killing the process takes out exactly one role:

* ``supervisor`` -- reads the fixture's shop list and runs
  :class:`~hivemesh.roles.supervisor.Supervisor`;
* ``executor`` -- starts its MCP web-tools server (``hivemesh webtools`` over
  stdio, one per process, opened early: a start costs seconds under load)
  and runs :class:`~hivemesh.audit.worker.AuditExecutor`; ``--mcp CONFIG``
  adds any other MCP servers (desktop-client format) to its tools, and
  ``--notes-tool server.tool`` notes every audited shop there;
* ``reflector`` -- runs :class:`~hivemesh.roles.reflector.Reflector`;
* ``observer`` -- only folds the journal (and witnesses tool results).

Every role node serves the audit control ops (:mod:`hivemesh.audit.ops`):
``hivemesh inbox`` and ``hivemesh answer`` work against any of them. With
``--json`` the process prints ``up --json``'s ready line (``address``,
``listen``, ``control``, ``role``) once it is ready, so
:class:`~hivemesh.client.swarm.LocalSwarm` can start it. SIGINT/SIGTERM
stop it cleanly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import hivemesh
from hivemesh.audit.live import LiveView
from hivemesh.audit.rules import Limits
from hivemesh.audit.worker import AuditExecutor, ExecutorOptions
from hivemesh.errors import ConfigError

__all__ = ["ROLES", "RoleOptions", "serve_role", "webtools_spec"]

log = logging.getLogger("hivemesh.audit.node")

ROLES = ("supervisor", "executor", "reflector", "observer")


@dataclass(frozen=True, slots=True)
class RoleOptions:
    """What a role process needs to know."""

    role: str
    data_dir: Path
    listen: str = "127.0.0.1:0"
    bootstrap: tuple[str, ...] = ()
    #: The fixture's ready record (``url``, ``routes``, ``market``).
    fixture: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 10
    window: int = 3
    max_concurrent: int = 4
    lease_ttl_ms: int = 4000
    reflect_wait_s: float = 3.0
    pause_before_submit: str = ""
    json: bool = False
    name: str | None = None
    #: More MCP servers for an executor (``--mcp``), beside the web tools.
    mcp: tuple[Any, ...] = ()
    notes_tool: str = ""


def webtools_spec(routes: dict[str, str | None], *, timeout_s: float = 60.0) -> Any:
    """The stdio MCP server spec of ``hivemesh webtools`` with ``routes``."""
    from hivemesh.tools.spec import MCPServerSpec

    args = ["-m", "hivemesh", "webtools", "--timeout-s", "10"]
    for name, proxy in sorted(routes.items()):
        if proxy:
            args += ["--route", f"{name}={proxy}"]
    # the MCP client passes a server only a few safe variables: say where hivemesh is
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return MCPServerSpec(
        name="web",
        transport="stdio",
        command=sys.executable,
        args=tuple(args),
        env=(("PYTHONPATH", path),),
        timeout_s=timeout_s,
    )


async def _shops(fixture: dict[str, Any]) -> list[dict[str, str]]:
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as http:
        resp = await http.get(f"{fixture['url']}/shops.json")
        resp.raise_for_status()
        return [{"id": s["id"], "url": s["url"]} for s in resp.json()]


async def serve_role(opts: RoleOptions, stop: asyncio.Event | None = None) -> int:
    """Run ``opts.role`` on a node until ``stop`` (or SIGINT/SIGTERM)."""
    import hivemesh.audit.ops as ops
    from hivemesh.node import Node

    if opts.role not in ROLES:
        raise ConfigError(f"unknown audit role {opts.role!r}; one of {', '.join(ROLES)}")
    if opts.role in ("supervisor", "executor") and not opts.fixture:
        raise ConfigError(f"the {opts.role} needs --fixture (the fixture's ready line)")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = Node(opts.data_dir, listen=opts.listen, bootstrap=list(opts.bootstrap), name=opts.name)
    async with node:
        live = LiveView.attach(node, witness=opts.role in ("observer", "reflector"))
        ops.attach(node.daemon, live.view)
        runner: Any = None
        tools: Any = None
        if opts.role == "executor":
            from hivemesh.tools.mcp_client import MCPToolSet

            tools = MCPToolSet([webtools_spec(opts.fixture["routes"]), *opts.mcp])
            await tools.describe()  # start the server now: the first call must not pay it
            runner = AuditExecutor(
                node,
                live,
                tools,
                ExecutorOptions(
                    max_concurrent=opts.max_concurrent,
                    lease_ttl_ms=opts.lease_ttl_ms,
                    reflect_wait_s=opts.reflect_wait_s,
                    pause_before_submit=opts.pause_before_submit,
                    notes_tool=opts.notes_tool,
                ),
            )
        elif opts.role == "reflector":
            from hivemesh.roles.reflector import Reflector

            runner = Reflector(node, live, limits=Limits(), advisor=_advisor(node))
        elif opts.role == "supervisor":
            from hivemesh.roles.supervisor import Supervisor

            runner = Supervisor(
                node,
                live,
                shops=await _shops(opts.fixture),
                routes=_route_order(opts.fixture["routes"]),
                market=opts.fixture["market"],
                batch_size=opts.batch_size,
                window=opts.window,
            )
        ready = {
            "address": node.address,
            "listen": node.endpoint,
            "control": str(node.config.control_path),
            "role": opts.role,
        }
        print(
            json.dumps(ready, sort_keys=True)
            if opts.json
            else f"{opts.role} {node.address} up on {node.endpoint}",
            flush=True,
        )
        try:
            if runner is not None:
                await runner.run(stop)
            await stop.wait()
        finally:
            if tools is not None:
                await tools.aclose()
    return 0


def _route_order(routes: dict[str, Any]) -> list[str]:
    """``direct`` first, then the proxies by name."""
    return sorted(routes, key=lambda r: (r != "direct", r))


def _advisor(node: Any) -> Any:
    """An LLM advisor for the reflector when ``HIVEMESH_LLM_*`` configure one."""
    from hivemesh.llm import LLMConfig, provider_from_config
    from hivemesh.llm.errors import LLMNotConfigured

    try:
        cfg = LLMConfig.resolve(None, os.environ)
    except (LLMNotConfigured, ConfigError):
        return None
    from hivemesh.audit.advice import llm_advisor
    from hivemesh.telemetry.app import usage_hook

    return llm_advisor(provider_from_config(cfg, on_usage=usage_hook(node.metrics)))
