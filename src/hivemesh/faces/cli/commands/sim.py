"""``hivemesh sim``: a seed campaign over the deterministic simulator.

``hivemesh sim --seeds A..B [--nodes N] [--workload W] [--jobs J] [--json]``
runs one workload at one node count; ``hivemesh sim --campaign ci --seeds
1..10000`` runs the CI mix, where each seed picks its own workload and node
count (:func:`hivemesh.sim.campaign.ci_scenario`).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from hivemesh.sim.campaign import (
    WORKLOADS,
    default_options,
    parse_seeds,
    run_campaign,
    run_mix,
    workload_factory,
)


def register(sub: Any) -> None:
    """Add the ``sim`` subcommand."""
    p = sub.add_parser("sim", help="run the deterministic simulator over many seeds")
    p.add_argument("--seeds", default="1..100", help="A..B inclusive, or a list A,B,C")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="journal")
    p.add_argument(
        "--campaign",
        choices=["ci"],
        help="a mixed campaign: each seed picks its workload and node count "
        "(--nodes and --workload are then ignored)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    if args.campaign == "ci":
        summary = run_mix(seeds, jobs=args.jobs)
    else:
        summary = run_campaign(
            seeds,
            default_options(args.nodes, args.workload),
            jobs=args.jobs,
            factory=workload_factory(args.workload),
            workload=args.workload,
        )
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print(summary)
    return 1 if summary["violations"] else 0


def _print(summary: dict[str, Any]) -> None:
    t = summary["totals"]
    nodes = summary["nodes"]
    size = f"{min(nodes)}-{max(nodes)}" if isinstance(nodes, list) else str(nodes)
    print(
        f"simulated {summary['runs']} seeds x {size} nodes: "
        f"{t.get('frames_sent', 0):,} frames, {t.get('frames_lost', 0):,} lost, "
        f"{t.get('frames_duplicated', 0):,} duplicated, {t.get('partitions', 0)} partitions, "
        f"{t.get('crashes', 0)} crashes, {t.get('forgeries', 0)} forgeries"
    )
    for name, row in summary.get("by_workload", {}).items():
        sizes = ", ".join(f"{n}:{c}" for n, c in row["nodes"].items())
        print(f"  {name}: {row['runs']} seeds, {row['violations']} violations (nodes {sizes})")
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
    if "lease_ops" in t:
        print(
            f"leases: {t['lease_ops']:,} operations ({t.get('lease_ok', 0):,} ok, "
            f"{t.get('lease_unknown', 0):,} unknown), {t.get('lease_split_prepares', 0)} "
            "split prepares after a holder's node died"
        )
    if "swim_frames" in t:
        print(
            f"membership: {t['swim_frames']:,} SWIM frames, {t.get('stalls', 0)} stalled loops, "
            f"{t.get('broken_links', 0)} broken links, {t.get('false_down', 0)} DOWNs of live "
            "members under faults"
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
