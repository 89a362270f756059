"""``hivemesh audit``: the 50-shop price audit's node roles, status and report.

* ``hivemesh audit node --role ROLE --fixture READY`` runs one audit role on
  its own node (:mod:`hivemesh.audit.node`); ``READY`` is the fixture's
  ready line (``hivemesh fixture shops --json``), inline or a file;
* ``hivemesh audit status`` asks a running node for the latest audit's
  progress;
* ``hivemesh audit report --out DIR`` writes the report (Markdown, CSV,
  JSON) from a running node's journal.

``hivemesh demo`` runs the whole audit on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hivemesh.client.cli import (
    add_common,
    data_dir_of,
    emit_error,
    run_command,
    run_with_client,
)
from hivemesh.commands import AuditExport, AuditStatus
from hivemesh.errors import HivemeshError

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``audit`` subcommand."""
    p = sub.add_parser("audit", help="the price audit: role nodes, status, report")
    asub = p.add_subparsers(dest="audit_cmd", metavar="CMD", required=True)
    n = asub.add_parser("node", help="run one audit role on a node")
    add_common(n)
    n.add_argument(
        "--role", required=True, choices=["supervisor", "executor", "reflector", "observer"]
    )
    n.add_argument("--fixture", default="", help="the fixture's ready line (JSON) or a file")
    n.add_argument("--listen", default="127.0.0.1:0")
    n.add_argument("--bootstrap", action="append", help="[address@]host:port (repeatable)")
    n.add_argument("--name", default=None, help="claim this node name")
    n.add_argument("--batch-size", type=int, default=10)
    n.add_argument("--window", type=int, default=3, help="batches unsettled at most (supervisor)")
    n.add_argument("--max-concurrent", type=int, default=4, help="shops at once (executor)")
    n.add_argument("--lease-ttl-ms", type=int, default=4000)
    n.add_argument("--reflect-wait-s", type=float, default=3.0)
    n.add_argument("--pause-before-submit", default="", help=argparse.SUPPRESS)
    n.add_argument("--mcp", metavar="CONFIG", help="more MCP servers: a file or inline JSON")
    n.add_argument("--notes-tool", default="", help="note each audited shop with this tool")
    n.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    n.set_defaults(func=_node)
    s = asub.add_parser("status", help="the latest audit's progress")
    add_common(s)
    s.set_defaults(func=lambda a: run_command(a, AuditStatus(), _status))
    r = asub.add_parser("report", help="write the audit report from a node's journal")
    add_common(r)
    r.add_argument("--out", required=True, help="directory for report.md/.csv/.json")
    r.add_argument("--ground-truth", default="", help="ground-truth.json to check against")
    r.set_defaults(func=_report)


def _status(doc: Any) -> str:
    if not doc.get("audit"):
        return "no audit in this node's journal"
    return (
        f"audit {doc['audit']}: {doc['done']}/{doc['shops']} shops done, "
        f"{len(doc['batches'])} batches published, {doc['open_questions']} open questions, "
        f"{doc['takeovers']} takeovers{' (finished)' if doc['finished'] else ''}"
    )


def _fixture(value: str) -> dict[str, Any]:
    if not value:
        return {}
    text = value if value.lstrip().startswith("{") else Path(value).read_text(encoding="utf-8")
    doc = json.loads(text)
    if not isinstance(doc, dict) or not {"url", "routes", "market"} <= set(doc):
        raise ValueError("--fixture must be the fixture's ready line: {url, routes, market, ...}")
    return doc


def _mcp(value: str) -> tuple[Any, ...]:
    from hivemesh.tools.spec import load_mcp_config, parse_mcp_config

    if value.lstrip().startswith("{"):
        return parse_mcp_config(value, "--mcp")
    return load_mcp_config(value)


def _node(args: argparse.Namespace) -> int:
    from hivemesh.audit.node import RoleOptions, serve_role

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        opts = RoleOptions(
            role=args.role,
            data_dir=data_dir_of(args),
            listen=args.listen,
            bootstrap=tuple(args.bootstrap or ()),
            fixture=_fixture(args.fixture),
            batch_size=args.batch_size,
            window=args.window,
            max_concurrent=args.max_concurrent,
            lease_ttl_ms=args.lease_ttl_ms,
            reflect_wait_s=args.reflect_wait_s,
            pause_before_submit=args.pause_before_submit,
            json=args.json,
            name=args.name,
            mcp=_mcp(args.mcp) if args.mcp else (),
            notes_tool=args.notes_tool,
        )
        return asyncio.run(serve_role(opts))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HivemeshError as exc:
        return emit_error(args, exc)


def _report(args: argparse.Namespace) -> int:
    from hivemesh.audit.report import build_report, write_report

    def op(client: Any) -> Any:
        doc = client.run(AuditExport()).to_wire()
        truth = None
        if args.ground_truth:
            truth = json.loads(Path(args.ground_truth).read_text(encoding="utf-8"))
        report = build_report(doc, ground_truth=truth)
        return {"paths": write_report(report, args.out), "summary": report["summary"]}

    return run_with_client(
        args, op, lambda r: "\n".join(f"{k}: {v}" for k, v in r["paths"].items())
    )
