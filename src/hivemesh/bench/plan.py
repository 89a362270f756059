"""``hivemesh bench plan``: planner coordination overhead on a 40-leaf plan.

A swarm of decomposers, scorers and executors (in one process, over one
:class:`~hivemesh.roles.local.LocalJournal`) plans and runs a goal whose
deterministic stand-in model (:class:`~hivemesh.roles.demo.DemoPlanner`)
splits it 5 ways and each part 8 ways, behind a fixed per-call latency.

*Baseline*: the critical path of LLM calls, computed from the finished tree
(decompose + score per level and round, the longest dependency chain of
executions, one synthesis per inner level) times the latency: the wall time
a perfect coordinator with unlimited parallelism would need. *Ours*: the
measured wall time from goal creation to final answer. Their ratio minus
one is the coordination overhead (goal <= 10 %). Duplicate executions are
execution or synthesis LLM calls beyond one per task (goal 0).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import TYPE_CHECKING, Any

from hivemesh.bench import BenchResult, Metric

if TYPE_CHECKING:  # the roles load in run_once: `hivemesh bench` imports every bench to list it
    from hivemesh.core.plan import PlanView

__all__ = ["DESCRIPTION", "add_arguments", "critical_path_calls", "run", "run_once"]

DESCRIPTION = "40-leaf plan with a fixed-latency LLM stub: wall time vs LLM critical path"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Bench options."""
    parser.add_argument("--fanout", default="5,8", help="subgoals per level (5,8 = 40 leaves)")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--decomposers", type=int, default=2)
    parser.add_argument("--scorers", type=int, default=3)
    parser.add_argument("--executors", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8, help="concurrent tasks per executor")
    parser.add_argument("--settle-ms", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=120.0)


def critical_path_calls(view: PlanView, node_id: str) -> int:
    """Sequential LLM calls on the longest path below and including ``node_id``."""
    n = view.node(node_id)
    if n is None:
        return 0
    rounds = {p.round for _h, _a, p in view.proposals_for(node_id)} if n.accepted else set()
    own = 2 * len(rounds)  # one decomposition and one scoring call per round
    if n.leaf:
        return own + 1
    finish: dict[str, int] = {}
    for c in n.children:
        child = view.node(c)
        dep_done = max((finish[d] for d in (child.deps if child else ())), default=0)
        finish[c] = dep_done + critical_path_calls(view, c)
    return own + max(finish.values(), default=0) + 1


async def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One plan from goal to final answer; returns measurements."""
    from hivemesh.core.plan_events import KIND_GOAL, goal_body, goal_id
    from hivemesh.llm.stub import FixedLatencyLLM
    from hivemesh.roles.decomposer import Decomposer
    from hivemesh.roles.demo import DemoPlanner
    from hivemesh.roles.executor import Executor
    from hivemesh.roles.local import LocalJournal, author_key
    from hivemesh.roles.prompts import EXECUTE_TAG, SYNTH_TAG
    from hivemesh.roles.scorer import Scorer
    from hivemesh.roles.swarm import LocalSwarm

    fanout = tuple(int(x) for x in str(args.fanout).split(","))
    planner = DemoPlanner(fanout)
    llm = FixedLatencyLLM(planner, args.latency_ms)
    journal = LocalJournal(lambda: int(time.time() * 1000))
    swarm = LocalSwarm(journal)
    for i in range(args.decomposers):
        strategy = ("by place", "by activity", "by day")[i % 3]
        swarm.add(Decomposer(author_key(f"bench-d{i}"), llm, strategy=strategy))
    for i in range(args.scorers):
        swarm.add(Scorer(author_key(f"bench-s{i}"), llm))
    for i in range(args.executors):
        swarm.add(Executor(author_key(f"bench-e{i}"), llm, max_concurrent=args.slots))
    swarm.step()  # hellos
    cli = author_key("bench-cli")
    nonce = b"bench-plan-goal"
    t0 = time.perf_counter()
    journal.append(
        cli,
        KIND_GOAL,
        goal_body(
            "organise a conference",
            nonce,
            scorers=args.scorers,
            max_depth=len(fanout),
            max_subgoals=max(fanout),
            settle_ms=args.settle_ms,
        ),
    )
    gid = goal_id(cli, nonce)
    ok = await swarm.run_until(lambda: swarm.view.final_answer(gid) is not None, args.timeout_s)
    wall_ms = (time.perf_counter() - t0) * 1000.0
    await swarm.aclose()
    view = swarm.view
    tasks = sum(1 for n in view.nodes() if n.leaf is not None)
    leaves = sum(1 for n in view.nodes() if n.leaf is True)
    runs = planner.calls.get(EXECUTE_TAG, 0) + planner.calls.get(SYNTH_TAG, 0)
    dup_results = sum(n.duplicates for n in view.nodes())
    cp_calls = critical_path_calls(view, gid)
    return {
        "ok": ok,
        "wall_ms": wall_ms,
        "critical_path_ms": cp_calls * args.latency_ms,
        "critical_path_calls": cp_calls,
        "leaves": leaves,
        "duplicates": max(runs - tasks, dup_results),
        "llm_calls": sum(planner.calls.values()),
        "events": len(journal.events),
        "polls": swarm.polls,
    }


def run(args: argparse.Namespace) -> BenchResult:
    """Run ``--runs`` plans; report the median wall time and worst duplicates."""
    results = [asyncio.run(run_once(args)) for _ in range(max(1, args.runs))]
    wall = statistics.median(r["wall_ms"] for r in results)
    cp = results[0]["critical_path_ms"]
    dups = max(r["duplicates"] for r in results)
    all_ok = all(r["ok"] for r in results)
    res = BenchResult("plan")
    res.metrics.append(
        Metric(
            name=f"wall time, {results[0]['leaves']}-leaf plan",
            ours=wall,
            baseline=cp,
            unit="ms",
            baseline_name="LLM critical path",
            higher_is_better=False,
            goal="<= 1.10x (overhead <= 10%)",
            goal_met=all_ok and wall <= 1.10 * cp,
        )
    )
    res.metrics.append(
        Metric(
            name="duplicate executions",
            ours=float(dups),
            baseline=None,
            unit="tasks",
            higher_is_better=False,
            goal="0",
            goal_met=dups == 0,
        )
    )
    res.details = {
        "overhead_pct": round((wall / cp - 1.0) * 100.0, 1) if cp else None,
        "latency_ms": args.latency_ms,
        "critical_path_calls": results[0]["critical_path_calls"],
        "swarm": f"decomposers={args.decomposers},scorers={args.scorers},"
        f"executors={args.executors}x{args.slots}",
        "settle_ms": args.settle_ms,
        "runs_wall_ms": [round(r["wall_ms"], 1) for r in results],
        "llm_calls": results[0]["llm_calls"],
        "events": results[0]["events"],
        "completed": all_ok,
    }
    return res
