"""The dashboard in a real headless Chromium during a plan run.

A metrics collector (``hivemesh up --collector``) serves the dashboard; a
decomposer, two scorers and two executors (``hivemesh agent`` processes)
join it and plan against a scripted OpenAI-compatible model (real HTTP on
127.0.0.1). The page is open before the goal exists; the test then watches
the tree grow in the browser -- the root, the voted split, the leaves
claimed and finished -- while the peers and the token chart fill in, with
no JavaScript error. A screenshot is kept as an artifact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard_helpers import dashboard_process, open_page
from hivemesh.client.swarm import LocalSwarm
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.meshplan import started_swarm
from hivemesh.roles.prompts import EXECUTE_TAG, SCORE_TAG, tag_of
from llm_server import ScriptedServer, Step

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e_slow]

COUNTS = {"decomposers": 1, "scorers": 2, "executors": 2}
GOAL_ARGS = {"scorers": 2, "max_depth": 2, "settle_ms": 200}
#: What the page shows of the tree: each node's kind, status, proposals and votes.
TREE_JS = (
    "[...document.querySelectorAll('[data-testid=plan-node]')]"
    ".map(n => [n.dataset.kind, n.dataset.status, n.dataset.proposals, n.dataset.votes]"
    ".join(':'))"
)


class Script:
    """A 2 x 3 plan; scoring and execution take a while, so votes and
    claims are seen on the way."""

    def __init__(self) -> None:
        self.planner = DemoPlanner((2, 3))
        self.lock = threading.Lock()

    def __call__(self, req: dict[str, Any]) -> Any:
        with self.lock:
            reply = self.planner(req["messages"], None)
        tag = tag_of(req["messages"])
        if tag == EXECUTE_TAG:
            return Step(content=reply, delay_s=1.5)
        if tag == SCORE_TAG:
            return Step(content=reply, delay_s=0.4)
        return reply


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[LocalSwarm, dict[str, str]]]:
    with ScriptedServer.in_thread(Script()) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        seed = LocalSwarm(tmp_path / "seed", env=env)
        try:
            collector = seed.start("collector", extra_args=["--collector"])
            with started_swarm(COUNTS, env, mesh=str(collector.data_dir), root=tmp_path / "agents"):
                yield seed, seed.env
        finally:
            seed.close()


def test_the_page_shows_the_plan_tree_growing_with_peers_and_token_charts(
    swarm: tuple[LocalSwarm, dict[str, str]], tmp_path: Path
) -> None:
    seed, env = swarm
    collector = seed.nodes["collector"]
    t0 = time.monotonic()
    with dashboard_process(collector.data_dir, env) as (_proc, ready), open_page(ready["url"]) as b:
        page = b.page
        b.wait_for(
            "document.querySelectorAll('[data-testid=peer-row][data-state=up]').length >= 5", 60
        )
        assert page.query_selector("[data-testid=plan-node]") is None  # no goal yet
        gid = collector.client.call("plan.goal", title="weekend in Porto", **GOAL_ARGS)["goal"]
        # watch the tree in the browser as it grows (the page is never reloaded)
        seen: list[list[str]] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            shown: list[str] = page.evaluate(TREE_JS)
            if not seen or shown != seen[-1]:
                seen.append(shown)
            if len(shown) == 9 and all(":done:" in s for s in shown):
                break
            page.wait_for_timeout(100)
        else:
            pytest.fail(f"the tree never completed on the page; last seen {seen[-1:]}")
        sizes = [len(s) for s in seen]
        assert 1 in sizes and sizes == sorted(sizes), sizes  # the root alone, then it grew
        # the root's split proposed and voted on before it was accepted
        roots = [s[0].split(":") for s in seen if s]
        assert any(int(r[2]) >= 1 and r[1] == "open" for r in roots), roots
        assert any(int(r[3]) >= 1 for r in roots), roots
        states = {tuple(x.split(":")[:2]) for s in seen for x in s}
        assert ("leaf", "claimed") in states, states  # leaves were seen claimed, then done
        assert sum(1 for x in seen[-1] if x.startswith("leaf:")) == 6
        b.wait_for("document.querySelector('[data-testid=plan-answer]')", 30)
        answer = page.inner_text("[data-testid=plan-answer]")
        assert answer == "weekend in Porto: combined 2 results"
        assert gid[:10] in page.inner_text("[data-testid=plan-goal]")
        # the agents' LLM calls reached the collector: tokens per agent, charted
        b.wait_for("document.querySelectorAll('#chart-tokens svg rect').length >= 2", 60)
        b.wait_for("document.querySelectorAll('#chart-latency svg polyline').length >= 3", 30)
        shots = b.screenshot(tmp_path / "dashboard-plan.png")
        assert b.errors == [], b.errors
    assert all(s.stat().st_size > 10_000 for s in shots)
    print(f"plan with the dashboard: {time.monotonic() - t0:.1f} s; {len(seen)} views: {sizes}")
