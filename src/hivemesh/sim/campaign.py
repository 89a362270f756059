"""Run many seeds and summarise (``hivemesh sim``).

Two kinds of campaign:

* :func:`run_campaign` -- one workload, one node count, many seeds
  (``hivemesh sim --seeds 1..1000 --nodes 5 --workload claims``);
* :func:`run_mix` -- the CI campaign (``hivemesh sim --campaign ci``): each
  seed picks its own workload and node count (:func:`ci_scenario`, a pure
  function of the seed), so 10,000 seeds cover every workload from 5 to 50
  nodes, and any failing seed replays alone with the command printed for it.

Seeds run in worker processes (``jobs``), the most expensive first so that no
large seed is left running alone at the end; results are put back in seed
order, so the trace digest does not depend on ``jobs``.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hivemesh.core.membership import MembershipConfig
from hivemesh.sim.cluster import Cluster, SimResult
from hivemesh.sim.memo import verification_memo
from hivemesh.sim.options import FaultOptions, NetworkOptions, SimOptions
from hivemesh.sim.packer import shared_packer

__all__ = [
    "WORKLOADS",
    "ClusterFactory",
    "Scenario",
    "ci_scenario",
    "parse_seeds",
    "run_campaign",
    "run_mix",
    "run_seed",
    "workload_factory",
]


def parse_seeds(spec: str) -> list[int]:
    """``"A..B"`` (inclusive) or ``"A"`` or ``"A,B,C"`` to a list of seeds."""
    seeds: list[int] = []
    for part in spec.split(","):
        if ".." in part:
            a, b = part.split("..", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError(f"empty seed range {part!r}")
            seeds.extend(range(lo, hi + 1))
        else:
            seeds.append(int(part))
    return seeds


class SeedRun(Protocol):
    """One seed's simulation, ready to run."""

    def run(self) -> SimResult:
        """Run it to the end and check it."""
        ...


#: Builds the simulation for one seed (a picklable class or top-level
#: function: campaigns run in worker processes). Workloads above the core,
#: such as the planner's :class:`hivemesh.roles.simplan.PlanCluster`, come in
#: this way.
ClusterFactory = Callable[[str, SimOptions], SeedRun]

#: Every ``--workload``: its simulation, as ``module:attribute`` (imported on
#: first use: the simulator itself imports only the core).
WORKLOADS: dict[str, str] = {
    "journal": "hivemesh.sim.cluster:Cluster",
    "claims": "hivemesh.sim.cluster:Cluster",
    "plan": "hivemesh.roles.simplan:PlanCluster",
    "clock": "hivemesh.sim.adversary:ClockAdversaryCluster",
    "leases": "hivemesh.sim.leases:LeaseCluster",
    "membership": "hivemesh.sim.swim:MembershipCluster",
    # the journal workload's old name (every workload's nodes are Peers now)
    "peer": "hivemesh.sim.cluster:Cluster",
}


def workload_factory(workload: str) -> ClusterFactory:
    """The simulation class of ``workload`` (a key of :data:`WORKLOADS`)."""
    module, _, attr = WORKLOADS[workload].partition(":")
    factory: ClusterFactory = getattr(importlib.import_module(module), attr)
    return factory


def run_seed(seed: int, opts: SimOptions, factory: ClusterFactory = Cluster) -> SimResult:
    """One seeded run (each signature verified once: :mod:`hivemesh.sim.memo`;
    one msgpack packer: :mod:`hivemesh.sim.packer`)."""
    with verification_memo(), shared_packer():
        return factory(str(seed), opts).run()


def _run(args: tuple[int, SimOptions, ClusterFactory]) -> SimResult:
    return run_seed(*args)


def _run_all(
    work: list[tuple[int, SimOptions, ClusterFactory]], jobs: int, cost: list[float] | None = None
) -> list[SimResult]:
    """Results of ``work`` in its order; with ``jobs`` > 1 in worker processes,
    the most expensive items (by ``cost``) handed out first, one at a time."""
    if jobs <= 1:
        return [_run(w) for w in work]
    order = sorted(range(len(work)), key=lambda i: -cost[i]) if cost else list(range(len(work)))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(_run, [work[i] for i in order], chunksize=1 if cost else 8))
    results: list[SimResult | None] = [None] * len(work)
    for i, res in zip(order, done, strict=True):
        results[i] = res
    return [r for r in results if r is not None]


def run_campaign(
    seeds: Iterable[int],
    opts: SimOptions,
    jobs: int = 1,
    *,
    factory: ClusterFactory = Cluster,
    workload: str = "journal",
) -> dict[str, Any]:
    """Run ``seeds``; summary with runs, violations, failed_seeds, trace_digest.
    ``workload`` names the ``--workload`` in the replay commands."""
    seeds = list(seeds)
    results = _run_all([(s, opts, factory) for s in seeds], jobs)
    digest = hashlib.blake2b(digest_size=16)
    failed: list[int] = []
    violations = 0
    examples: dict[str, list[str]] = {}
    totals: dict[str, int] = {}
    for seed, res in zip(seeds, results, strict=True):
        digest.update(f"{seed}:{res.trace_digest};".encode())
        if res.violations:
            failed.append(seed)
            violations += len(res.violations)
            if len(examples) < 5:
                examples[str(seed)] = res.violations[:5]
        for k, v in res.stats.items():
            if isinstance(v, int) and k != "converged_at_ms":
                totals[k] = totals.get(k, 0) + v
    unique = totals.get("claim_executions", 0) - totals.get("claim_duplicates", 0)
    return {
        "claim_duplicate_rate": (totals.get("claim_duplicates", 0) / unique) if unique else None,
        "runs": len(seeds),
        "nodes": opts.nodes,
        "violations": violations,
        "failed_seeds": failed,
        "trace_digest": digest.hexdigest(),
        "examples": examples,
        "totals": totals,
        "replay": [
            f"hivemesh sim --seeds {s}..{s} --nodes {opts.nodes}"
            + (f" --workload {workload}" if workload != "journal" else "")
            for s in failed[:5]
        ],
    }


def default_options(nodes: int, workload: str = "journal") -> SimOptions:
    """The campaign's standard fault mix for ``nodes`` replicas.

    ``workload="claims"``: nodes compete for 40 tasks with optimistic claims
    under 10% loss and 100 ms jitter, with crashes (issue goal: <= 1%
    duplicate executions). As in every workload, each node is the daemon's
    Peer (:mod:`hivemesh.sim.peer_adapter`), whose SWIM (memberlist's LAN
    timing, the daemon's default) finds crashes.

    ``workload="plan"``: every node runs a decomposer, scorer and executor on
    one goal (6 leaves) under the standard fault mix; every replica must end
    with the same accepted tree and each leaf with exactly one accepted result.

    ``workload="journal"`` (the default) adds to the standard mix a node
    restored from an old backup of its store, a node whose append log is
    damaged while it is partitioned, crashes that lose the store's write
    cache (lost fsync, torn write: :mod:`hivemesh.sim.disk`), clock steps
    forward and back, and paused processes (see
    :class:`~hivemesh.sim.options.FaultOptions`).

    ``workload="clock"``: the journal workload with its last node a trusted
    peer with far-future and backdated clocks, over an active phase long
    enough for its backdated name claims to come more than the clock bound
    after the honest ones (:mod:`hivemesh.sim.adversary`).

    ``workload="leases"``: every Peer a lease voter, up to four of them
    acquiring through their lease commands, with the network and crash rate
    picked by the seed, then the split prepare of a killed holder
    (:mod:`hivemesh.sim.leases`); only ``nodes`` is read from these options.

    ``workload="peer"``: the journal workload (its old name, from when only
    it ran on Peers).

    ``workload="membership"``: SWIM alone, under crashes, restarts,
    partitions, broken links and stalled loops (:mod:`hivemesh.sim.swim`);
    only ``nodes`` is read from these options.
    """
    if workload == "plan":  # run with factory=hivemesh.roles.simplan.PlanCluster
        return SimOptions(
            nodes=nodes, appends=0, active_ms=12_000, heal_ms=40_000, swim=MembershipConfig.lan()
        )
    if workload == "clock":  # run with factory=hivemesh.sim.adversary.ClockAdversaryCluster
        return SimOptions(nodes=nodes, active_ms=100_000, heal_ms=40_000, sync_interval_ms=1_000)
    if workload == "claims":
        return SimOptions(
            nodes=nodes,
            appends=0,
            claim_tasks=40,
            network=NetworkOptions(
                one_way_delay_mean_ms=20,
                one_way_delay_jitter_ms=100,
                packet_loss_probability=0.10,
                packet_replay_probability=0.02,
            ),
            faults=FaultOptions(partition_probability=0.1, crash_probability=0.3, forgeries=0),
            swim=MembershipConfig.lan(),
        )
    faults = FaultOptions(
        restore_probability=0.1,
        log_damage_probability=0.1,
        lost_fsync_probability=0.5,
        clock_jump_probability=0.1,
        pause_probability=0.1,
    )
    return replace(SimOptions(), nodes=nodes, faults=faults)


@dataclass(frozen=True, slots=True)
class Scenario:
    """What one seed of a mixed campaign runs."""

    workload: str
    nodes: int

    def replay(self, seed: int) -> str:
        """The command that runs this seed alone."""
        return (
            f"hivemesh sim --seeds {seed}..{seed} --nodes {self.nodes} --workload {self.workload}"
        )


#: The CI mix: per workload, its share of the seeds, the node counts it runs
#: at (with their weights), and its relative cost per seed at 5 nodes (for
#: handing out the expensive seeds first). Node counts above 10 are rarer:
#: a seed's cost grows about with the square of its node count.
#: The shares keep 10,000 seeds inside CI's 15 minutes on 2 cores: measured
#: CPU per seed (CI seeds 1..1000, 2026-12-03) membership 0.046 s, journal
#: 0.13, leases 0.16, claims 0.20, clock 0.26, plan 0.32 (0.086 over the mix;
#: docs/simulator.md); with every node a Peer the earlier shares (journal 37%,
#: membership 30%) took 19.4 min.
CI_MIX: dict[str, tuple[float, dict[int, float], float]] = {
    "journal": (
        0.18,
        {5: 70, 6: 8, 7: 6, 8: 5, 10: 6, 15: 2.5, 20: 1.5, 30: 0.3, 50: 0.1},
        2.4,
    ),
    "claims": (0.04, {5: 76, 6: 10, 8: 8, 10: 5, 20: 1}, 3.0),
    "plan": (0.025, {5: 1}, 6.0),
    "clock": (0.025, {5: 80, 6: 12, 8: 8}, 4.5),
    # odd voter counts are where a dead voter can split a prepare
    "leases": (0.07, {5: 40, 6: 10, 7: 20, 9: 10, 11: 6, 15: 5, 25: 2, 50: 0.4}, 1.8),
    "membership": (
        0.66,
        {5: 52, 6: 10, 7: 10, 8: 10, 10: 10, 15: 5, 20: 1.5, 30: 0.3, 50: 0.2},
        0.3,
    ),
}


def ci_scenario(seed: int) -> Scenario:
    """The workload and node count that ``seed`` runs in the CI campaign
    (a pure function of the seed: the same seed always runs the same)."""
    rng = random.Random(f"ci/{seed}")
    names = sorted(CI_MIX)
    workload = rng.choices(names, [CI_MIX[w][0] for w in names])[0]
    sizes = CI_MIX[workload][1]
    nodes = rng.choices(sorted(sizes), [sizes[n] for n in sorted(sizes)])[0]
    return Scenario(workload, nodes)


def _cost(sc: Scenario) -> float:
    return CI_MIX[sc.workload][2] * (sc.nodes / 5) ** 2


def run_mix(seeds: Iterable[int], jobs: int = 1) -> dict[str, Any]:
    """The CI campaign over ``seeds`` (each runs :func:`ci_scenario`); summary
    as :func:`run_campaign`'s plus ``by_workload`` (runs, violations and node
    counts of each workload)."""
    seeds = list(seeds)
    plan = [ci_scenario(s) for s in seeds]
    work = [
        (s, default_options(sc.nodes, sc.workload), workload_factory(sc.workload))
        for s, sc in zip(seeds, plan, strict=True)
    ]
    results = _run_all(work, jobs, [_cost(sc) for sc in plan])
    digest = hashlib.blake2b(digest_size=16)
    failed: list[int] = []
    violations = 0
    examples: dict[str, list[str]] = {}
    totals: dict[str, int] = {}
    by_workload: dict[str, dict[str, Any]] = {}
    for seed, sc, res in zip(seeds, plan, results, strict=True):
        digest.update(f"{seed}:{sc.workload}:{sc.nodes}:{res.trace_digest};".encode())
        row = by_workload.setdefault(sc.workload, {"runs": 0, "violations": 0, "nodes": {}})
        row["runs"] += 1
        row["nodes"][sc.nodes] = row["nodes"].get(sc.nodes, 0) + 1
        if res.violations:
            failed.append(seed)
            violations += len(res.violations)
            row["violations"] += len(res.violations)
            if len(examples) < 5:
                examples[str(seed)] = res.violations[:5]
        for k, v in res.stats.items():
            if isinstance(v, int) and k != "converged_at_ms":
                totals[k] = totals.get(k, 0) + v
    for row in by_workload.values():
        row["nodes"] = {str(n): c for n, c in sorted(row["nodes"].items())}
    unique = totals.get("claim_executions", 0) - totals.get("claim_duplicates", 0)
    return {
        "campaign": "ci",
        "claim_duplicate_rate": (totals.get("claim_duplicates", 0) / unique) if unique else None,
        "runs": len(seeds),
        "nodes": sorted({sc.nodes for sc in plan}),
        "violations": violations,
        "failed_seeds": failed,
        "trace_digest": digest.hexdigest(),
        "examples": examples,
        "totals": totals,
        "by_workload": dict(sorted(by_workload.items())),
        "replay": [ci_scenario(s).replay(s) for s in failed[:5]],
    }
