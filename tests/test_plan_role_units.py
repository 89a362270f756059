"""Role logic one poll at a time: bad LLM output is handled, never stuck."""

from __future__ import annotations

import asyncio
from typing import Any

from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    KIND_CLAIM,
    KIND_GOAL,
    KIND_PROPOSE,
    KIND_RELEASE,
    KIND_RESULT,
    KIND_VOTE,
    goal_body,
    goal_id,
)
from hivemesh.llm import ScriptedLLM
from hivemesh.llm.errors import LLMTimeout
from hivemesh.roles.base import Emit, Job
from hivemesh.roles.decomposer import Decomposer, clean_subgoals
from hivemesh.roles.executor import Executor
from hivemesh.roles.local import LocalJournal, author_key
from hivemesh.roles.scorer import Scorer

ME = author_key("me")
CLI = author_key("cli")


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def setup(**goal: Any) -> tuple[LocalJournal, PlanView, Clock, str]:
    clock = Clock()
    j = LocalJournal(clock)
    view = PlanView()
    j.add_view(view)
    body = goal_body("goal", b"unit-nonce", settle_ms=10, **goal)
    j.append(CLI, KIND_GOAL, body)
    return j, view, clock, goal_id(CLI, b"unit-nonce")


def drive(role: Any, j: LocalJournal, view: PlanView, clock: Clock) -> list[Emit]:
    """Poll once, run jobs to completion, append everything; return emits."""
    out: list[Emit] = []
    for a in role.poll(view, clock()):
        emits = asyncio.run(a.run()) if isinstance(a, Job) else [a]
        for e in emits:
            j.append(role.me, e.kind, e.body)
            out.append(e)
    return out


def test_too_many_subgoals_then_fallback_to_atomic() -> None:
    j, view, clock, _gid = setup(max_subgoals=5)
    huge = {"subgoals": [{"title": f"s{i}"} for i in range(300)]}
    d = Decomposer(ME, ScriptedLLM(lambda m, s: huge), retry_after_ms=100)
    proposals: list[Emit] = []
    for _ in range(6):
        proposals += [e for e in drive(d, j, view, clock) if e.kind == KIND_PROPOSE]
        clock.ms += 1000
    assert d.counters["error.llm_bad_output"] == 3
    assert len(proposals) == 1 and proposals[0].body["atomic"] is True
    assert view.invalid.total() == 0


def test_zero_subgoals_means_atomic_and_deps_are_cleaned() -> None:
    j, view, clock, _gid = setup()
    d = Decomposer(ME, ScriptedLLM([{"atomic": False, "subgoals": []}]))
    (p,) = [e for e in drive(d, j, view, clock) if e.kind == KIND_PROPOSE]
    assert p.body["atomic"] is True and p.body["subgoals"] == []
    subs = clean_subgoals(
        [{"title": "a", "depends_on": [0, 5]}, {"title": " ", "depends_on": [0, 1, -1, "x"]}],
        limit=5,
        last_level=True,
    )
    assert [s["deps"] for s in subs] == [[], [0]] and subs[1]["title"] == "step 2"
    assert all(s["atomic"] for s in subs)


def test_scorer_ignores_bogus_indices_and_rescores_skipped() -> None:
    j, view, clock, gid = setup()
    for who in ("d1", "d2"):
        j.append(
            author_key(who), KIND_PROPOSE, {"goal": gid, "round": 0, "subgoals": [{"title": who}]}
        )
    clock.ms += 100
    s8 = {"concreteness": 8, "non_overlap": 8, "completeness": 8}
    llm = ScriptedLLM(
        [
            {"scores": [{"proposal": 0, **s8}, {"proposal": 0, **s8}]},  # dup; 1 skipped
            {"scores": [{"proposal": 0, **s8, "concreteness": 3}]},
        ]
    )
    sc = Scorer(ME, llm)
    first = [e for e in drive(sc, j, view, clock) if e.kind == KIND_VOTE]
    second = [e for e in drive(sc, j, view, clock) if e.kind == KIND_VOTE]
    assert len(first) == 1 and len(second) == 1
    assert first[0].body["proposal"] != second[0].body["proposal"]
    assert first[0].body["accept"] is True and second[0].body["accept"] is False
    assert drive(sc, j, view, clock) == []  # nothing left to score


def test_executor_failure_releases_and_caps_filter() -> None:
    j, view, clock, gid = setup(max_depth=0)
    e_fail = Executor(ME, ScriptedLLM([LLMTimeout("slow")] * 3), retry_after_ms=0)
    out = drive(e_fail, j, view, clock)
    assert [e.kind for e in out][-1] == KIND_CLAIM
    clock.ms += 50
    out = drive(e_fail, j, view, clock)
    assert out[-1].kind == KIND_RELEASE and out[-1].body["failed"] is True
    assert view.node(gid).attempts == 1  # type: ignore[union-attr]
    other = Executor(author_key("e2"), ScriptedLLM([{"result": "ok"}]))
    drive(other, j, view, clock)
    clock.ms += 50
    assert drive(other, j, view, clock)[-1].kind == KIND_RESULT
    assert view.final_answer(gid) == "ok"


class Tools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def list_tools(self) -> list[dict[str, Any]]:
        return [{"name": "search", "description": "web search"}]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        if arguments.get("q") == "boom":
            raise RuntimeError("tool exploded")
        return "3 results"


def test_executor_tool_loop_and_tool_errors_feed_back() -> None:
    j, view, clock, gid = setup(max_depth=0)
    tools = Tools()
    llm = ScriptedLLM(
        [
            {"tool": "search", "arguments": {"q": "boom"}},
            {"tool": "search", "arguments": {"q": "lisbon"}},
            {"result": "found 3"},
        ]
    )
    ex = Executor(ME, llm, tools=tools)
    drive(ex, j, view, clock)
    clock.ms += 50
    drive(ex, j, view, clock)
    assert view.final_answer(gid) == "found 3"
    assert [c[1]["q"] for c in tools.calls] == ["boom", "lisbon"]
    assert "tool exploded" in llm.calls[1][-1]["content"]
    assert "search: web search" in llm.calls[0][0]["content"]


def test_executor_only_claims_what_it_can_do() -> None:
    j, view, clock, gid = setup(max_depth=1, quorum="count", quorum_value=1)
    sub = {"title": "browse", "atomic": True, "caps": ["browser"]}
    j.append(author_key("d"), KIND_PROPOSE, {"goal": gid, "round": 0, "subgoals": [sub]})
    pid = view.proposals_for(gid)[0][2].id
    j.append(
        author_key("s"),
        KIND_VOTE,
        {
            "proposal": pid,
            "goal": gid,
            "accept": True,
            "concreteness": 9,
            "non_overlap": 9,
            "completeness": 9,
        },
    )
    clock.ms += 50
    plain = Executor(ME, ScriptedLLM([]))
    assert [e.kind for e in drive(plain, j, view, clock)] == ["plan.hello"]
    browser = Executor(author_key("b"), ScriptedLLM([]), caps=["browser"])
    assert [e.kind for e in drive(browser, j, view, clock)] == ["plan.hello", KIND_CLAIM]
    assert view.capabilities(author_key("b")) == ("browser",)


def test_huge_results_are_clipped_to_fit_an_event() -> None:
    j, view, clock, gid = setup(max_depth=0)
    ex = Executor(ME, ScriptedLLM([{"result": "€" * 50_000}]))
    drive(ex, j, view, clock)
    clock.ms += 50
    drive(ex, j, view, clock)
    answer = view.final_answer(gid)
    assert answer is not None and answer.endswith("[...]")
    assert len(answer.encode()) <= 48 * 1024 + 10
