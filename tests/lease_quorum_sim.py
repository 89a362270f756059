"""A seeded, deterministic simulator for the sans-IO quorum lease protocol.

N voters and K client proposers on one heap of timed events. One seed decides
message delays (reordering), loss, duplication, clock offsets and rate skews,
voter crashes/restarts (with their durable snapshot) and the clients' choices.
Every client operation is recorded as a checker ``Op`` in *true* time; a
holder's belief is computed on its own (skewed) clock and converted back.
"""

from __future__ import annotations

import contextlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.lease_quorum import Acquire, Outcome, Proposer, Release, Renew, Voter
from hivemesh.leases import DRIFT_MS, DRIFT_RATIO, FencingGuard
from hivemesh.leases.errors import StaleFencingToken
from lease_checker import Op


@dataclass(frozen=True)
class SimOptions:
    """One place to configure the simulated network and faults."""

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
    # a broken runtime, for mutation tests: a crash loses the voter's last durable
    # write although its reply was sent (acknowledged before it was on disk)
    lose_last_write: bool = False


@dataclass
class _Clock:
    offset: float
    rate: float

    def local(self, t: float) -> int:
        return int(self.offset + t * (1.0 + self.rate))

    def true_at(self, local_ms: float) -> float:
        return (local_ms - self.offset) / (1.0 + self.rate)


@dataclass
class _Client:
    name: str
    proposer: Proposer
    clock: _Clock
    rng: random.Random
    ops_left: int
    lease: tuple[str, int, int, float] | None = None  # resource, token, ttl, belief (local)
    renews_left: int = 0
    inflight: tuple[int, str, str, float, int] | None = None  # rid, kind, res, invoke, ttl
    timer_at: float = float("inf")


@dataclass
class SimResult:
    """The recorded history and counts."""

    ops: list[Op] = field(default_factory=list)
    stale_tokens: int = 0
    effects: int = 0
    crashes: int = 0
    messages: int = 0


def run_sim(seed: int | str, opts: SimOptions = SimOptions()) -> SimResult:
    """Run one seeded simulation to completion and return its history."""
    rng = {k: random.Random(f"{seed}/{k}") for k in ("net", "clock", "crash")}
    res = SimResult()
    guard = FencingGuard()
    heap: list[tuple[float, int, Callable[[], None]]] = []
    seq = 0
    now = 0.0

    def at(t: float, fn: Callable[[], None]) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, fn))

    def clock() -> _Clock:
        r = rng["clock"]
        return _Clock(r.uniform(0, opts.max_offset_ms), r.uniform(-1, 1) * opts.max_rate_skew)

    voter_ids = [f"v{i}" for i in range(opts.voters)]
    voters: dict[str, Voter | None] = {
        v: Voter(v, token_reserve=opts.token_reserve) for v in voter_ids
    }
    vclocks = {v: clock() for v in voter_ids}
    # Each voter's disk, written as the runtime does: whenever durable() changes,
    # before the reply is sent. A restart reads it back.
    disk: dict[str, dict[str, Any]] = {v: voter.snapshot() for v, voter in voters.items() if voter}
    previous_disk = dict(disk)
    resources = [f"res{i}" for i in range(opts.resources)]
    clients: dict[str, _Client] = {}
    for i in range(opts.clients):
        name = f"c{i}"
        clients[name] = _Client(
            name,
            Proposer(
                voter_ids,
                timeout_ms=opts.timeout_ms,
                retransmit_ms=opts.retransmit_ms,
                proposer_id=name,
                fanout=opts.voters // 2 + 1 if opts.thrifty else 0,
                fast_acquire=opts.fast,
            ),
            clock(),
            random.Random(f"{seed}/client/{i}"),
            opts.ops_per_client,
        )

    if opts.thrifty:  # each client prefers a different majority: partial overlaps
        for i, c in enumerate(clients.values()):
            k = i % opts.voters
            c.proposer.prefer(voter_ids[k:] + voter_ids[:k])

    def send(deliver: Callable[[], None]) -> None:
        res.messages += 1
        r = rng["net"]
        if r.random() < opts.packet_loss_probability:
            return
        at(now + r.uniform(*opts.one_way_delay_ms), deliver)
        if r.random() < opts.packet_replay_probability:
            at(now + r.uniform(*opts.one_way_delay_ms) * 2, deliver)

    def to_voter(c: _Client, v: str, msg: list[object]) -> None:
        def deliver() -> None:
            voter = voters[v]
            if voter is None:
                return  # crashed
            resource = msg[2] if len(msg) > 2 and isinstance(msg[2], str) else ""
            before = voter.durable(resource)
            reply = voter.receive(msg, vclocks[v].local(now))
            if voter.durable(resource) != before:
                previous_disk[v], disk[v] = disk[v], voter.snapshot()
            send(lambda: to_client(c, v, reply))

        send(deliver)

    def to_client(c: _Client, v: str, msg: list[object]) -> None:
        c.proposer.receive(v, msg, c.clock.local(now))
        pump(c)

    def pump(c: _Client) -> None:
        for v, msg in c.proposer.outbox():
            to_voter(c, v, msg)
        for ev in c.proposer.events():
            on_outcome(c, ev)
        nd = c.proposer.next_deadline()
        if nd is not None:
            t = max(now, c.clock.true_at(nd + 1))
            if t < c.timer_at or c.timer_at <= now:
                c.timer_at = t
                at(t, lambda: fire(c))

    def fire(c: _Client) -> None:
        c.timer_at = float("inf")
        c.proposer.handle_timer(c.clock.local(now))
        pump(c)

    def start(c: _Client, kind: str, op: Acquire | Renew | Release, ttl: int) -> None:
        c.ops_left -= 1
        rid = c.proposer.start(op, c.clock.local(now))
        c.inflight = (rid, kind, op.resource, now, ttl)
        pump(c)

    def act(c: _Client) -> None:
        if c.inflight is not None:
            return
        if c.lease is None:
            if c.ops_left <= 0:
                return
            ttl = c.rng.choice(opts.ttls_ms)
            start(c, "acquire", Acquire(c.rng.choice(resources), c.name, ttl), ttl)
            return
        resource, token, ttl, belief = c.lease
        if c.clock.local(now) < belief:
            with contextlib.suppress(StaleFencingToken):  # counted by guard.rejected
                guard.check(token, resource)  # the side effect, fenced
                res.effects += 1
        if c.renews_left > 0 and c.ops_left > 0:
            c.renews_left -= 1
            start(c, "renew", Renew(resource, c.name, token, ttl), ttl)
        elif c.rng.random() < 0.8 and c.ops_left > 0:
            start(c, "release", Release(resource, c.name, token), 0)
        else:
            c.lease = None  # abandon: let it expire
            at(now + c.rng.uniform(0, 20), lambda: act(c))

    def on_outcome(c: _Client, ev: Outcome) -> None:
        assert c.inflight is not None and c.inflight[0] == ev.rid
        _, kind, resource, invoked, ttl = c.inflight
        c.inflight = None
        status = "unknown" if ev.status == "fail" and ev.partial else ev.status
        belief_local = c.clock.local(invoked) + ttl * (1 - DRIFT_RATIO) - DRIFT_MS
        ok = status == "ok"
        valid_until = c.clock.true_at(belief_local) if ok and kind != "release" else None
        token = ev.token
        res.ops.append(
            Op(c.name, kind, resource, invoked, now, status, token, ttl, valid_until)  # type: ignore[arg-type]
        )
        if kind in ("acquire", "renew") and ok:
            assert token is not None
            c.lease = (resource, token, ttl, belief_local)
            if kind == "acquire":
                c.renews_left = c.rng.randint(0, 3)
            at(now + c.rng.uniform(0, ttl * 0.45), lambda: act(c))
        else:
            c.lease = None
            at(now + c.rng.uniform(0, 30), lambda: act(c))

    def crash() -> None:
        r = rng["crash"]
        v = r.choice(voter_ids)
        voter = voters[v]
        if voter is not None:
            state = previous_disk[v] if opts.lose_last_write else disk[v]
            voters[v] = None
            res.crashes += 1

            def restart() -> None:
                voters[v] = Voter(
                    v,
                    state=state,
                    now_ms=vclocks[v].local(now),
                    token_reserve=opts.token_reserve,
                )
                disk[v] = previous_disk[v] = state

            at(now + r.uniform(*opts.restart_after_ms), restart)
        at(now + r.expovariate(opts.voter_crash_per_s) * 1000, crash)

    for c in clients.values():
        at(c.rng.uniform(0, 10), lambda c=c: act(c))  # type: ignore[misc]
    if opts.voter_crash_per_s > 0:
        at(rng["crash"].expovariate(opts.voter_crash_per_s) * 1000, crash)

    def busy() -> bool:
        return any(c.ops_left > 0 or c.inflight is not None for c in clients.values())

    while heap and now < opts.max_sim_ms and busy():
        now, _, fn = heapq.heappop(heap)
        fn()
    res.stale_tokens = guard.rejected
    return res
