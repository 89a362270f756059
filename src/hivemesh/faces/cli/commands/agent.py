"""``hivemesh agent --role ROLE``: a node that runs one planner role.

The node is a full hivemesh node (its own identity and store in
``--data-dir``, connections, control socket); see :mod:`hivemesh.roles.agent`.
The LLM comes from ``HIVEMESH_LLM_*`` (or ``--base-url``/``--model``); an
observer needs none. With ``--json`` it prints ``up --json``'s ready line
``{"address", "listen", "control", "role", "tools"}``. SIGINT/SIGTERM stop it
cleanly. Without ``--json`` an observer draws the plan trees live on
stdout (:mod:`hivemesh.faces.plan_watch`; rich on a terminal).

An executor's tools come from MCP servers: the ``[mcp]`` table of the node's
config file and ``--mcp CONFIG`` (a JSON or TOML file, or inline JSON, in the
desktop-client format ``{"mcpServers": {...}}``; its servers replace
same-named ones from the config file). See :mod:`hivemesh.tools`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit_error
from hivemesh.errors import HivemeshError
from hivemesh.llm.errors import LLMNotConfigured

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``agent`` subcommand."""
    from hivemesh.roles.agent import ROLE_NAMES

    p = sub.add_parser("agent", help="run a node hosting one planner role")
    add_common(p)
    p.add_argument("--role", required=True, choices=ROLE_NAMES)
    p.add_argument("--strategy", default="", help="decomposer strategy, e.g. 'by day'")
    p.add_argument("--caps", default="", help="executor capabilities, comma separated")
    p.add_argument("--max-concurrent", type=int, default=4, help="executor parallel tasks")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port to accept peers on")
    p.add_argument("--bootstrap", action="append", help="[address@]host:port (repeatable)")
    p.add_argument("--base-url", default="", help="OpenAI-compatible base URL (overrides env)")
    p.add_argument("--model", default="", help="model name (overrides env)")
    p.add_argument(
        "--mcp",
        metavar="CONFIG",
        help='MCP tool servers: a file or inline JSON {"mcpServers": {...}}',
    )
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(_serve(args))
    except LLMNotConfigured as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except HivemeshError as exc:
        return emit_error(args, exc)


async def _serve(args: argparse.Namespace) -> int:
    from hivemesh.llm import LLMConfig, provider_from_config
    from hivemesh.node import Node
    from hivemesh.roles.agent import RoleDriver, make_role
    from hivemesh.telemetry.app import usage_hook
    from hivemesh.tools.mcp_client import MCPToolSet
    from hivemesh.tools.spec import merge_specs

    llm = None
    cfg = None
    if args.role != "observer":  # resolve first: no LLM configured -> explain and exit 2
        cfg = LLMConfig.resolve(None, os.environ, base_url=args.base_url, model=args.model)
    caps = tuple(sorted(c.strip() for c in args.caps.split(",") if c.strip()))
    extra = _mcp_specs(args.mcp) if args.mcp else ()  # a bad file fails before the node starts
    node = Node(data_dir_of(args), listen=args.listen, bootstrap=list(args.bootstrap or ()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with node, MCPToolSet(merge_specs(node.config.mcp_servers, extra)) as tools:
        if cfg is not None:  # every LLM call is recorded in the node's telemetry
            llm = provider_from_config(cfg, on_usage=usage_hook(node.metrics))
        role = make_role(
            args.role,
            node.daemon.identity.public,
            llm,
            strategy=args.strategy,
            caps=caps,
            max_concurrent=args.max_concurrent,
            tools=tools if tools.connections else None,
        )
        driver = RoleDriver(node, role)
        ready = {
            "address": node.address,
            "listen": node.endpoint,
            "control": str(node.config.control_path),
            "role": args.role,
            "tools": sorted(tools.connections),
        }
        if args.json:
            print(json.dumps(ready, sort_keys=True), flush=True)
        else:
            print(f"{args.role} {node.address} up on {node.endpoint} (Ctrl-C to stop)", flush=True)
        shown = None
        if args.role == "observer" and not args.json:  # the observer shows the tree live
            shown = asyncio.ensure_future(_show_live(node.config.data_dir, stop))
        try:
            await driver.run(stop)
            if shown is not None:
                await shown  # raises why the display stopped, if it failed
        finally:
            if shown is not None and not shown.done():
                shown.cancel()
            close = getattr(llm, "aclose", None)
            if close is not None:
                await close()
    return 0


async def _show_live(data_dir: Any, stop: asyncio.Event) -> None:
    """Redraw the node's plan trees on stdout until ``stop`` (see
    :mod:`hivemesh.faces.plan_watch`); a failure stops the agent too."""
    from hivemesh.client.aio import AsyncClient
    from hivemesh.faces.plan_watch import ClientSource, TreeDisplay, watch

    async def stopping() -> bool:
        return stop.is_set()

    display = TreeDisplay(sys.stdout)
    source = ClientSource(AsyncClient(data_dir, timeout_s=10.0))
    try:
        await watch(source, display, stop=stopping)
    except BaseException:
        stop.set()
        raise
    finally:
        display.close()
        await source.aclose()


def _mcp_specs(value: str) -> tuple[Any, ...]:
    """``--mcp``: inline JSON (starts with ``{``) or a JSON/TOML file."""
    from hivemesh.tools.spec import load_mcp_config, parse_mcp_config

    if value.lstrip().startswith("{"):
        return parse_mcp_config(value, "--mcp")
    return load_mcp_config(value)
