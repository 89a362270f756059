"""Run many seeds and summarise (``hivemesh sim``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from hivemesh.sim.cluster import Cluster, SimResult
from hivemesh.sim.options import FaultOptions, NetworkOptions, SimOptions

__all__ = ["ClusterFactory", "parse_seeds", "run_campaign", "run_seed"]


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


#: Builds the cluster for one seed (a picklable class or top-level function:
#: campaigns run in worker processes). Workloads above the core, such as the
#: planner's :class:`hivemesh.roles.simplan.PlanCluster`, come in this way.
ClusterFactory = Callable[[str, SimOptions], Cluster]


def run_seed(seed: int, opts: SimOptions, factory: ClusterFactory = Cluster) -> SimResult:
    """One seeded run."""
    return factory(str(seed), opts).run()


def _run(args: tuple[int, SimOptions, ClusterFactory]) -> SimResult:
    return run_seed(*args)


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
    work = [(s, opts, factory) for s in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_run, work, chunksize=8))
    else:
        results = [_run(w) for w in work]
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
    duplicate executions).

    ``workload="plan"``: every node runs a decomposer, scorer and executor on
    one goal (6 leaves) under the standard fault mix; every replica must end
    with the same accepted tree and each leaf with exactly one accepted result.

    ``workload="journal"`` (the default) adds two scenarios to the standard
    mix: a node restored from an old backup of its store, and a node whose
    append log is damaged while it is partitioned (see
    :class:`~hivemesh.sim.options.FaultOptions`).

    ``workload="clock"``: the journal workload with its last node a trusted
    peer with far-future and backdated clocks, over an active phase long
    enough for its backdated name claims to come more than the clock bound
    after the honest ones (:mod:`hivemesh.sim.adversary`).
    """
    if workload == "plan":  # run with factory=hivemesh.roles.simplan.PlanCluster
        return SimOptions(nodes=nodes, appends=0, active_ms=12_000, heal_ms=40_000)
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
        )
    faults = FaultOptions(restore_probability=0.1, log_damage_probability=0.1)
    return replace(SimOptions(), nodes=nodes, faults=faults)
