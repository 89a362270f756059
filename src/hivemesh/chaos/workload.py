"""The work a chaos run puts on the cluster, and what it remembers of it.

* **Context writes** (:class:`Writers`): one thread per node sets unique keys
  of the ``chaos`` context through the node's control socket; a write that
  returned is *acknowledged* and must end up on every node.
* **Leases** (:class:`LeaseWorkload`): clients, each bound to one node's
  control socket (``mesh://DATA_DIR``), acquire, renew and release a few
  resources; every call is recorded with its invocation and completion on
  the runner's monotonic clock, for :func:`hivemesh.verify.check_history`.
  While it believes it holds a lease a client performs effects at a
  :class:`FencedResource`, which accepts a token only if no higher one was
  seen; now and then a holder stalls past its TTL (a GC pause) and then
  tries its effect anyway: the resource must refuse it when a newer holder
  has been there.
* **Telemetry** (:class:`Telemetry`): each node but the collector records
  numbered metrics (``metrics.record``); the collector must store each
  acknowledged record exactly once, or report it as a gap.

Every loop is bounded in count and stops at the run's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hivemesh.chaos.hosts import ChaosNode
from hivemesh.errors import HivemeshError
from hivemesh.verify import Op

__all__ = ["FencedResource", "LeaseWorkload", "Telemetry", "Writers"]

CONTEXT = "chaos"
METRIC = "chaos.tick"


class Writers:
    """Acknowledged context writes from every node (see module docs)."""

    def __init__(self, nodes: list[ChaosNode], seed: int, *, interval_s: float = 0.05) -> None:
        self.nodes = nodes
        self.seed = seed
        self.interval_s = interval_s
        self.acked: dict[str, str] = {}
        self.failed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: nodes whose writer waits (a fault needs their feed to stand still)
        self.held: set[str] = set()
        self._idle: dict[str, threading.Event] = {n.label: threading.Event() for n in nodes}

    def hold(self, label: str, timeout_s: float = 10.0) -> bool:
        """Make ``label``'s writer wait; True once it is between writes."""
        self._idle[label].clear()
        self.held.add(label)
        return self._idle[label].wait(timeout_s)

    def release(self, label: str) -> None:
        """Let ``label``'s writer go on."""
        self.held.discard(label)

    def start(self) -> None:
        """One writer thread per node."""
        for node in self.nodes:
            t = threading.Thread(target=self._run, args=(node,), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, node: ChaosNode) -> None:
        rnd = random.Random(f"{self.seed}/writer/{node.label}")
        i = 0
        while not self._stop.is_set() and i < 10_000:
            if node.label in self.held:
                self._idle[node.label].set()
                self._stop.wait(0.05)
                continue
            key, value = f"{node.label}-{i}", f"v{rnd.randrange(1 << 30)}"
            i += 1
            if not node.running or node.paused:
                self._stop.wait(0.1)
                continue
            try:
                node.client(timeout_s=3.0).ctx_set(CONTEXT, key, value)
            except (HivemeshError, OSError) as exc:
                with self._lock:
                    code = getattr(exc, "code", type(exc).__name__)
                    self.failed[code] = self.failed.get(code, 0) + 1
                self._stop.wait(0.1)
                continue
            with self._lock:
                self.acked[key] = value
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop and join every writer."""
        self._stop.set()
        for t in self._threads:
            t.join(10)


class FencedResource:
    """Where lease holders' effects land: accepts a token unless a higher one
    was accepted before (per resource); remembers every attempt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.highest: dict[str, int] = {}
        self.accepted: list[tuple[float, str, int, str]] = []  # (t, resource, token, holder)
        self.refused: list[tuple[float, str, int, str]] = []

    def effect(self, resource: str, token: int, holder: str) -> bool:
        """Apply one effect with ``token``; False if it was fenced off."""
        with self._lock:
            t = time.monotonic()
            if token < self.highest.get(resource, 0):
                self.refused.append((t, resource, token, holder))
                return False
            self.highest[resource] = token
            self.accepted.append((t, resource, token, holder))
            return True

    def violations(self) -> list[str]:
        """Accepted effects whose tokens went backwards, or one token used by
        two holders (the resource's own account, independent of its guard)."""
        out: list[str] = []
        last: dict[str, int] = {}
        owner: dict[tuple[str, int], str] = {}
        for _, resource, token, holder in self.accepted:
            if token < last.get(resource, 0):
                out.append(f"{resource}: token {token} accepted after {last[resource]}")
            last[resource] = max(last.get(resource, 0), token)
            if owner.setdefault((resource, token), holder) != holder:
                out.append(f"{resource}: token {token} used by {owner[(resource, token)]} and "
                           f"{holder}")  # fmt: skip
        return out


@dataclass
class LeaseWorkload:
    """Lease clients on several nodes; the recorded history (module docs)."""

    nodes: list[ChaosNode]
    seed: int
    clients: int = 3
    resources: int = 2
    ttl_ms: int = 1500
    ops: list[Op] = field(default_factory=list)
    resource: FencedResource = field(default_factory=FencedResource)
    stalls: int = 0
    stale_refused: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the clients on an event loop in a thread of their own."""
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the clients and wait for them."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _ms(self, t: float | None = None) -> float:
        return ((time.monotonic() if t is None else t) - self.t0) * 1000.0

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    def _count(self, exc: BaseException) -> None:
        code = getattr(exc, "code", type(exc).__name__)
        self.errors[code] = self.errors.get(code, 0) + 1

    async def _client(self, i: int) -> None:
        from hivemesh.leases import LeaseClient, open_backend
        from hivemesh.leases.errors import LeaseContended, LeaseLost, LeaseUnavailable

        rnd = random.Random(f"{self.seed}/lease/{i}")
        node = self.nodes[i % len(self.nodes)]
        holder = f"c{i}"
        names = [f"res{j}" for j in range(self.resources)]
        client = LeaseClient(open_backend(f"mesh://{node.data_dir}"), holder, call_timeout_s=2.0)
        ttl = self.ttl_ms
        try:
            for _ in range(2000):
                if self._stop.is_set():
                    break
                if not node.running or node.paused:
                    await asyncio.sleep(0.2)
                    continue
                res = rnd.choice(names)
                t0 = self._ms()
                try:
                    lease = await client.try_acquire(res, ttl)
                except LeaseContended as exc:
                    self._count(exc)
                    self.ops.append(
                        Op(holder, "acquire", res, t0, self._ms(), "unknown", None, ttl)
                    )
                    await asyncio.sleep(rnd.uniform(0.02, 0.1))
                    continue
                except LeaseUnavailable as exc:
                    self._count(exc)
                    self.ops.append(Op(holder, "acquire", res, t0, self._ms(), "fail", None, ttl))
                    await asyncio.sleep(rnd.uniform(0.02, 0.1))
                    continue
                except HivemeshError as exc:
                    self._count(exc)
                    self.ops.append(
                        Op(holder, "acquire", res, t0, self._ms(), "unknown", None, ttl)
                    )
                    await asyncio.sleep(0.1)
                    continue
                tok = lease.fencing_token
                self.ops.append(
                    Op(holder, "acquire", res, t0, self._ms(), "ok", tok, ttl,
                       self._ms(lease.expires))
                )  # fmt: skip
                for _ in range(rnd.randint(0, 3)):
                    if lease.valid():
                        self.resource.effect(res, tok, holder)
                    await asyncio.sleep(rnd.uniform(0.0, ttl / 4000))
                    if rnd.random() < 0.1:  # a stall past the TTL, then the effect anyway
                        self.stalls += 1
                        await asyncio.sleep(ttl * 1.5 / 1000)
                        if not self.resource.effect(res, tok, holder):
                            self.stale_refused += 1
                        break
                    r0 = self._ms()
                    try:
                        lease = await client.renew(lease)
                    except LeaseLost as exc:
                        self._count(exc)
                        self.ops.append(Op(holder, "renew", res, r0, self._ms(), "fail", tok, ttl))
                        break
                    except HivemeshError as exc:
                        self._count(exc)
                        self.ops.append(
                            Op(holder, "renew", res, r0, self._ms(), "unknown", tok, ttl)
                        )
                        break
                    self.ops.append(
                        Op(holder, "renew", res, r0, self._ms(), "ok", tok, ttl,
                           self._ms(lease.expires))
                    )  # fmt: skip
                r0 = self._ms()
                try:
                    await client.release(lease)
                    out = "ok"
                except LeaseLost as exc:
                    self._count(exc)
                    out = "fail"
                except HivemeshError as exc:
                    self._count(exc)
                    out = "unknown"
                self.ops.append(Op(holder, "release", res, r0, self._ms(), out, tok))  # type: ignore[arg-type]
                await asyncio.sleep(rnd.uniform(0.01, 0.1))
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()


class Telemetry:
    """Numbered metrics from every node but the collector (module docs)."""

    def __init__(self, nodes: list[ChaosNode], seed: int, *, interval_s: float = 0.2) -> None:
        self.nodes = nodes
        self.interval_s = interval_s
        #: agent -> value -> the sender's spool seq, for every acknowledged record
        self.acked: dict[str, dict[int, int]] = {f"chaos-{n.label}": {} for n in nodes}
        self.address = {f"chaos-{n.label}": n.address for n in nodes}
        self.failed = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """One recorder thread per sender node."""
        for node in self.nodes:
            t = threading.Thread(target=self._run, args=(node,), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, node: ChaosNode) -> None:
        i = 0
        while not self._stop.is_set() and i < 5000:
            if not node.running or node.paused:
                self._stop.wait(0.2)
                continue
            agent = f"chaos-{node.label}"
            try:
                got = node.client(timeout_s=3.0).call(
                    "metrics.record", name=METRIC, value=float(i), agent=agent
                )
            except (HivemeshError, OSError):
                self.failed += 1
                self._stop.wait(0.2)
                i += 1  # not acknowledged: a hole in the values, never checked
                continue
            self.acked[agent][i] = int(got["first_seq"])
            i += 1
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop and join the recorders."""
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def stored(self, collector: ChaosNode) -> dict[tuple[str, int], int] | None:
        """``(agent, value) -> times stored`` at the collector (None: no answer)."""
        sql = (
            f"SELECT agent, CAST(value AS BIGINT) AS v, count(*) AS n FROM metrics "
            f"WHERE name = '{METRIC}' GROUP BY agent, v"
        )
        try:
            got: Any = collector.client(timeout_s=10.0).call("metrics", what="query", sql=sql)
        except (HivemeshError, OSError):
            return None
        return {(str(a), int(v)): int(n) for a, v, n in got["rows"]}

    def gaps(self, collector: ChaosNode) -> dict[str, list[tuple[int, int]]] | None:
        """Sender address -> seq ranges the collector reports lost (None: no answer)."""
        try:
            got: Any = collector.client(timeout_s=10.0).call("metrics", what="gaps")
        except (HivemeshError, OSError):
            return None
        return {str(r["sender"]): [(int(a), int(b)) for a, b in r["gaps"]] for r in got}


class PlanGoals:
    """Root goals posted from random nodes (``plan.goal``); an acknowledged
    goal must be in the plan of every node, and every node's plan view must
    have the same digest. (Planner roles are not run: no LLM in the lab.)"""

    def __init__(self, nodes: list[ChaosNode], seed: int, *, interval_s: float = 0.7) -> None:
        self.nodes = nodes
        self.seed = seed
        self.interval_s = interval_s
        self.acked: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Post goals from a thread until stopped."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rnd = random.Random(f"{self.seed}/plan")
        for i in range(1000):
            if self._stop.wait(self.interval_s):
                return
            node = rnd.choice(self.nodes)
            if not node.running or node.paused:
                continue
            with contextlib.suppress(HivemeshError, OSError):
                got = node.client(timeout_s=3.0).call("plan.goal", title=f"chaos goal {i}")
                self.acked.append(str(got["goal"]))

    def stop(self) -> None:
        """Stop posting."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    @staticmethod
    def view(node: ChaosNode) -> tuple[str, set[str]]:
        """``(digest, goal ids)`` of ``node``'s plan."""
        got: Any = node.client(timeout_s=10.0).call("plan.show")
        return str(got["digest"]), set(got["goals"])
