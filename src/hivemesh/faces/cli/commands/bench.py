"""``hivemesh bench NAME [--json]``: run a benchmark with its same-run baseline."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hivemesh import bench


def register(sub: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser("bench", help="run a benchmark beside its baseline")
    bsub = p.add_subparsers(dest="bench_name", metavar="NAME", required=True)
    for name in bench.available():
        mod = bench.load(name)
        bp = bsub.add_parser(name, help=getattr(mod, "DESCRIPTION", ""))
        bp.add_argument("--json", action="store_true", help="print one JSON object")
        mod.add_arguments(bp)
        bp.set_defaults(func=_run, bench_module=mod)


def _run(args: argparse.Namespace) -> int:
    result: bench.BenchResult = args.bench_module.run(args)
    if args.json:
        print(json.dumps(result.to_json(), indent=None, sort_keys=True))
    else:
        print(result.render())
    return 0
