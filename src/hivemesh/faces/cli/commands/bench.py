"""``hivemesh bench NAME [--json]``: run a benchmark with its same-run baseline.

``hivemesh bench all [--quick] [--only A,B] [--json] [--update-md BENCHMARKS.md]``
runs every benchmark, each in its own process, and prints one table
(measure, hivemesh, baseline, ratio, goal, met, load average); see
:mod:`hivemesh.bench.suite`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from hivemesh import bench


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser("bench", help="run a benchmark beside its baseline (or all of them)")
    bsub = p.add_subparsers(dest="bench_name", metavar="NAME", required=True)
    for name in bench.available():
        mod = bench.load(name)
        bp = bsub.add_parser(name, help=getattr(mod, "DESCRIPTION", ""))
        bp.add_argument("--json", action="store_true", help="print one JSON object")
        mod.add_arguments(bp)
        bp.set_defaults(func=_run, bench_module=mod)
    ap = bsub.add_parser("all", help="every benchmark in turn, one table")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated benchmarks (default: all)")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="deadline per benchmark")
    ap.add_argument(
        "--update-md",
        metavar="PATH",
        default=None,
        help="rewrite the generated summary block of this BENCHMARKS.md",
    )
    ap.set_defaults(func=_run_all)


def _run(args: argparse.Namespace) -> int:
    result: bench.BenchResult = args.bench_module.run(args)
    if args.json:
        print(json.dumps(result.to_json(), indent=None, sort_keys=True))
    else:
        print(result.render())
    return 0


def _run_all(args: argparse.Namespace) -> int:
    from hivemesh.bench import suite

    names = [n for n in args.only.split(",") if n] or bench.available()
    unknown = sorted(set(names) - set(bench.available()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}", file=sys.stderr)
        return 2

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows, wall_s = suite.run_suite(
        names, quick=args.quick, timeout_s=args.timeout_s, progress=progress
    )
    if args.update_md:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        block = suite.render_markdown(rows, quick=args.quick, wall_s=wall_s, when=when)
        suite.update_markdown(Path(args.update_md), block)
    if args.json:
        doc = {"quick": args.quick, "wall_s": round(wall_s, 1), "rows": [r.to_json() for r in rows]}
        print(json.dumps(doc, sort_keys=True))
    else:
        print(suite.render_table(rows))
    failed = [r for r in rows if r.met.startswith(("error", "timeout"))]
    return 1 if failed else 0
