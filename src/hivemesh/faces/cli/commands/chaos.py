"""``hivemesh chaos``: real daemons in network namespaces, faults by a seed, checks.

``hivemesh chaos [--scenario NAME] [--nodes N] [--duration S] [--seed N] [--json]``
runs one scenario (``--runs K``: K seeds from ``--seed`` on; ``--scenario
all``: every scenario in turn) and prints, per run, the verdict, the seed
to replay and the fault timeline. Exit 1 if any run failed a check. Needs
root (namespaces, nftables); see :mod:`hivemesh.chaos`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hivemesh.client.cli import add_common


def register(sub: Any) -> None:
    """Add the ``chaos`` subcommand."""
    from hivemesh.chaos.scenarios import SCENARIOS

    p = sub.add_parser(
        "chaos",
        help="chaos runs of real daemons in network namespaces (root)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", default="mixed", choices=[*sorted(SCENARIOS), "all"])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--duration", type=float, default=15.0, help="seconds of faults and load")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=1, help="seeds seed..seed+runs-1")
    p.add_argument("--keep", action="store_true", help="keep the data dirs (printed)")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.chaos import SCENARIOS, run_scenario
    from hivemesh.client.cli import emit_error
    from hivemesh.errors import HivemeshError

    names = sorted(SCENARIOS) if args.scenario == "all" else [args.scenario]
    failed = 0
    for k in range(args.runs):
        for name in names:
            seed = args.seed + k
            try:
                report = run_scenario(
                    name, seed=seed, nodes=args.nodes, duration_s=args.duration, keep=args.keep,
                    progress=None if args.json else lambda m: print(f"  .. {m}", file=sys.stderr),
                )  # fmt: skip
            except HivemeshError as exc:
                return emit_error(args, exc)
            failed += report.verdict != "pass"
            if args.json:
                print(json.dumps(report.to_json(), sort_keys=True), flush=True)
            else:
                print(report.render(), flush=True)
    return 1 if failed else 0
