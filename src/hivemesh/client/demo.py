"""``hivemesh demo``: a local swarm of real node processes, narrated and checked.

The demo starts ``nodes`` separate ``hivemesh up`` processes on loopback and
walks through the system's promises, *checking* each one through the nodes'
control sockets (it does not just print):

1. the nodes join one node's private swarm, each with its own single-use
   invite, and find each other;
2. a name claimed on one node resolves everywhere;
3. shared context written on one node appears on all;
4. an acknowledged direct message reaches a node by name;
5. a node killed with SIGKILL is detected as down within the SWIM bound;
6. writes continue while it is down;
7. it restarts and catches up with nothing lost.

Each step has a deadline; the whole run is bounded (about 30 s on a laptop,
``total_timeout_s`` at most). The result is a :class:`DemoReport`; the exit
status is 0 only if every check passed. Every child process is killed on
the way out, whatever happens.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.errors import HivemeshError

__all__ = ["DemoReport", "Step", "run_demo"]


@dataclass
class Step:
    """One checked promise."""

    name: str
    ok: bool
    seconds: float
    detail: str


@dataclass
class DemoReport:
    """What the demo saw."""

    nodes: int
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    data_dir: str = ""

    @property
    def ok(self) -> bool:
        """True if every step passed."""
        return bool(self.steps) and all(s.ok for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        """A machine-readable summary."""
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "seconds": round(self.seconds, 3),
            "data_dir": self.data_dir,
            "steps": [
                {"name": s.name, "ok": s.ok, "seconds": round(s.seconds, 3), "detail": s.detail}
                for s in self.steps
            ],
        }


class _Narrator:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.t0 = time.monotonic()

    def line(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.t0:5.1f}s] {text}")


def _short(node: NodeProc) -> str:
    return f"{node.label} ({node.address[:10]}…)"


def run_demo(
    *,
    nodes: int = 5,
    root: str | Path | None = None,
    say: Callable[[str], None] = print,
    total_timeout_s: float = 55.0,
    broker: str | None = None,
) -> DemoReport:
    """Run the demo (see module docs) and return its report; ``broker``: a
    broker URL to run every node in broker mode (docs/broker.md)."""
    if nodes < 3:
        raise ValueError("the demo needs at least 3 nodes")
    tmp = None
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="hivemesh-demo-")
        root = tmp.name
    report = DemoReport(nodes=nodes, data_dir=str(root))
    n = _Narrator(say)
    t_start = time.monotonic()
    deadline = t_start + total_timeout_s

    def budget(want_s: float) -> float:
        return max(0.5, min(want_s, deadline - time.monotonic()))

    def check(name: str, fn: Callable[[], str]) -> bool:
        t = time.monotonic()
        try:
            detail = fn()
            ok = True
        except (HivemeshError, AssertionError, OSError, ValueError) as exc:
            detail, ok = f"{type(exc).__name__}: {exc}", False
        step = Step(name, ok, time.monotonic() - t, detail)
        report.steps.append(step)
        n.line(f"{'✔' if ok else '✘'} {name}: {detail}")
        return ok

    env = {} if broker is None else {"HIVEMESH_MESH": broker}
    swarm = LocalSwarm(root, trust_mode="invite", env=env)  # private, as every node by default
    try:
        labels = [f"node{i + 1}" for i in range(nodes)]
        victim, writer, named = labels[-1], labels[0], labels[1]
        n.line(f"starting {nodes} node processes on 127.0.0.1 (data under {root})")
        n.line(
            "  loopback timings: SWIM probe every"
            f" {swarm.env['HIVEMESH_PROBE_INTERVAL_MS']} ms, anti-entropy every"
            f" {swarm.env['HIVEMESH_SYNC_INTERVAL_MS']} ms"
        )

        def start_all() -> str:
            first = swarm.start(labels[0])
            n.line(f"  {_short(first)} listening on {first.endpoint}; it invites the others")
            others = swarm.start_many(labels[1:], bootstrap=[])
            for node in others:
                token = first.client.call("invite", ttl_s=600)["token"]
                res = node.client.call("join", token=token, timeout_s=budget(10))
                n.line(
                    f"  {_short(node)} joined with invite …{token[-8:]} in {res['seconds']:.2f} s"
                )
            return f"{nodes} processes running, {nodes - 1} joined by invite"

        if not check("start", start_all):
            return report
        n.line("waiting for the nodes to find each other (SWIM membership + peer exchange)…")

        def mesh() -> str:
            everyone = {swarm.nodes[label].address for label in labels}

            def sees_all(label: str) -> bool:
                members = swarm.status(label)["members"]
                up = {a for a, m in members.items() if m["state"] == "up"}
                return up >= everyone - {swarm.nodes[label].address}

            wait_until(
                lambda: all(sees_all(label) for label in labels),
                budget(15),
                what="every node sees every other node up",
            )
            return f"every node sees the other {nodes - 1} as up"

        if not check("nodes find each other", mesh):
            return report

        def name() -> str:
            node = swarm.nodes[named]
            res = node.client.claim_name("planner")
            assert res["ours"], f"name held by {res['owner']}"
            wait_until(
                lambda: all(
                    swarm.nodes[label].client.call("names").get("planner") == node.address
                    for label in labels
                ),
                budget(10),
                what="every node resolves planner",
            )
            return f"{named} claimed 'planner'; all {nodes} nodes resolve it"

        check("a name resolves everywhere", name)

        def context() -> str:
            t = time.monotonic()
            swarm.nodes[writer].client.ctx_set("default", "goal", "summarise the incident")
            n.line(f"  {writer} wrote goal = 'summarise the incident'")
            wait_until(
                lambda: all(
                    swarm.nodes[label].client.ctx_get("default", "goal").get("value")
                    == "summarise the incident"
                    for label in labels
                ),
                budget(10),
                what="goal on every node",
            )
            ms = (time.monotonic() - t) * 1000
            return f"visible on all {nodes} nodes after {ms:.0f} ms"

        check("shared context appears on all nodes", context)

        def message() -> str:
            sender = swarm.nodes[labels[2]]
            r = sender.client.send("planner", {"task": "triage", "priority": 1}, timeout_s=10)
            inbox = swarm.nodes[named].client.inbox()
            assert any(m["msg_id"] == r["msg_id"] for m in inbox), "not in the inbox"
            return f"{labels[2]} → planner acknowledged in {r['rtt_ms']:.1f} ms, found in its inbox"

        check("a direct message is delivered and acknowledged", message)

        observers = [label for label in labels if label != victim]
        before_kill: dict[str, Any] = {}

        def kill() -> str:
            swarm.nodes[victim].client.ctx_set("default", "last-words", f"{victim} was here")
            wait_until(swarm.converged, budget(10), what="swarm converged before the kill")
            bound_s = swarm.status(observers[0])["detection_bound_ms"] / 1000
            before_kill["own_seq"] = swarm.status(victim)["journal"]["own_seq"]
            n.line(f"  kill -9 {victim} (SWIM detection bound here: {bound_s:.1f} s)")
            t = time.monotonic()
            swarm.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: all(swarm.member_state(label, victim) == "down" for label in observers),
                budget(bound_s + 5),
                what=f"every survivor marks {victim} down",
                interval_s=0.1,
            )
            took = time.monotonic() - t
            assert took <= bound_s + 1.0, f"took {took:.1f}s, bound {bound_s:.1f}s"
            return f"all {len(observers)} survivors marked {victim} down after {took:.1f} s"

        if not check("a SIGKILLed node is detected as down", kill):
            return report

        def writes() -> str:
            for i in range(10):
                label = observers[i % len(observers)]
                swarm.nodes[label].client.ctx_set("work", f"item-{i}", {"by": label, "i": i})
            wait_until(lambda: swarm.converged(observers), budget(10), what="survivors converge")
            return f"10 writes from {len(observers)} survivors replicated among them"

        check("writes continue while it is down", writes)

        def restart() -> str:
            t = time.monotonic()
            node = swarm.restart(victim)
            n.line(f"  restarted {victim} on {node.endpoint}; it replays its journal and syncs")
            vv = wait_until(swarm.converged, budget(15), what=f"{victim} catches up")
            work = node.client.ctx_get("work").get("kv", {})
            assert len(work) == 10, f"{victim} has {len(work)} of 10 items"
            last = node.client.ctx_get("default", "last-words")["value"]
            assert last == f"{victim} was here", "its own pre-kill write is missing"
            st = node.client.status()
            assert st["journal"]["own_seq"] >= before_kill["own_seq"], "own feed shrank"
            wait_until(
                lambda: all(swarm.member_state(label, victim) == "up" for label in observers),
                budget(10),
                what=f"every survivor sees {victim} up again",
            )
            took = time.monotonic() - t
            events = sum(vv.values())
            return (
                f"caught up in {took:.1f} s: {events} events, all 10 new items, its own"
                " pre-kill write intact; every node sees it up"
            )

        check("the restarted node catches up with nothing lost", restart)
        return report
    finally:
        swarm.close()
        report.seconds = time.monotonic() - t_start
        if tmp is not None:
            tmp.cleanup()
