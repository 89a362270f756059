"""``hivemesh demo``: start a local swarm and watch it keep its promises.

Starts separate node processes on loopback, narrates what happens (nodes
find each other, shared context spreads, a node is killed with SIGKILL and
detected as down, writes continue, the node restarts and catches up), checks
every step, ends with a summary and exits 0 only if every check passed.
``--json`` prints a machine-readable summary instead of the narration.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = sub.add_parser("demo", help="run a local swarm and check its guarantees (< 60 s)")
    p.add_argument("--nodes", type=int, default=5, help="how many node processes (default 5)")
    p.add_argument("--dir", help="keep the nodes' data dirs here (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.runtime.demo import run_demo

    if args.nodes < 3 or args.nodes > 12:
        print("error: --nodes must be 3..12", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        if not args.json:
            print(line, flush=True)

    report = run_demo(nodes=args.nodes, root=args.dir, say=say)
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
