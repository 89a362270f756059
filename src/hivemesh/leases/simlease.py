"""The leases workload (``hivemesh sim --workload leases``): quorum leases voted
by the nodes themselves, over a lossy, reordering network with crashes.

Theory of operation
-------------------
Node ``i`` runs what a daemon runs for leases: a
:class:`~hivemesh.core.lease_voter.Voter` (``v<i>``, while ``i < voters``)
whose durable state is written to its disk before any reply that follows a
change of it, and a :class:`~hivemesh.core.lease_quorum.Proposer` used by the
node's application (``c<i>``, while ``i < clients``). The per-node wiring is
one class, :class:`LeaseNode`. All of it sits on one heap of timed events;
one seed decides message delays (reordering), loss, duplication, each node's
clock offset and rate skew, voter crashes and restarts (from their durable
snapshot, then quarantined) and the applications' choices.

Every application operation is recorded as a
:class:`~hivemesh.verify.linearizability.Op` in *true* time (a holder's belief is
computed on its own skewed clock and converted back), and the history is
checked by :func:`~hivemesh.verify.linearizability.check_history`: exclusion,
increasing fencing tokens, no spurious failure.

**The split prepare (holder killed).** After the random phase, with every
voter back up and out of quarantine and a perfect network, the run replays the
failure first seen on real processes (``kill -9`` of a lease holder's node):

1. node ``h`` acquires ``split`` for a long TTL while the network carries its
   messages only to a bare majority of voters, its own among them (the grant
   lands on exactly a majority);
2. node ``h`` dies: its voter with it, so the live voters are split "held"
   (``majority - 1``) / "free" (the rest) and, with an odd number of voters,
   neither "a free majority" nor "more than ``n - majority`` held" can be
   reached without the dead voter;
3. node ``o`` acquires ``split``: it must fail (busy) before its deadline,
   not end ``unknown`` at the deadline (it did before the fix: the prepare
   waited for the dead voter, and the application saw "backend unavailable"
   for the whole TTL);
4. once the TTL has run out on every voter's clock, ``o`` acquires again: ok.

Steps 3 and 4 are checked (``split prepare ...`` violations), and the
operations join the history.

It lives with the leases (the simulator imports only the core): the
campaign names :class:`LeaseCluster` as the ``leases`` workload's factory.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.lease_quorum import Acquire, Outcome, Proposer, Release, Renew
from hivemesh.core.lease_voter import Voter
from hivemesh.leases import DRIFT_MS, DRIFT_RATIO, FencingGuard
from hivemesh.leases.errors import StaleFencingToken
from hivemesh.sim.cluster import SimResult
from hivemesh.sim.options import SimOptions
from hivemesh.verify.linearizability import Op, check_history

__all__ = ["LeaseCluster", "LeaseNode", "LeaseOptions", "LeaseRun", "run_sim"]

#: The split-prepare scenario's lease: long enough that only the fix answers
#: before the competing acquire's deadline.
SPLIT_TTL_MS = 3_000
_SPLIT = "split"


@dataclass(frozen=True)
class LeaseOptions:
    """One place to configure the simulated network, faults and workload."""

    voters: int = 5
    clients: int = 3
    resources: int = 1
    ops_per_client: int = 30
    one_way_delay_ms: tuple[float, float] = (0.5, 15.0)
    packet_loss_probability: float = 0.1
    packet_replay_probability: float = 0.05
    max_rate_skew: float = 0.004  # each clock's rate within +-0.4 %: pairwise < DRIFT_RATIO
    max_offset_ms: int = 100_000
    voter_crash_per_s: float = 0.0
    restart_after_ms: tuple[float, float] = (5.0, 300.0)
    timeout_ms: int = 400
    retransmit_ms: int = 30
    ttls_ms: tuple[int, ...] = (60, 100, 200)
    max_sim_ms: float = 120_000.0
    thrifty: bool = False  # proposers ask a majority first (Proposer(fanout=majority))
    fast: bool = False  # Proposer(fast_acquire=True): accept without prepare when known
    token_reserve: int = 0  # Voter(token_reserve=...): durable token bound written ahead
    #: A broken runtime, for mutation tests: a crash loses the voter's last
    #: durable write although its reply was sent (acknowledged before it was on disk).
    lose_last_write: bool = False
    #: Run the split-prepare scenario after the random phase (module docs).
    split_prepare: bool = False


@dataclass
class _Clock:
    offset: float
    rate: float

    def local(self, t: float) -> int:
        return int(self.offset + t * (1.0 + self.rate))

    def true_at(self, local_ms: float) -> float:
        return (local_ms - self.offset) / (1.0 + self.rate)


@dataclass
class LeaseRun:
    """The recorded history and counts of one run."""

    ops: list[Op] = field(default_factory=list)
    stale_tokens: int = 0
    effects: int = 0
    crashes: int = 0
    messages: int = 0
    #: Broken expectations of the split-prepare scenario.
    problems: list[str] = field(default_factory=list)
    #: Proposer and voter counters, summed over nodes.
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class LeaseNode:
    """One node's lease machinery: its voter (with its disk) and the proposer
    its application uses. The one place where the simulator wires them."""

    index: int
    clock: _Clock
    rng: random.Random
    voter_id: str | None
    voter: Voter | None
    proposer: Proposer | None
    ops_left: int
    #: The voter's durable state as on disk, and the write before it.
    disk: dict[str, Any] = field(default_factory=dict)
    previous_disk: dict[str, Any] = field(default_factory=dict)
    alive: bool = True
    lease: tuple[str, int, int, float] | None = None  # resource, token, ttl, belief (local)
    renews_left: int = 0
    inflight: tuple[int, str, str, float, int] | None = None  # rid, kind, res, invoke, ttl
    timer_at: float = float("inf")
    #: The outcome handler of the operation in flight (the workload's, or a scenario's).
    on_outcome: Callable[[Outcome], None] | None = None

    @property
    def name(self) -> str:
        """The application's (client's) name."""
        return f"c{self.index}"

    def vote(self, msg: list[object], now_ms: int) -> list[object] | None:
        """The voter's reply to ``msg`` (its durable state written first), or
        None while the node is down."""
        if self.voter is None:
            return None
        resource = msg[2] if len(msg) > 2 and isinstance(msg[2], str) else ""
        before = self.voter.durable(resource)
        reply = self.voter.receive(msg, now_ms)
        if self.voter.durable(resource) != before:
            self.previous_disk, self.disk = self.disk, self.voter.snapshot()
        return reply

    def crash_voter(self, lose_last_write: bool) -> None:
        """The voter's process dies; what it restarts from is on its disk."""
        if lose_last_write:
            self.disk = self.previous_disk
        self.voter = None

    def restart_voter(self, now_ms: int, token_reserve: int) -> None:
        """The voter restarts from its disk (quarantined for its longest TTL)."""
        assert self.voter_id is not None
        self.voter = Voter(
            self.voter_id, state=self.disk, now_ms=now_ms, token_reserve=token_reserve
        )
        self.previous_disk = self.disk


class _LeaseSim:
    """The heap, the network and the workload of one seeded run."""

    def __init__(self, seed: int | str, opts: LeaseOptions) -> None:
        self.opts = opts
        self.rng = {k: random.Random(f"{seed}/{k}") for k in ("net", "clock", "crash")}
        self.res = LeaseRun()
        self.guard = FencingGuard()
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.now = 0.0
        self.cut: set[tuple[int, int]] = set()  # (src node, dst node) pairs that drop
        self.perfect = False
        self.voter_ids = [f"v{i}" for i in range(opts.voters)]
        self.resources = [f"res{i}" for i in range(opts.resources)]
        self.nodes: list[LeaseNode] = []
        for i in range(max(opts.voters, opts.clients)):
            voter = Voter(f"v{i}", token_reserve=opts.token_reserve) if i < opts.voters else None
            proposer = None
            if i < opts.clients:
                proposer = Proposer(
                    self.voter_ids,
                    timeout_ms=opts.timeout_ms,
                    retransmit_ms=opts.retransmit_ms,
                    proposer_id=f"c{i}",
                    fanout=opts.voters // 2 + 1 if opts.thrifty else 0,
                    fast_acquire=opts.fast,
                )
            r = self.rng["clock"]
            clock = _Clock(r.uniform(0, opts.max_offset_ms), r.uniform(-1, 1) * opts.max_rate_skew)
            n = LeaseNode(
                i,
                clock,
                random.Random(f"{seed}/client/{i}"),
                f"v{i}" if voter else None,
                voter,
                proposer,
                opts.ops_per_client if proposer else 0,
            )
            if voter is not None:
                n.disk = n.previous_disk = voter.snapshot()
            self.nodes.append(n)
        if opts.thrifty:  # each client prefers a different majority: partial overlaps
            for n in self.nodes:
                if n.proposer is not None:
                    k = n.index % opts.voters
                    n.proposer.prefer(self.voter_ids[k:] + self.voter_ids[:k])

    # -- the heap and the network --------------------------------------------------

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn))

    def send(self, src: int, dst: int, deliver: Callable[[], None]) -> None:
        self.res.messages += 1
        r = self.rng["net"]
        o = self.opts
        if (src, dst) in self.cut:
            return
        if not self.perfect and r.random() < o.packet_loss_probability:
            return
        self.at(self.now + r.uniform(*o.one_way_delay_ms), deliver)
        if not self.perfect and r.random() < o.packet_replay_probability:
            self.at(self.now + r.uniform(*o.one_way_delay_ms) * 2, deliver)

    def to_voter(self, c: LeaseNode, v: str, msg: list[object]) -> None:
        target = self.nodes[int(v[1:])]

        def deliver() -> None:
            reply = target.vote(msg, target.clock.local(self.now))
            if reply is not None:
                self.send(target.index, c.index, lambda: self.to_client(c, reply, v))

        self.send(c.index, target.index, deliver)

    def to_client(self, c: LeaseNode, msg: list[object], v: str) -> None:
        if c.alive and c.proposer is not None:
            c.proposer.receive(v, msg, c.clock.local(self.now))
            self.pump(c)

    def pump(self, c: LeaseNode) -> None:
        assert c.proposer is not None
        for v, msg in c.proposer.outbox():
            self.to_voter(c, v, msg)
        for ev in c.proposer.events():
            if c.on_outcome is not None:
                c.on_outcome(ev)
        nd = c.proposer.next_deadline()
        if nd is not None:
            t = max(self.now, c.clock.true_at(nd + 1))
            if t < c.timer_at or c.timer_at <= self.now:
                c.timer_at = t
                self.at(t, lambda: self.fire(c))

    def fire(self, c: LeaseNode) -> None:
        c.timer_at = float("inf")
        if c.alive and c.proposer is not None:
            c.proposer.handle_timer(c.clock.local(self.now))
            self.pump(c)

    # -- the workload --------------------------------------------------------------

    def start(
        self,
        c: LeaseNode,
        kind: str,
        op: Acquire | Renew | Release,
        ttl: int,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        assert c.proposer is not None
        c.ops_left -= 1
        rid = c.proposer.start(op, c.clock.local(self.now), timeout_ms=timeout_ms)
        c.inflight = (rid, kind, op.resource, self.now, ttl)
        self.pump(c)

    def act(self, c: LeaseNode) -> None:
        if c.inflight is not None or not c.alive:
            return
        o = self.opts
        if c.lease is None:
            if c.ops_left <= 0:
                return
            ttl = c.rng.choice(o.ttls_ms)
            self.start(c, "acquire", Acquire(c.rng.choice(self.resources), c.name, ttl), ttl)
            return
        resource, token, ttl, belief = c.lease
        if c.clock.local(self.now) < belief:
            with contextlib.suppress(StaleFencingToken):  # counted by guard.rejected
                self.guard.check(token, resource)  # the side effect, fenced
                self.res.effects += 1
        if c.renews_left > 0 and c.ops_left > 0:
            c.renews_left -= 1
            self.start(c, "renew", Renew(resource, c.name, token, ttl), ttl)
        elif c.rng.random() < 0.8 and c.ops_left > 0:
            self.start(c, "release", Release(resource, c.name, token), 0)
        else:
            c.lease = None  # abandon: let it expire
            self.at(self.now + c.rng.uniform(0, 20), lambda: self.act(c))

    def record(self, c: LeaseNode, ev: Outcome) -> tuple[str, Op]:
        """Close ``c``'s operation in flight with ``ev``; its history entry."""
        assert c.inflight is not None and c.inflight[0] == ev.rid
        _, kind, resource, invoked, ttl = c.inflight
        c.inflight = None
        status = "unknown" if ev.status == "fail" and ev.partial else ev.status
        belief_local = c.clock.local(invoked) + ttl * (1 - DRIFT_RATIO) - DRIFT_MS
        ok = status == "ok"
        valid_until = c.clock.true_at(belief_local) if ok and kind != "release" else None
        op = Op(c.name, kind, resource, invoked, self.now, status, ev.token, ttl, valid_until)  # type: ignore[arg-type]
        self.res.ops.append(op)
        if ok and kind in ("acquire", "renew"):
            assert ev.token is not None
            c.lease = (resource, ev.token, ttl, belief_local)
        else:
            c.lease = None
        return status, op

    def on_outcome(self, c: LeaseNode, ev: Outcome) -> None:
        kind = c.inflight[1] if c.inflight else ""
        status, _ = self.record(c, ev)
        if kind in ("acquire", "renew") and status == "ok":
            if kind == "acquire":
                c.renews_left = c.rng.randint(0, 3)
            assert c.lease is not None
            self.at(self.now + c.rng.uniform(0, c.lease[2] * 0.45), lambda: self.act(c))
        else:
            self.at(self.now + c.rng.uniform(0, 30), lambda: self.act(c))

    def _handler(self, c: LeaseNode) -> Callable[[Outcome], None]:
        return lambda ev: self.on_outcome(c, ev)

    def crash(self) -> None:
        r = self.rng["crash"]
        n = self.nodes[self.voter_ids.index(r.choice(self.voter_ids))]
        if n.voter is not None:
            n.crash_voter(self.opts.lose_last_write)
            self.res.crashes += 1

            def restart() -> None:
                if n.alive and n.voter is None:
                    n.restart_voter(n.clock.local(self.now), self.opts.token_reserve)

            self.at(self.now + r.uniform(*self.opts.restart_after_ms), restart)
        self.at(self.now + r.expovariate(self.opts.voter_crash_per_s) * 1000, self.crash)

    def busy(self) -> bool:
        return any(c.ops_left > 0 or c.inflight is not None for c in self.nodes)

    def run_until(self, stop: Callable[[], bool], end_ms: float) -> None:
        while self.heap and self.now < end_ms and not stop():
            self.now, _, fn = heapq.heappop(self.heap)
            fn()

    def run(self) -> LeaseRun:
        for c in self.nodes:
            if c.proposer is not None:
                c.on_outcome = self._handler(c)
                self.at(c.rng.uniform(0, 10), lambda c=c: self.act(c))  # type: ignore[misc]
        if self.opts.voter_crash_per_s > 0:
            self.at(self.rng["crash"].expovariate(self.opts.voter_crash_per_s) * 1000, self.crash)
        self.run_until(lambda: not self.busy(), self.opts.max_sim_ms)
        if self.opts.split_prepare and not self.busy():
            self.split_prepare()
        self.res.stale_tokens = self.guard.rejected
        counters: dict[str, int] = {}
        for n in self.nodes:
            for part in (n.proposer, n.voter):
                for k, v in (part.counters if part is not None else {}).items():
                    counters[k] = counters.get(k, 0) + v
        self.res.counters = counters
        return self.res

    # -- the split prepare (module docs) -----------------------------------------

    def split_prepare(self) -> None:
        o = self.opts
        clients = [n for n in self.nodes if n.proposer is not None and n.voter_id is not None]
        if len(clients) < 2 or o.voters < 3:
            return
        self.heap.clear()  # the random phase is over: no more crashes, no stray timers
        for c in self.nodes:
            c.timer_at = float("inf")
            c.on_outcome = None
        self.perfect = True
        for n in self.nodes:  # every voter back, and out of quarantine before step 1
            if n.voter_id is not None and n.voter is None:
                n.restart_voter(n.clock.local(self.now), o.token_reserve)
        self.now += 2 * max(o.ttls_ms) * (1 + 2 * o.max_rate_skew) + 2 * DRIFT_MS + 50
        r = self.rng["crash"]
        h, other = r.sample(clients, 2)
        majority = o.voters // 2 + 1
        rest = [i for i in range(o.voters) if i != h.index]
        granted = {h.index, *r.sample(rest, majority - 1)}
        self.cut = {(h.index, i) for i in range(o.voters) if i not in granted}
        got: list[tuple[str, Op]] = []

        def keep(c: LeaseNode) -> Callable[[Outcome], None]:
            return lambda ev: got.append(self.record(c, ev))

        h.on_outcome = keep(h)
        self.start(h, "acquire", Acquire(_SPLIT, h.name, SPLIT_TTL_MS), SPLIT_TTL_MS)
        self.run_until(lambda: bool(got), self.now + 10 * o.timeout_ms)
        if not got or got[0][0] != "ok":
            self.res.problems.append(f"split prepare: the holder's acquire ended {got[:1]}")
            return
        h.alive = False  # kill -9: its voter and its application
        h.crash_voter(False)
        self.res.crashes += 1
        self.cut = set()
        other.on_outcome = keep(other)
        invoked = self.now
        self.start(other, "acquire", Acquire(_SPLIT, other.name, 100), 100)
        self.run_until(lambda: len(got) > 1, self.now + 10 * o.timeout_ms)
        if len(got) < 2 or got[1][0] != "fail" or got[1][1].complete_ms >= invoked + o.timeout_ms:
            self.res.problems.append(
                "split prepare: an acquire of a lease held at a bare majority whose holder's "
                f"node died ended {got[1][0] if len(got) > 1 else 'never'} "
                f"after {(got[1][1].complete_ms if len(got) > 1 else self.now) - invoked:.0f} ms "
                f"(must fail as held before its {o.timeout_ms} ms deadline)"
            )
            return
        self.now += SPLIT_TTL_MS * (1 + 2 * o.max_rate_skew) + 2 * DRIFT_MS
        self.start(other, "acquire", Acquire(_SPLIT, other.name, 100), 100)
        self.run_until(lambda: len(got) > 2, self.now + 10 * o.timeout_ms)
        if len(got) < 3 or got[2][0] != "ok":
            self.res.problems.append(
                "split prepare: once the dead holder's lease ran out, acquiring it ended "
                f"{got[2][0] if len(got) > 2 else 'never'} (must be ok)"
            )


def run_sim(seed: int | str, opts: LeaseOptions = LeaseOptions()) -> LeaseRun:
    """Run one seeded simulation to completion and return its history."""
    return _LeaseSim(seed, opts).run()


class LeaseCluster:
    """The ``leases`` workload of a seed campaign: ``opts.nodes`` nodes, each a
    voter, up to four of them with an application acquiring, renewing and
    releasing; the seed also picks the protocol's variants (thrifty and fast
    proposers, a token reserve) and the voter crash rate. Ends with the split
    prepare (module docs)."""

    def __init__(self, seed: str, opts: SimOptions) -> None:
        self.seed = seed
        r = random.Random(f"{seed}/lease-variant")
        self.opts = LeaseOptions(
            voters=opts.nodes,
            clients=min(opts.nodes, 4),
            resources=r.choice((1, 1, 2)),
            ops_per_client=20,
            packet_loss_probability=r.choice((0.0, 0.05, 0.1, 0.2)),
            voter_crash_per_s=r.choice((0.0, 1.0, 2.0)),
            thrifty=r.random() < 0.4,
            fast=r.random() < 0.4,
            token_reserve=r.choice((0, 0, 4)),
            split_prepare=True,
        )

    def run(self) -> SimResult:
        """Run the seed and check its history."""
        res = run_sim(self.seed, self.opts)
        # A restarted voter refuses, quarantined, without a witness: no spurious
        # check under crashes (as in the quorum lease tests).
        spurious = self.opts.voter_crash_per_s == 0
        found = check_history(res.ops, slack_ms=60, spurious=spurious, replicated=True)
        violations = [f"{v.rule}: {v.detail}" for v in found]
        violations += res.problems
        if res.stale_tokens:
            violations.append(f"{res.stale_tokens} fenced effects refused a valid holder's token")
        stats = {
            "lease_ops": len(res.ops),
            "lease_ok": sum(1 for op in res.ops if op.outcome == "ok"),
            "lease_unknown": sum(1 for op in res.ops if op.outcome == "unknown"),
            "lease_messages": res.messages,
            "crashes": res.crashes,
            "lease_split_prepares": int(any(op.resource == _SPLIT for op in res.ops)),
        }
        digest = hashlib.blake2b(repr(res.ops).encode(), digest_size=16).hexdigest()
        return SimResult(self.seed, violations, digest, stats)
