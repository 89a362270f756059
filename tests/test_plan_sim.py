"""Planning under loss, duplication, partitions and crashes, on virtual time.

A small deterministic simulation (until the cluster simulator grows a plan
workload): every node holds its own event set and :class:`PlanView` and runs
a decomposer, a scorer and an executor against an instant stand-in model
whose replies "arrive" ``LATENCY_MS`` of virtual time later; node clocks are
skewed by up to 400 ms. Events are
pushed to peers with random delay, loss and duplication, and pulled by
periodic anti-entropy; partitions split the cluster; crashed nodes lose
their memory and in-flight work but keep their events (their disk), and a
peer writes the failure events for them. After the active phase the network
heals and every replica must hold the same tree, with the root answered and
each leaf holding exactly one accepted result.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from hivemesh.core.event import Event
from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import KIND_GOAL, goal_body, goal_id
from hivemesh.llm import ScriptedLLM
from hivemesh.roles.base import Emit, Job, failure_events
from hivemesh.roles.decomposer import Decomposer
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.executor import Executor
from hivemesh.roles.local import FeedWriter, author_key
from hivemesh.roles.scorer import Scorer

LATENCY_MS = 100
TICK_MS = 10


@dataclass
class Node:
    index: int
    me: bytes
    writer: FeedWriter
    held: dict[bytes, Event] = field(default_factory=dict)
    view: PlanView = field(default_factory=PlanView)
    roles: list[Any] = field(default_factory=list)
    up: bool = True
    incarnation: int = 0
    skew_ms: int = 0


class PlanSim:
    def __init__(self, seed: int, nodes: int = 5, faults: bool = True) -> None:
        self.rng = random.Random(f"{seed}/net")
        self.frng = random.Random(f"{seed}/faults")
        self.faults = faults
        self.loop = asyncio.new_event_loop()
        self.llm = ScriptedLLM(DemoPlanner((3, 3)))
        self.now = 0
        self.heap: list[tuple[int, int, str, Any]] = []
        self.seq = 0
        self.side: dict[int, int] = {}  # partition side per node (empty: none)
        self.nodes = [self._node(i) for i in range(nodes)]
        self.lossy = faults
        self.stats: dict[str, int] = {"crashes": 0, "partitions": 0, "dropped": 0}

    def _node(self, i: int) -> Node:
        me = author_key(f"sim-node-{i}")
        n = Node(i, me, FeedWriter(me))
        n.skew_ms = self.frng.randint(-400, 400) if self.faults else 0
        self._roles(n)
        return n

    def _roles(self, n: Node) -> None:
        n.roles = [
            Decomposer(n.me, self.llm, strategy=("by place", "by day")[n.index % 2]),
            Scorer(n.me, self.llm),
            Executor(n.me, self.llm, max_concurrent=2),
        ]

    def at(self, t: int, what: str, arg: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, what, arg))

    def link_ok(self, a: int, b: int) -> bool:
        return not self.side or self.side.get(a) == self.side.get(b)

    # -- events --------------------------------------------------------------------

    def hold(self, n: Node, ev: Event) -> None:
        if ev.id not in n.held:
            n.held[ev.id] = ev
            n.writer.observe(ev.hlc, self.now + n.skew_ms)
            n.view.apply(ev)

    def append(self, n: Node, emit: Emit) -> None:
        ev = n.writer.make(emit.kind, emit.body, self.now + n.skew_ms)
        self.hold(n, ev)
        for peer in self.nodes:
            if peer is n:
                continue
            for _copy in range(2 if self.lossy and self.rng.random() < 0.05 else 1):
                if self.lossy and self.rng.random() < 0.1:
                    self.stats["dropped"] += 1
                    continue
                self.at(self.now + self.rng.randint(2, 40), "deliver", (n.index, peer.index, ev))

    def poll(self, n: Node) -> None:
        for role in n.roles:
            for a in role.poll(n.view, self.now + n.skew_ms):
                if isinstance(a, Emit):
                    self.append(n, a)
                else:
                    self.run_job(n, a)

    def run_job(self, n: Node, job: Job) -> None:
        emits = self.loop.run_until_complete(job.run())
        self.at(self.now + LATENCY_MS, "job_done", (n.index, n.incarnation, emits))

    def crash(self, i: int) -> None:
        n = self.nodes[i]
        if not n.up:
            return
        n.up = False
        n.incarnation += 1
        self.stats["crashes"] += 1
        observer = next((m for m in self.nodes if m.up and self.link_ok(m.index, i)), None)
        if observer is not None:
            self.at(self.now + 150, "reap", (observer.index, n.me))
        self.at(self.now + self.frng.randint(200, 1500), "restart", i)

    def restart(self, i: int) -> None:
        n = self.nodes[i]
        n.up = True
        n.view = PlanView()
        for ev in n.held.values():  # replay the disk
            n.view.apply(ev)
        self._roles(n)

    def step(self, what: str, arg: Any) -> None:
        if what == "deliver":
            src, dst, ev = arg
            if self.nodes[dst].up and self.link_ok(src, dst):
                self.hold(self.nodes[dst], ev)
        elif what == "job_done":
            i, inc, emits = arg
            n = self.nodes[i]
            if n.up and n.incarnation == inc:
                for e in emits:
                    self.append(n, e)
        elif what == "reap":
            i, dead = arg
            n = self.nodes[i]
            if n.up:
                for e in failure_events(n.view, dead):
                    self.append(n, e)
        elif what == "restart":
            self.restart(arg)
        elif what == "sync":
            self.anti_entropy()

    def anti_entropy(self) -> None:
        for n in self.nodes:
            if not n.up:
                continue
            peer = self.nodes[self.rng.randrange(len(self.nodes))]
            if peer is n or not peer.up or not self.link_ok(n.index, peer.index):
                continue
            for ev in list(peer.held.values()):
                if ev.id not in n.held:
                    self.at(
                        self.now + self.rng.randint(2, 20), "deliver", (peer.index, n.index, ev)
                    )
        self.at(self.now + 300, "sync", None)

    def faults_tick(self) -> None:
        r = self.frng.random()
        if r < 0.01:
            self.crash(self.frng.randrange(len(self.nodes)))
        elif r < 0.015 and not self.side:
            self.stats["partitions"] += 1
            cut = self.frng.randint(1, len(self.nodes) - 1)
            order = list(range(len(self.nodes)))
            self.frng.shuffle(order)
            self.side = {i: int(pos < cut) for pos, i in enumerate(order)}
        elif r < 0.03 and self.side:
            self.side = {}

    # -- run -------------------------------------------------------------------------

    def run(self, active_ms: int = 3000, limit_ms: int = 30_000) -> str:
        nonce = b"sim-goal-nonce"
        self.append(self.nodes[0], Emit(KIND_GOAL, goal_body("plan", nonce, settle_ms=30)))
        gid = goal_id(self.nodes[0].me, nonce)
        self.at(300, "sync", None)
        next_tick = 0
        while self.now < limit_ms:
            if self.now >= active_ms:
                self.lossy, self.side = False, {}
                for n in self.nodes:
                    if not n.up:
                        self.restart(n.index)
                if self.converged(gid):
                    break
            if self.heap and self.heap[0][0] <= next_tick:
                t, _s, what, arg = heapq.heappop(self.heap)
                self.now = max(self.now, t)
                self.step(what, arg)
                continue
            self.now = next_tick
            next_tick += TICK_MS
            if self.faults and self.now < active_ms:
                self.faults_tick()
            for n in self.nodes:
                if n.up:
                    self.poll(n)
        self.loop.close()
        return gid

    def converged(self, gid: str) -> bool:
        ids = {frozenset(n.held) for n in self.nodes}
        return len(ids) == 1 and all(n.view.final_answer(gid) is not None for n in self.nodes)


def check(sim: PlanSim, gid: str) -> dict[str, Any]:
    snaps = [n.view.snapshot() for n in sim.nodes]
    assert all(s == snaps[0] for s in snaps[1:]), "replicas disagree"
    root = snaps[0]["goals"][0]
    assert root["status"] == "done" and root["result"] is not None
    leaves = 0

    def walk(x: dict[str, Any]) -> None:
        nonlocal leaves
        if x["kind"] == "leaf":
            leaves += 1
            assert x["status"] == "done" and x["result"] is not None
        else:
            assert x["kind"] == "goal" and x["children"]
        for c in x["children"]:
            walk(c)

    walk(root)
    assert leaves == 9
    return root


def test_plan_converges_without_faults() -> None:
    sim = PlanSim(seed=1, faults=False)
    gid = sim.run()
    check(sim, gid)
    assert sim.converged(gid)


@pytest.mark.parametrize("seed", range(20))
def test_plan_converges_under_faults(seed: int) -> None:
    sim = PlanSim(seed=seed)
    gid = sim.run()
    assert sim.converged(gid), f"seed {seed} did not converge: {sim.stats}"
    check(sim, gid)
