"""Failure detection quality of SWIM membership, in deterministic simulation.

Ours: :class:`~hivemesh.core.membership.Membership` with memberlist's LAN
defaults (Lifeguard-style suspicion: the timeout starts at 6x the minimum and
shrinks with independent confirmations). Baseline, same run, same seeds:
the same protocol with a fixed suspicion timeout (``max mult = 1``), i.e.
classic SWIM / pre-Lifeguard memberlist. Figures: time until every live
member marks a crashed member down, and false DOWNs of live members during a
lossy soak. Time is simulated, so the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Callable

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.identity import address_of
from hivemesh.core.membership import Membership, MembershipConfig, MemberState

DESCRIPTION = "SWIM crash detection time and false DOWNs under loss (simulated)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Benchmark options."""
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--loss", type=float, default=0.10, help="per-frame loss probability")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--soak-s", type=int, default=600, help="simulated soak per seed")


class _Net:
    def __init__(self, seed: int, n: int, loss: float, cfg: MembershipConfig) -> None:
        self.rng = random.Random(f"{seed}/net")
        self.loss = loss
        self.now = 0
        self.heap: list[tuple[int, int, str, str, bytes]] = []
        self.order = 0
        self.nodes: dict[str, Membership] = {}
        self.false_down = 0
        for i in range(1, n + 1):
            a = address_of(bytes([i]) * 32)
            self.nodes[a] = Membership(
                a, [f"10.0.0.{i}:7000"], random.Random(f"{seed}/{i}"), cfg, 0, self._sender(a)
            )
        first = sorted(self.nodes)[0]
        for a in sorted(self.nodes)[1:]:
            self.nodes[a].join(first, [], 0)

    def _sender(self, src: str) -> Callable[[str, bytes], None]:
        return lambda dst, frame: self._send(src, dst, frame)

    def _send(self, src: str, dst: str, frame: bytes) -> None:
        if self.rng.random() >= self.loss:
            self.order += 1
            t = self.now + 1 + self.rng.randrange(10)
            heapq.heappush(self.heap, (t, self.order, src, dst, frame))

    def run(self, duration_ms: int, victim: str | None = None) -> int | None:
        """Advance; with ``victim`` return when all live members see it down."""
        end = self.now + duration_ms
        while True:
            if victim is not None and all(_down(m, victim) for m in self.nodes.values()):
                return self.now
            t = min(m.next_deadline() for m in self.nodes.values())
            if self.heap:
                t = min(t, self.heap[0][0])
            if t > end:
                self.now = end
                return None
            self.now = max(self.now, t)
            while self.heap and self.heap[0][0] <= self.now:
                _, _, src, dst, frame = heapq.heappop(self.heap)
                if src in self.nodes and dst in self.nodes:
                    self.nodes[dst].receive(src, frame, self.now)
            for a in sorted(self.nodes):
                m = self.nodes[a]
                if m.next_deadline() <= self.now:
                    m.handle_timer(self.now)
                for ch in m.changes():
                    if ch.state is MemberState.DOWN and ch.address != victim:
                        self.false_down += 1


def _down(m: Membership, victim: str) -> bool:
    rec = m.member(victim)
    return rec is not None and rec.state is MemberState.DOWN


def _measure(cfg: MembershipConfig, args: argparse.Namespace) -> tuple[list[int], int, int]:
    times, false_down, missed = [], 0, 0
    for seed in range(args.seeds):
        net = _Net(seed, args.nodes, args.loss, cfg)
        net.run(60 * cfg.probe_interval_ms)  # converge
        net.run(args.soak_s * 1000)  # lossy soak, nobody crashes
        victim = sorted(net.nodes)[seed % args.nodes]
        del net.nodes[victim]
        t0 = net.now
        done = net.run(4 * cfg.detection_bound_ms(args.nodes), victim)
        if done is None:
            missed += 1
        else:
            times.append(done - t0)
        false_down += net.false_down
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
