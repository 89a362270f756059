"""``hivemesh dashboard``: serve the live web dashboard of the local node.

Serves http://127.0.0.1:7480/ by default (loopback: no token needed). Bound
to another address (``--host 0.0.0.0``) it requires a token: ``--token``,
``--token-file`` or ``HIVEMESH_DASHBOARD_TOKEN``; without one a random token
is made and printed in the URL. See :mod:`hivemesh.faces.dashboard`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit_error, wants_json
from hivemesh.errors import ConfigError, HivemeshError

#: The environment variable a token may come from.
TOKEN_ENV = "HIVEMESH_DASHBOARD_TOKEN"


def register(sub: Any) -> None:
    """Add the ``dashboard`` subcommand."""
    p = sub.add_parser(
        "dashboard",
        help="serve the live web dashboard of the local node (peers, plan, audit, telemetry)",
        description=(
            "Serve the live web dashboard of the local node: peers, plan trees, the audit and "
            "its escalations (answerable from the page), context, alerts and telemetry charts. "
            "On 127.0.0.1 by default (no token); bound elsewhere every request needs the token "
            f"(--token, --token-file or ${TOKEN_ENV}; one is made and printed if none is given)."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7480, help="port (default 7480; 0: any free port)")
    p.add_argument("--token", help=f"token required of every request (or ${TOKEN_ENV})")
    p.add_argument("--token-file", help="read the token from this file")
    add_common(p)
    p.set_defaults(func=_run)


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            text = Path(args.token_file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read --token-file: {exc}") from None
        if not text:
            raise ConfigError("--token-file is empty")
        return text
    token: str | None = args.token or os.environ.get(TOKEN_ENV) or None
    return token


def _run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except HivemeshError as exc:
        return emit_error(args, exc)


async def _serve(args: argparse.Namespace) -> int:
    from hivemesh.faces.dashboard.server import DashboardServer, is_loopback
    from hivemesh.faces.dashboard.source import ControlSource

    if not 0 <= args.port <= 65535:
        raise ConfigError("--port must be 0..65535")
    token = _token(args)
    made = False
    if token is None and not is_loopback(args.host):
        token, made = secrets.token_urlsafe(24), True
    source = ControlSource(data_dir_of(args))
    await asyncio.to_thread(source.client.call, "status", 5.0)  # a daemon answers, or exit now
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = DashboardServer(source, host=args.host, port=args.port, token=token)
    async with server:
        url = server.url + (f"?token={token}" if made else "")
        if wants_json(args):
            print(json.dumps({"url": server.url, "port": server.port, "token": token}), flush=True)
        else:
            print(f"dashboard of {source.label} on {url} (Ctrl-C to stop)", flush=True)
        failed = asyncio.create_task(server.failed.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        stopped.cancel()
    if server.failed.is_set():
        print("error: the dashboard failed (see the log above)", file=sys.stderr)
        return 1
    return 0
