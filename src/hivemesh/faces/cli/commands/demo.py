"""``hivemesh demo``: the 50-shop price audit on this machine (about a minute).

``hivemesh demo`` (or ``hivemesh demo audit``) starts the fixture world and
a swarm of node processes -- metrics collector, observer, reflector,
supervisor and executors -- and runs the whole audit with live progress per
batch: the agents share context, call tools through MCP, recover from
CAPTCHAs and flaky shops, ask the operator (the demo answers as the
operator), and one executor is killed part-way and taken over. It ends with
the report's path, a summary table and a telemetry summary, and exits 0
only if every shop's prices equal the fixture's ground truth. ``--json``
prints a machine-readable summary instead. See :mod:`hivemesh.audit.demo`.

``hivemesh demo mesh`` is the fabric tour: nodes find each other, share
context, a node is killed, detected, restarted and catches up
(:mod:`hivemesh.client.demo`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = sub.add_parser(
        "demo", help="run the price audit on a local swarm (~1 min); 'mesh': the tour"
    )
    p.add_argument("which", nargs="?", default="audit", choices=["audit", "mesh"])
    p.add_argument("--dir", help="keep the nodes' data dirs (and the report) here")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.add_argument("--nodes", type=int, default=5, help="mesh: how many node processes (3..12)")
    p.add_argument(
        "--mesh",
        metavar="URL",
        help="mesh: run the nodes in broker mode (nats://…, redis://…; docs/broker.md)",
    )
    p.add_argument("--executors", type=int, default=3, help="audit: executor processes (3..8)")
    p.add_argument("--batch-size", type=int, default=10, help="audit: shops per batch")
    p.add_argument("--seed", type=int, default=7, help="audit: the fixture world's seed")
    p.add_argument("--no-kill", action="store_true", help="audit: do not kill an executor")
    p.add_argument(
        "--dashboard",
        nargs="?",
        type=int,
        const=7480,
        metavar="PORT",
        help="audit: serve the live dashboard on 127.0.0.1:PORT (default 7480) and leave "
        "the human-only shop's question for you to answer there",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.which == "mesh":
        return _mesh(args)
    return _audit(args)


def _audit(args: argparse.Namespace) -> int:
    from hivemesh.audit.demo import run_audit

    if not 3 <= args.executors <= 8 or not 1 <= args.batch_size <= 50:
        print("error: --executors must be 3..8 and --batch-size 1..50", file=sys.stderr)
        return 2
    import tempfile

    kw: dict[str, Any] = {
        "root": args.dir or tempfile.mkdtemp(prefix="hivemesh-audit-"),  # kept: the report
        "executors": args.executors,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "kill": not args.no_kill,
    }
    if args.dashboard is not None:  # a human answers on the page: give them time
        kw.update(dashboard_port=args.dashboard, total_timeout_s=900.0)
    if args.json:
        run = run_audit(**kw)
        print(json.dumps(run.to_json(), sort_keys=True))
        return 0 if run.ok else 1
    from hivemesh.audit.console import AuditConsole

    console = AuditConsole()
    with console:
        if args.dashboard is not None:
            kw["operator"] = _page_operator(console.say)
            kw["on_finished"] = _linger(console.say)
        run = run_audit(**kw, progress=console.progress, say=console.say)
    console.summary(run)
    return 0 if run.ok else 1


def _page_operator(say: Any) -> Any:
    """An operator that answers the agents' routine questions ("skip") and
    leaves the human-only shop's to the person at the dashboard, once told
    the access code the fixture gave them."""
    told: set[str] = set()

    def operator(question: dict[str, Any], brief: dict[str, Any]) -> str | None:
        if question["shop"] != brief["shop"]:
            return "skip"
        if question["id"] not in told:
            told.add(question["id"])
            say(
                f"{question['shop']} asks for a human: answer it on the dashboard "
                f"with the access code {brief['code']}"
            )
        return None

    return operator


def _linger(say: Any) -> Any:
    """Keep the swarm and its dashboard up after the audit until Ctrl-C
    (at most an hour), so the page's final picture can be looked at."""

    def wait(run: Any) -> None:
        say(f"audit done: the dashboard stays up at {run.dashboard} (Ctrl-C to stop)")
        try:
            threading.Event().wait(3600)
        except KeyboardInterrupt:
            return

    return wait


def _mesh(args: argparse.Namespace) -> int:
    from hivemesh.client.demo import run_demo

    if args.nodes < 3 or args.nodes > 12:
        print("error: --nodes must be 3..12", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        if not args.json:
            print(line, flush=True)

    report = run_demo(nodes=args.nodes, root=args.dir, say=say, broker=args.mesh)
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
        return 0 if report.ok else 1
    passed = sum(s.ok for s in report.steps)
    print()
    print(f"summary: {passed}/{len(report.steps)} checks passed in {report.seconds:.1f} s")
    for s in report.steps:
        print(f"  {'PASS' if s.ok else 'FAIL'}  {s.name}")
    print("the swarm kept every promise" if report.ok else "some checks FAILED")
    return 0 if report.ok else 1
