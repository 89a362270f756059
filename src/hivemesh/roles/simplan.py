"""The planning workload for the cluster simulator (``hivemesh sim --workload plan``).

Theory of operation
-------------------
:class:`PlanCluster` is a :class:`~hivemesh.sim.cluster.Cluster`
(every node the daemon's Peer) whose every
node also runs a decomposer, a scorer and an executor over its own
:class:`~hivemesh.core.plan.PlanView` (rebuilt from its store on each boot,
so a crash loses the roles' memory and in-flight work, never the journal).
The model is :class:`~hivemesh.roles.demo.DemoPlanner` behind an instant
:class:`~hivemesh.llm.ScriptedLLM`; a job's events are appended
``llm_latency_ms`` of simulated time later (and dropped if the node crashed
meanwhile). Roles are polled every ``poll_ms``. Node 0 creates one goal at
time 0 (2 subgoals of 3 atomic leaves each).

Meanwhile the simulator loses, duplicates and delays frames, partitions the
network, skews clocks, forges frames and crashes nodes (the Peers' SWIM
writes ``member.down``, which releases a crashed executor's claims). The run
counts as converged only when every replica also holds the root's answer.

Checks added to the simulator's own (durability, integrity, convergence):

* **plan agreement** -- every replica's plan snapshot is identical;
* **plan completion** -- the root is done with an answer, and every leaf is
  done with exactly one accepted result.

Stats: ``plan_leaves``, ``plan_duplicate_results`` (executions beyond the
first, detected and ignored by the view), ``plan_invalid_events``.

It lives with the roles (the simulator imports only the core): the ``sim``
command passes :class:`PlanCluster` to
:func:`~hivemesh.sim.campaign.run_campaign` as the cluster factory.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import KIND_GOAL, goal_body, goal_id
from hivemesh.llm import ScriptedLLM
from hivemesh.roles.base import Job, Role
from hivemesh.roles.decomposer import Decomposer
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.executor import Executor
from hivemesh.roles.scorer import Scorer
from hivemesh.sim.cluster import Cluster, SimNode, SimResult, replay_store
from hivemesh.sim.options import SimOptions

__all__ = ["PlanCluster", "plan_problems"]

_POLL, _JOB = 1000, 1001  # heap event kinds, far from the simulator's own
_NONCE = b"sim-plan-goal"
_STRATEGIES = ("by place", "by day")


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for c in node["children"]:
        out.extend(_walk(c))
    return out


def plan_problems(snapshots: list[dict[str, Any]], expected_leaves: int) -> list[str]:
    """Violations of plan agreement and completion across replica snapshots."""
    if not snapshots:
        return ["plan: no replica up"]
    problems = []
    if any(s != snapshots[0] for s in snapshots[1:]):
        problems.append("plan: replicas disagree on the plan snapshot")
    goals = snapshots[0]["goals"]
    if len(goals) != 1:
        return [*problems, f"plan: {len(goals)} root goals, want 1"]
    root = goals[0]
    if root["status"] != "done" or root["result"] is None:
        problems.append(f"plan: root is {root['status']} without an answer")
    leaves = [n for n in _walk(root) if n["kind"] == "leaf"]
    if len(leaves) != expected_leaves:
        problems.append(f"plan: {len(leaves)} leaves, want {expected_leaves}")
    for leaf in leaves:
        if leaf["status"] != "done" or leaf["result"] is None:
            problems.append(f"plan: leaf {leaf['id'][:8]} is {leaf['status']}")
    return problems


class PlanCluster(Cluster):
    """The simulator with planner roles on every node (see module docs)."""

    def __init__(
        self,
        seed: str,
        opts: SimOptions,
        *,
        fanout: tuple[int, ...] = (2, 3),
        llm_latency_ms: int = 800,
        poll_ms: int = 50,
        settle_ms: int = 300,
    ) -> None:
        self.plan_views: dict[int, PlanView] = {}
        self.plan_roles: dict[int, list[Role]] = {}
        self.fanout = fanout
        self.llm_latency_ms = llm_latency_ms
        self.poll_ms = poll_ms
        self.settle_ms = settle_ms
        self.llm = ScriptedLLM(DemoPlanner(fanout))
        self.loop = asyncio.new_event_loop()
        super().__init__(seed, opts)
        self.gid = goal_id(self.nodes[0].identity.public, _NONCE)

    def _boot(self, sn: SimNode) -> None:
        super()._boot(sn)
        assert sn.node is not None
        view = PlanView()
        for ev in replay_store(sn.store):
            view.apply(ev)
        sn.node.add_view(view)
        me = sn.identity.public
        self.plan_views[sn.index] = view
        self.plan_roles[sn.index] = [
            Decomposer(me, self.llm, strategy=_STRATEGIES[sn.index % len(_STRATEGIES)]),
            Scorer(me, self.llm),
            Executor(me, self.llm, max_concurrent=2),
        ]
        self._at(self.now + 1, _POLL, (sn.index, sn.incarnation))

    def _dispatch(self, kind: int, data: Any) -> None:
        if kind not in (_POLL, _JOB):
            super()._dispatch(kind, data)
            return
        index, incarnation = data[0], data[1]
        sn = self.nodes[index]
        if sn.node is None or sn.incarnation != incarnation:
            return  # crashed (or restarted) since: the work is lost, as in a process
        if kind == _JOB:
            if data[2]:
                self.append(index, [(e.kind, e.body) for e in data[2]])
            return
        now = self.now + sn.skew_ms
        for role in self.plan_roles[index]:
            for a in role.poll(self.plan_views[index], now):
                if isinstance(a, Job):
                    emits = self.loop.run_until_complete(a.run())
                    self._at(self.now + self.llm_latency_ms, _JOB, (index, incarnation, emits))
                else:
                    self.append(index, [(a.kind, a.body)])
        self._at(self.now + self.poll_ms, _POLL, data)

    def converged(self) -> bool:
        """The journal converged and every live replica holds the answer."""
        return bool(super().converged()) and all(
            self.plan_views[n.index].final_answer(self.gid) is not None
            for n in self.nodes
            if n.node is not None
        )

    def run(self) -> SimResult:
        """Create the goal, run the simulation, add the plan checks."""
        body = goal_body(
            "simulated plan",
            _NONCE,
            settle_ms=self.settle_ms,
            max_depth=len(self.fanout),
            scorers=self.opts.nodes,
        )
        self.append(0, [(KIND_GOAL, body)])
        try:
            result = super().run()
        finally:
            self.loop.close()
        up = [n.index for n in self.nodes if n.node is not None]
        snaps = [self.plan_views[i].snapshot() for i in up]
        leaves = 1
        for f in self.fanout:
            leaves *= f
        result.violations.extend(plan_problems(snaps, leaves))
        if snaps:
            nodes = [n for g in snaps[0]["goals"] for n in _walk(g)]
            result.stats["plan_leaves"] = sum(1 for n in nodes if n["kind"] == "leaf")
            result.stats["plan_duplicate_results"] = sum(n["duplicates"] for n in nodes)
            result.stats["plan_invalid_events"] = sum(
                sum(self.plan_views[i].invalid.values()) for i in up
            )
        return result
