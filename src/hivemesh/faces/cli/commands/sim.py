"""``hivemesh sim --seeds A..B [--nodes N] [--json]``: the seed campaign."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from hivemesh.sim.campaign import default_options, parse_seeds, run_campaign
from hivemesh.sim.cluster import Cluster


def register(sub: Any) -> None:
    """Add the ``sim`` subcommand."""
    p = sub.add_parser("sim", help="run the deterministic simulator over many seeds")
    p.add_argument("--seeds", default="1..100", help="A..B inclusive, or a list A,B,C")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--workload", choices=["journal", "claims", "plan", "clock"], default="journal")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    factory: Any = Cluster
    if args.workload == "plan":
        from hivemesh.roles.simplan import PlanCluster

        factory = PlanCluster
    elif args.workload == "clock":
        from hivemesh.sim.adversary import ClockAdversaryCluster

        factory = ClockAdversaryCluster
    summary = run_campaign(
        seeds,
        default_options(args.nodes, args.workload),
        jobs=args.jobs,
        factory=factory,
        workload=args.workload,
    )
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        t = summary["totals"]
        print(
            f"simulated {summary['runs']} seeds x {summary['nodes']} nodes: "
            f"{t.get('frames_sent', 0):,} frames, {t.get('frames_lost', 0):,} lost, "
            f"{t.get('frames_duplicated', 0):,} duplicated, {t.get('partitions', 0)} partitions, "
            f"{t.get('crashes', 0)} crashes, {t.get('forgeries', 0)} forgeries"
        )
        print(f"violations: {summary['violations']}  trace digest: {summary['trace_digest']}")
        if "plan_leaves" in t:
            print(
                f"plan: {t['plan_leaves']} leaves, "
                f"{t.get('plan_duplicate_results', 0)} duplicate results (detected, ignored)"
            )
        if "backdated_claims" in t:
            print(
                f"clock adversary: {t['backdated_claims']} backdated name claims, "
                f"{t.get('backdated_claims_checked', 0)} on names held for longer than the bound"
            )
        if summary["claim_duplicate_rate"] is not None:
            print(
                f"claims: {t.get('claim_executions', 0)} executions, "
                f"{t.get('claim_duplicates', 0)} duplicates "
                f"({summary['claim_duplicate_rate']:.2%} duplicate-execution rate)"
            )
        for seed, problems in summary["examples"].items():
            print(f"  seed {seed}: {'; '.join(problems)}")
        for cmd in summary["replay"]:
            print(f"  replay: {cmd}")
    return 1 if summary["violations"] else 0
