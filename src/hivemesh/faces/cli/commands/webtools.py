"""``hivemesh webtools``: the web-tools MCP server (stdio, or streamable HTTP).

Over stdio (the default) it is what an MCP client config launches::

    {"mcpServers": {"web": {"command": "hivemesh",
                            "args": ["webtools", "--route", "proxy-1=http://127.0.0.1:8081"]}}}

With ``--http HOST:PORT`` it serves ``http://HOST:PORT/mcp`` and prints that
URL (port 0: an ephemeral one). See :mod:`hivemesh.webtools.server`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``webtools`` subcommand."""
    p = sub.add_parser("webtools", help="serve the web tools over MCP (stdio or HTTP)")
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="NAME=PROXY_URL",
        help="a route through an HTTP proxy (repeatable); 'direct' always exists",
    )
    p.add_argument("--default-route", default="direct")
    p.add_argument("--timeout-s", type=float, default=15.0, help="deadline of one fetch")
    p.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024, help="largest page")
    p.add_argument("--allow-host", action="append", help="only fetch from these hosts")
    p.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP instead of stdio")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.config import parse_endpoint
    from hivemesh.errors import HivemeshError
    from hivemesh.webtools.fetch import Fetcher
    from hivemesh.webtools.server import serve_http, serve_stdio

    routes: dict[str, str | None] = {"direct": None}
    try:
        for spec in args.route:
            name, eq, url = spec.partition("=")
            if not eq or not name.strip() or not url.strip():
                raise ValueError(f"--route must be NAME=PROXY_URL, not {spec!r}")
            routes[name.strip()] = url.strip()
        fetcher = Fetcher(
            routes,
            default_route=args.default_route,
            timeout_s=args.timeout_s,
            max_bytes=args.max_bytes,
            allowed_hosts=frozenset(args.allow_host) if args.allow_host else None,
        )
        if args.http:
            host, port = parse_endpoint(args.http)
            serve_http(fetcher, host, port)
        else:
            serve_stdio(fetcher)
    except (ValueError, HivemeshError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
