"""``hivemesh mcp``: serve the local node as an MCP server (see :mod:`hivemesh.faces.mcp`).

Over stdio by default (what a desktop assistant or IDE agent starts); with
``--http`` over streamable HTTP at ``http://HOST:PORT/mcp``, on 127.0.0.1
unless a token is given (``--token`` or ``$HIVEMESH_MCP_TOKEN``; then every
request must carry ``Authorization: Bearer TOKEN``). The node must be
running (``hivemesh up``); exit code 3 if it is not.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, exit_code
from hivemesh.errors import HivemeshError


def register(sub: Any) -> None:
    """Add the ``mcp`` subcommand."""
    p = sub.add_parser(
        "mcp",
        help="serve the local node as an MCP server (stdio, or --http)",
        description="Serve the local node's commands as MCP tools and its contexts and "
        "plans as MCP resources.",
    )
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765; 0: any)")
    p.add_argument(
        "--token",
        default=None,
        help="bearer token HTTP clients must send (default $HIVEMESH_MCP_TOKEN)",
    )
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.client.aio import AsyncClient
    from hivemesh.faces.httpguard import check_binding
    from hivemesh.faces.mcp import MeshMcp, serve_http, serve_stdio

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout is the protocol's
    token = args.token or os.environ.get("HIVEMESH_MCP_TOKEN") or None
    client = AsyncClient(data_dir_of(args), timeout_s=30.0)
    face = MeshMcp(client)

    async def main() -> None:
        from hivemesh.commands import Status

        if args.http:
            check_binding(args.host, token)  # refused before the node is even asked
        await client.run(Status())  # the node is there (else: DaemonNotRunning)
        if not args.http:
            await serve_stdio(face)
            return

        def ready(port: int) -> None:
            print(f"hivemesh mcp: serving http://{args.host}:{port}/mcp", file=sys.stderr)

        await serve_http(face, host=args.host, port=args.port, token=token, on_ready=ready)

    try:
        asyncio.run(main())
    except HivemeshError as exc:
        print(f"hivemesh mcp: {exc} [{exc.code}]", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    if face.failure is not None:
        print(f"hivemesh mcp: {face.failure}", file=sys.stderr)
        return 1
    return 0
