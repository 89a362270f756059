"""Roles over one in-memory journal, talking to a scripted LLM over real HTTP."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    KIND_CANCEL,
    KIND_GOAL,
    cancel_body,
    goal_body,
    goal_id,
)
from hivemesh.llm import LLMConfig, OpenAICompatProvider, RetryPolicy
from hivemesh.roles.base import Emit, failure_events
from hivemesh.roles.decomposer import Decomposer
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.executor import Executor
from hivemesh.roles.local import LocalJournal, author_key
from hivemesh.roles.observer import Observer, render_text
from hivemesh.roles.prompts import DECOMPOSE_TAG, EXECUTE_TAG, SCORE_TAG
from hivemesh.roles.scorer import Scorer
from hivemesh.roles.swarm import LocalSwarm
from llm_server import ScriptedServer, Step

NONCE = b"test-goal"
CLI = author_key("cli")


def now_ms() -> int:
    return int(time.time() * 1000)


def tag(req: dict[str, Any]) -> str:
    return str(req["messages"][0]["content"]).split("]", 1)[0] + "]"


def user(req: dict[str, Any]) -> str:
    return str(req["messages"][1]["content"])


def demo_server(planner: DemoPlanner, hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    def respond(req: dict[str, Any]) -> Any:
        if hook is not None:
            out = hook(req)
            if out is not None:
                return out
        return planner(req["messages"], None)

    return respond


async def swarm_run(
    responder: Any,
    *,
    decomposers: int = 2,
    scorers: int = 3,
    executors: int = 2,
    goal: dict[str, Any] | None = None,
    during: Callable[[LocalSwarm, str], Any] | None = None,
    until: Callable[[LocalSwarm, str], bool] | None = None,
    timeout_s: float = 30.0,
    llm_timeout_s: float = 5.0,
    exec_caps: list[list[str]] | None = None,
    retry_ms: int = 1000,
) -> tuple[LocalSwarm, str, ScriptedServer, list[PlanView]]:
    async with ScriptedServer(responder) as srv:
        cfg = LLMConfig(base_url=srv.base_url, model="scripted", timeout_s=llm_timeout_s)
        pol = RetryPolicy(max_attempts=3, backoff_base_s=0.01)
        async with OpenAICompatProvider(cfg, rng=random.Random(7), policy=pol) as llm:
            j = LocalJournal(now_ms)
            sw = LocalSwarm(j)
            views = []
            strategies = ["by place", "by activity", "by day"]
            for i in range(decomposers):
                d = Decomposer(
                    author_key(f"d{i}"), llm, strategy=strategies[i % 3], retry_after_ms=retry_ms
                )
                views.append(sw.add(d, own_view=True))
            for i in range(scorers):
                sc = Scorer(author_key(f"s{i}"), llm, retry_after_ms=retry_ms)
                views.append(sw.add(sc, own_view=True))
            for i in range(executors):
                caps = exec_caps[i] if exec_caps else []
                e = Executor(
                    author_key(f"e{i}"), llm, caps=caps, max_concurrent=3, reclaim_after_ms=retry_ms
                )
                views.append(sw.add(e, own_view=True))
            body = goal_body("weekend in Lisbon", NONCE, settle_ms=20, scorers=scorers)
            body.update(goal or {})
            j.append(CLI, KIND_GOAL, body)
            gid = goal_id(CLI, NONCE)
            if during is not None:
                await during(sw, gid)
            cond = until or (lambda s, g: s.view.final_answer(g) is not None)
            ok = await sw.run_until(lambda: cond(sw, gid), timeout_s)
            await sw.aclose()
            assert ok, render_text(sw.view.tree(gid) or {})
            return sw, gid, srv, views


def check_consistent(sw: LocalSwarm, gid: str, views: list[PlanView]) -> None:
    """Every replica and a late observer agree; each leaf has one result."""
    late = PlanView()
    for ev in reversed(sw.journal.events):  # a late joiner, in another order
        late.apply(ev)
    snap = sw.view.snapshot()
    assert late.snapshot() == snap
    for v in views:
        assert v.snapshot() == snap
    assert Observer(CLI).show(late, gid) is not None

    def walk(n: dict[str, Any]) -> None:
        if n["kind"] == "leaf" and n["status"] == "done":
            assert n["result"] is not None
        for c in n["children"]:
            walk(c)

    walk(snap["goals"][0])


def test_small_goal_completes_with_final_answer() -> None:
    planner = DemoPlanner((2, 3))
    sw, gid, srv, views = asyncio.run(swarm_run(demo_server(planner)))
    root = sw.view.tree(gid)
    assert root is not None and root["status"] == "done"
    assert len(root["children"]) == 2 and all(len(c["children"]) == 3 for c in root["children"])
    assert sw.view.final_answer(gid) == "weekend in Lisbon: combined 2 results"
    check_consistent(sw, gid, views)
    execs = [r for r in srv.requests if tag(r) == EXECUTE_TAG]
    assert len(execs) == 6  # no duplicate executions


def test_malformed_output_timeouts_and_http_errors_do_not_stall() -> None:
    rng = random.Random(3)
    faults = {"n": 0}

    def hook(req: dict[str, Any]) -> Any:
        r = rng.random()
        if r < 0.12:
            faults["n"] += 1
            return "{truncated"
        if r < 0.2:
            faults["n"] += 1
            return Step(status=500, raw=b"boom")
        if r < 0.25:
            faults["n"] += 1
            return Step(hang=True)
        if r < 0.3 and tag(req) == SCORE_TAG:
            faults["n"] += 1
            return {"scores": [{"proposal": 0, "concreteness": 99}]}  # off-schema
        return None

    sw, gid, _srv, views = asyncio.run(
        swarm_run(demo_server(DemoPlanner((2, 2)), hook), llm_timeout_s=0.5)
    )
    assert faults["n"] >= 3
    check_consistent(sw, gid, views)


def test_executor_crash_mid_task_is_released_and_reclaimed() -> None:
    hung: dict[str, Any] = {}

    def hook(req: dict[str, Any]) -> Any:
        if tag(req) == EXECUTE_TAG and not hung:
            hung["req"] = user(req)
            return Step(hang=True)
        return None

    async def during(sw: LocalSwarm, gid: str) -> None:
        ok = await sw.run_until(lambda: "req" in hung, 20)
        assert ok
        stuck = next((m.role.me for m in sw.members if m.role.name == "executor" and m.tasks), None)
        assert stuck is not None
        sw.crash(stuck)
        for e in failure_events(sw.view, stuck):  # what failure detection writes
            sw.append(author_key("fd"), e)

    sw, gid, _srv, views = asyncio.run(
        swarm_run(demo_server(DemoPlanner((2, 2)), hook), during=during, llm_timeout_s=30)
    )
    check_consistent(sw, gid, views)
    crashed = author_key("e0") if sw.members[-2].alive is False else author_key("e1")
    released = [n for n in sw.view.nodes() if any(c[1] == crashed and c[3] for c in n.claims)]
    assert released  # the crashed executor's claims were released ...
    for n in released:  # ... and another executor finished those tasks
        assert n.status == "done" and n.result is not None and n.result[1] != crashed
    assert all(n.duplicates == 0 for n in sw.view.nodes())


def test_crashed_decomposer_and_scorer_do_not_stall() -> None:
    async def during(sw: LocalSwarm, gid: str) -> None:
        sw.crash(author_key("d0"))
        sw.crash(author_key("s2"))

    sw, gid, _srv, views = asyncio.run(swarm_run(demo_server(DemoPlanner((2, 2))), during=during))
    check_consistent(sw, gid, views)
    authors = {
        v.author
        for n in sw.view.nodes()
        for p in n.proposals
        for v in sw.view.votes_for(p.proposal)
    }
    assert author_key("s2") not in authors


def test_rejected_round_reproposes_with_notes() -> None:
    def hook(req: dict[str, Any]) -> Any:
        if tag(req) == SCORE_TAG and "round-two" not in user(req):
            return {
                "scores": [
                    {
                        "proposal": i,
                        "concreteness": 2,
                        "non_overlap": 9,
                        "completeness": 9,
                        "notes": "too vague, name the museums",
                    }
                    for i in range(user(req).count("Proposal "))
                ]
            }
        if tag(req) == DECOMPOSE_TAG and "name the museums" in user(req):
            return {"atomic": False, "subgoals": [{"title": "round-two museums", "atomic": True}]}
        return None

    sw, gid, _srv, views = asyncio.run(
        swarm_run(demo_server(DemoPlanner((2,)), hook), goal={"max_depth": 1}, decomposers=1)
    )
    root = sw.view.tree(gid)
    assert root is not None and [c["title"] for c in root["children"]] == ["round-two museums"]
    assert (
        len(root["proposals"]) == 2
        and root["proposals"][0]["rejected"] != root["proposals"][1]["rejected"]
    )
    check_consistent(sw, gid, views)


def test_dependencies_pass_results_and_capabilities_route_tasks() -> None:
    planner = DemoPlanner((3,), chain=True)

    def hook(req: dict[str, Any]) -> Any:
        if tag(req) == DECOMPOSE_TAG:
            out = planner(
                [{"role": m["role"], "content": m["content"]} for m in req["messages"]], None
            )
            for s in out["subgoals"]:
                s["capabilities"] = ["browser"]
            return out
        return None

    sw, gid, srv, _views = asyncio.run(
        swarm_run(
            demo_server(planner, hook),
            goal={"max_depth": 1},
            executors=2,
            exec_caps=[[], ["browser"]],
        )
    )
    execs = [user(r) for r in srv.requests if tag(r) == EXECUTE_TAG]
    assert len(execs) == 3
    assert "prerequisite" not in execs[0]
    assert "part 1: done: weekend in Lisbon / part 1" in execs[1]
    leaves = sw.view.tree(gid)["children"]  # type: ignore[index]
    browser = author_key("e1").hex()
    assert all(leaf["result"]["author"] == browser for leaf in leaves)


def test_cancel_stops_the_plan() -> None:
    def hook(req: dict[str, Any]) -> Any:
        if tag(req) == EXECUTE_TAG:
            return Step(delay_s=0.3, content={"result": "slow"})
        return None

    def until(sw: LocalSwarm, gid: str) -> bool:
        n = sw.view.node(gid)
        if n is None or not any(sw.view.claims_by(author_key(f"e{i}")) for i in range(2)):
            return False
        if n.cancelled is None:
            sw.append(CLI, Emit(KIND_CANCEL, cancel_body(gid, "user cancelled")))
        return not any(m.tasks for m in sw.members)

    sw, gid, _srv, _ = asyncio.run(
        swarm_run(demo_server(DemoPlanner((8,)), hook), goal={"max_depth": 1}, until=until)
    )
    n = sw.view.node(gid)
    assert n is not None and n.status == "cancelled"
    kids = [sw.view.node(c) for c in n.children]
    assert any(k is not None and not k.claims for k in kids)  # never claimed after cancel
    assert all(k is not None and k.status in ("cancelled", "done") for k in kids)
    assert sw.view.claimable(now_ms() + 10_000) == [] and sw.view.open_goals(now_ms()) == []


def test_dead_llm_ends_the_plan_as_failed_not_stuck() -> None:
    def dead(req: dict[str, Any]) -> Any:
        return Step(status=503, raw=b"model unavailable")

    sw, gid, srv, views = asyncio.run(
        swarm_run(
            dead,
            retry_ms=20,
            until=lambda s, g: s.view.node(g) is not None and s.view.node(g).status == "failed",  # type: ignore[union-attr]
        )
    )
    root = sw.view.tree(gid)
    assert root is not None and root["status"] == "failed" and root["kind"] == "leaf"
    assert root["attempts"] == 3 and sw.view.final_answer(gid) is None
    assert len(srv.requests) > 3
    check_consistent(sw, gid, views)
