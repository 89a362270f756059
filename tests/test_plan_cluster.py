"""The planning workload on the deterministic cluster simulator.

:class:`hivemesh.roles.simplan.PlanCluster` runs real core nodes (signed feeds,
gossip, anti-entropy), each with a decomposer, a scorer and an executor,
against an instant stand-in model whose replies land 800 ms of simulated
time later, while the simulator loses, duplicates and delays frames,
partitions the network, skews clocks and crashes nodes (the nodes' SWIM failure detection
writes ``member.down``). After the heal phase every replica must hold the
same accepted tree, the root must be answered and every leaf must hold
exactly one accepted result; the simulator's own checkers must pass too.
``hivemesh sim --workload plan`` runs the same over many seeds (CI: about 300 of
the 10,000 seeds of ``hivemesh sim --campaign ci``).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from hivemesh.roles.simplan import PlanCluster, plan_problems
from hivemesh.sim.campaign import default_options, run_campaign, run_seed
from hivemesh.sim.options import FaultOptions, NetworkOptions

OPTS = default_options(5, "plan")


@pytest.mark.parametrize("seed", range(12))
def test_plan_workload_converges_under_faults(seed: int) -> None:
    c = PlanCluster(f"plan-{seed}", OPTS)
    result = c.run()
    replay = f"hivemesh sim --seeds {seed}..{seed} --nodes 5 --workload plan"
    assert result.violations == [], f"{result.violations} (replay: {replay})"
    snaps = [c.plan_views[n.index].snapshot() for n in c.nodes]
    assert all(s == snaps[0] for s in snaps[1:]), f"replicas disagree (replay: {replay})"
    root = snaps[0]["goals"][0]
    assert root["status"] == "done" and root["result"] is not None, replay
    assert result.stats["plan_leaves"] == 6


def test_a_deeper_plan_converges_without_faults() -> None:
    """A 3 x 3 plan (9 leaves) on a perfect network with no crash (folded in
    from the planner's own event-heap simulation, which this replaces)."""
    quiet = replace(
        OPTS,
        network=NetworkOptions(packet_loss_probability=0, packet_replay_probability=0),
        faults=FaultOptions(partition_probability=0, crash_probability=0, forgeries=0),
    )
    c = PlanCluster("plan-deep", quiet, fanout=(3, 3))
    result = c.run()
    assert result.violations == [], result.violations
    assert result.stats["plan_leaves"] == 9 and result.stats["plan_duplicate_results"] == 0
    snaps = [c.plan_views[n.index].snapshot() for n in c.nodes]
    assert all(s == snaps[0] for s in snaps[1:])


def test_the_campaign_is_deterministic_and_counts_its_faults() -> None:
    a = run_campaign(range(3), OPTS, factory=PlanCluster, workload="plan")
    b = run_campaign(range(3), OPTS, factory=PlanCluster, workload="plan")
    assert a["trace_digest"] == b["trace_digest"]
    assert a["violations"] == 0 and a["totals"]["plan_leaves"] == 18
    assert a["totals"]["frames_lost"] > 0  # faults were really injected
    assert (
        run_seed(7, OPTS, PlanCluster).trace_digest == run_seed(7, OPTS, PlanCluster).trace_digest
    )


def _done_snapshot() -> dict[str, Any]:
    c = PlanCluster("plan-checker", OPTS)
    assert c.run().violations == []
    return c.plan_views[0].snapshot()


def test_the_plan_checker_catches_disagreement_and_missing_results() -> None:
    good = _done_snapshot()
    assert plan_problems([good, good], 6) == []
    other = copy.deepcopy(good)
    other["goals"][0]["children"][0]["children"][0]["result"] = None
    other["goals"][0]["children"][0]["children"][0]["status"] = "ready"
    problems = plan_problems([good, other], 6)
    assert any("disagree" in p for p in problems)
    assert any("leaf" in p for p in plan_problems([other], 6))
    unanswered = copy.deepcopy(good)
    unanswered["goals"][0]["result"] = None
    assert any("root" in p for p in plan_problems([unanswered], 6))
    assert any("leaves" in p for p in plan_problems([good], 8))
