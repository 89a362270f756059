"""Failure detection quality of SWIM membership, in deterministic simulation.

Ours: :class:`~hivemesh.core.membership.Membership` with memberlist's LAN
defaults (Lifeguard-style suspicion: the timeout starts at 6x the minimum and
shrinks with independent confirmations). Baseline, same run, same seeds:
the same protocol with a fixed suspicion timeout (``max mult = 1``), i.e.
classic SWIM / pre-Lifeguard memberlist. Figures: time until every live
member marks a crashed member down, and false DOWNs of live members during a
lossy soak. Time is simulated (the simulator's SWIM network,
:class:`hivemesh.sim.swim.SwimNet`), so the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.membership import MembershipConfig, MemberState
from hivemesh.sim.swim import SwimNet

DESCRIPTION = "SWIM crash detection time and false DOWNs under loss (simulated)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Benchmark options."""
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--loss", type=float, default=0.10, help="per-frame loss probability")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--soak-s", type=int, default=600, help="simulated soak per seed")


def _measure(cfg: MembershipConfig, args: argparse.Namespace) -> tuple[list[int], int, int]:
    times, false_down, missed = [], 0, 0
    for seed in range(args.seeds):
        net = SwimNet(seed, loss=args.loss, cfg=cfg)
        first = net.add(1)
        for i in range(2, args.nodes + 1):
            net.add(i).join(first.address, [], 0)
        net.run(60 * cfg.probe_interval_ms)  # converge
        net.run(args.soak_s * 1000)  # lossy soak, nobody crashes
        victim = sorted(net.nodes)[seed % args.nodes]
        net.crash(net.nodes[victim])
        t0 = net.now
        bound = 4 * cfg.detection_bound_ms(args.nodes)
        if net.run(bound, net.all_see(victim, MemberState.DOWN), news_only=True):
            times.append(net.now - t0)
        else:
            missed += 1
        false_down += sum(
            1 for _, ch in net.log if ch.state is MemberState.DOWN and ch.address != victim
        )
    return times, false_down, missed


def run(args: argparse.Namespace) -> BenchResult:
    """Run ours and the baseline over the same seeds."""
    ours_cfg = MembershipConfig.lan()
    base_cfg = MembershipConfig(suspicion_max_timeout_mult=1)
    ours, ours_fd, ours_miss = _measure(ours_cfg, args)
    base, base_fd, base_miss = _measure(base_cfg, args)
    bound = ours_cfg.detection_bound_ms(args.nodes)
    node_hours = args.seeds * args.nodes * args.soak_s / 3600
    p50 = float(statistics.median(ours)) if ours else float("inf")
    worst = float(max(ours)) if ours else float("inf")
    name = "fixed-suspicion SWIM"
    return BenchResult(
        "swim",
        [
            Metric(
                "detection p50",
                p50,
                float(statistics.median(base)) if base else None,
                "ms",
                name,
                higher_is_better=False,
            ),
            Metric(
                "detection max",
                worst,
                float(max(base)) if base else None,
                "ms",
                name,
                higher_is_better=False,
                goal=f"<= bound {bound} ms",
                goal_met=worst <= bound and ours_miss == 0,
            ),
            Metric(
                "false DOWN per node-hour",
                ours_fd / node_hours,
                base_fd / node_hours,
                "1/h",
                name,
                higher_is_better=False,
            ),
        ],
        {
            "nodes": args.nodes,
            "loss": args.loss,
            "seeds": args.seeds,
            "soak_s": args.soak_s,
            "config": "memberlist DefaultLANConfig (probe 1 s, timeout 500 ms, k=3, mult 4/6)",
            "missed (ours, baseline)": (ours_miss, base_miss),
        },
    )
