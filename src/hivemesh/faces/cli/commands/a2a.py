"""``hivemesh a2a``: serve the local node as an A2A agent (see :mod:`hivemesh.faces.a2a`).

The Agent Card is at ``http://HOST:PORT/.well-known/agent-card.json`` and
the JSON-RPC endpoint at ``http://HOST:PORT/``; each A2A task is a goal of
the planner, its state following the plan tree. Bound to 127.0.0.1 unless
a token is given (``--token`` or ``$HIVEMESH_A2A_TOKEN``; then required as
``Authorization: Bearer TOKEN``). With ``--json`` the ready line is
``{"url", "card"}``. The node must be running (``hivemesh up``; exit code
3 if not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, exit_code, wants_json
from hivemesh.errors import HivemeshError


def register(sub: Any) -> None:
    """Add the ``a2a`` subcommand."""
    p = sub.add_parser(
        "a2a",
        help="serve the local node as an A2A agent (Agent Card + JSON-RPC)",
        description="Publish the node's Agent Card and run A2A tasks as planner goals.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8766, help="port (default 8766; 0: any)")
    p.add_argument("--token", default=None, help="bearer token (default $HIVEMESH_A2A_TOKEN)")
    p.add_argument(
        "--public-url", default=None, help="the URL the card names (default http://HOST:PORT/)"
    )
    p.add_argument("--quorum", default="majority", choices=["count", "majority", "fraction"])
    p.add_argument("--quorum-value", type=float, default=0)
    p.add_argument("--scorers", type=int, default=3, help="scorers a goal expects")
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--settle-ms", type=int, default=200)
    p.add_argument("--task-timeout-s", type=float, default=3600.0, help="a goal's deadline")
    p.add_argument(
        "--max-tasks",
        type=int,
        default=1000,
        help="tasks kept in memory (default 1000): the oldest ended one is forgotten first; "
        "when all are running a new task is refused",
    )
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.client.aio import AsyncClient
    from hivemesh.commands import Status
    from hivemesh.faces.a2a import serve_a2a
    from hivemesh.faces.httpguard import check_binding

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    token = args.token or os.environ.get("HIVEMESH_A2A_TOKEN") or None
    client = AsyncClient(data_dir_of(args), timeout_s=30.0)
    goal_args = {
        "quorum": args.quorum,
        "quorum_value": args.quorum_value,
        "scorers": args.scorers,
        "max_depth": args.max_depth,
        "settle_ms": args.settle_ms,
    }

    def ready(port: int) -> None:
        url = f"http://{args.host}:{port}/"
        card = url + ".well-known/agent-card.json"
        if wants_json(args):
            print(json.dumps({"url": url, "card": card}), flush=True)
        else:
            print(f"hivemesh a2a: agent card at {card} (Ctrl-C to stop)", flush=True)

    async def main() -> None:
        check_binding(args.host, token)  # before anything else
        await client.run(Status())  # the node is there (else: DaemonNotRunning)
        await serve_a2a(
            client,
            host=args.host,
            port=args.port,
            token=token,
            goal_args=goal_args,
            timeout_s=args.task_timeout_s,
            max_tasks=args.max_tasks,
            public_url=args.public_url,
            on_ready=ready,
        )

    try:
        asyncio.run(main())
    except HivemeshError as exc:
        print(f"hivemesh a2a: {exc} [{exc.code}]", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    return 0
