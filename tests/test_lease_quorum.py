"""The sans-IO quorum lease protocol: unit behaviour, and seeded simulation
campaigns of it on the daemon's Peers (:mod:`hivemesh.sim.leases`)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core import lease_voter
from hivemesh.core.lease_quorum import Acquire, Outcome, Proposer, Release, Renew, Show, Voter
from hivemesh.errors import BackendUnavailable, DecodeError, InvalidArgument
from hivemesh.sim.cluster import SimResult
from hivemesh.sim.leases import LeaseCluster, LeaseWorkload, lease_options
from hivemesh.sim.memo import verification_memo
from hivemesh.sim.options import FaultOptions, NetworkOptions

VOTERS = ["v0", "v1", "v2", "v3", "v4"]


def drive(
    p: Proposer, voters: dict[str, Voter], now_ms: int, down: frozenset[str] = frozenset()
) -> list[Outcome]:
    """Deliver everything in order (a perfect link) until the proposer is quiet."""
    out: list[Outcome] = []
    for _ in range(100):
        msgs = p.outbox()
        if not msgs:
            break
        for v, m in msgs:
            if v not in down:
                p.receive(v, voters[v].receive(m, now_ms), now_ms)
        out.extend(p.events())
    return out + p.events()


def one(p: Proposer, voters: dict[str, Voter], op: object, now_ms: int, **kw: object) -> Outcome:
    p.start(op, now_ms)  # type: ignore[arg-type]
    (ev,) = drive(p, voters, now_ms, **kw)  # type: ignore[arg-type]
    return ev


@pytest.fixture
def cluster() -> tuple[dict[str, Voter], Proposer, Proposer]:
    return {v: Voter(v) for v in VOTERS}, Proposer(VOTERS), Proposer(VOTERS)


def test_grant_exclusion_release_and_increasing_tokens(
    cluster: tuple[dict[str, Voter], Proposer, Proposer],
) -> None:
    vs, a, b = cluster
    ga = one(a, vs, Acquire("r", "alice", 1000), 0)
    assert (ga.status, ga.token) == ("ok", 1)
    assert one(b, vs, Acquire("r", "bob", 1000), 10).status == "fail"
    assert one(a, vs, Acquire("r", "alice", 1000), 10).status == "fail"  # not re-entrant
    assert one(b, vs, Release("r", "bob", 1), 20).status == "fail"  # non-holder
    assert one(a, vs, Renew("r", "alice", 1, 1000), 500).status == "ok"
    assert one(b, vs, Acquire("r", "bob", 1000), 1200).status == "fail"  # renewed: still held
    assert one(a, vs, Release("r", "alice", 1), 1300).status == "ok"
    gb = one(b, vs, Acquire("r", "bob", 1000), 1301)
    assert gb.status == "ok" and gb.token == 2
    # expiry on the voters' clocks frees it; the old holder can neither renew nor release
    gc = one(a, vs, Acquire("r", "alice", 1000), 2302)
    assert gc.status == "ok" and gc.token == 3
    assert one(b, vs, Renew("r", "bob", 2, 1000), 2303).status == "fail"


def test_minority_down_still_works_majority_down_is_unknown(
    cluster: tuple[dict[str, Voter], Proposer, Proposer],
) -> None:
    vs, a, _ = cluster
    assert one(a, vs, Acquire("r", "alice", 1000), 0, down=frozenset({"v0", "v1"})).status == "ok"
    a.start(Acquire("s", "alice", 1000), 0)
    assert drive(a, vs, 0, down=frozenset({"v0", "v1", "v2"})) == []
    assert a.next_deadline() is not None
    a.handle_timer(10_000)
    (ev,) = a.events()
    assert ev.status == "unknown" and ev.token is None


def test_tokens_survive_voter_restart_and_quarantine_refuses(
    cluster: tuple[dict[str, Voter], Proposer, Proposer],
) -> None:
    vs, a, b = cluster
    assert one(a, vs, Acquire("r", "alice", 500), 0).token == 1
    # every voter restarts: the lease is invisible, so they refuse until the max TTL passes
    vs = {v: Voter(v, state=vs[v].snapshot(), now_ms=100) for v in VOTERS}
    assert one(b, vs, Acquire("r", "bob", 500), 200).status == "fail"
    assert one(a, vs, Renew("r", "alice", 1, 500), 200).status == "fail"
    gb = one(b, vs, Acquire("r", "bob", 500), 601)
    assert gb.status == "ok" and gb.token == 2
    with pytest.raises(InvalidArgument):
        Voter("v0", state={"max_tokens": {"r": "x"}, "max_ttl_ms": 5})


def test_racing_acquires_with_the_same_token_cannot_both_win() -> None:
    vs = {v: Voter(v) for v in VOTERS}
    a, b = Proposer(VOTERS), Proposer(VOTERS)
    a.start(Acquire("r", "alice", 1000), 0)
    b.start(Acquire("r", "bob", 1000), 0)
    # both prepares see the resource free; both propose token 1
    for p in (a, b):
        for v, m in p.outbox():
            p.receive(v, vs[v].receive(m, 0), 0)
    acc_a, acc_b = dict(a.outbox()), dict(b.outbox())
    assert acc_a["v0"][3] == acc_b["v0"][3] == 1
    for i, v in enumerate(VOTERS):  # interleave: a wins v0..v2, b wins v3, v4
        first, second = ((a, acc_a), (b, acc_b)) if i < 3 else ((b, acc_b), (a, acc_a))
        for p, acc in (first, second):
            p.receive(v, vs[v].receive(acc[v], 1), 1)
    (ea,), (eb,) = a.events(), b.events()
    assert (ea.status, ea.token) == ("ok", 1)
    assert eb.status == "fail" and eb.partial  # v3, v4 accepted bob: aborted below
    drive(b, vs, 2)
    assert one(b, vs, Acquire("r", "bob", 1000), 3).status == "fail"  # alice holds


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=5))))
@settings(max_examples=200)
def test_garbage_never_crashes_either_side(msg: list[object]) -> None:
    v, p = Voter("v0"), Proposer(["v0"])
    for m in (msg, ["prep", *msg], ["acc", 1, "r", *msg], ["rel", 1, *msg]):
        with contextlib.suppress(DecodeError):
            v.receive(m, 0)
        with contextlib.suppress(DecodeError):
            p.receive("v0", m, 0)


def test_proposer_applies_backpressure() -> None:
    p = Proposer(VOTERS, max_pending=2)
    p.start(Show("a"), 0)
    p.start(Show("b"), 0)
    with pytest.raises(BackendUnavailable):
        p.start(Show("c"), 0)
    assert p.counters["overloaded"] == 1
    p.handle_timer(10_000)  # both time out: room again
    assert [e.status for e in p.events()] == ["unknown", "unknown"]
    p.start(Show("c"), 10_000)


def test_cancel_stops_an_operation_and_aborts_a_half_done_acquire() -> None:
    vs = {v: Voter(v) for v in VOTERS}
    p = Proposer(VOTERS)
    rid = p.start(Acquire("r", "alice", 1000), 0, timeout_ms=50)
    for v, m in p.outbox():
        p.receive(v, vs[v].receive(m, 0), 0)
    accepts = p.outbox()
    v0, m0 = accepts[0]
    vs[v0].receive(m0, 1)  # one voter accepted; its reply is lost
    p.cancel(rid, 2)
    assert p.events() == []
    aborts = p.outbox()
    assert {m[0] for _, m in aborts} == {"rel"}
    for v, m in aborts:
        p.receive(v, vs[v].receive(m, 3), 3)
    assert p.pending() == 0 and p.events() == []
    assert one(Proposer(VOTERS), vs, Show("r"), 4).holder == ""


def test_per_operation_deadline() -> None:
    p = Proposer(VOTERS, timeout_ms=10_000)
    p.start(Show("r"), 0, timeout_ms=30)
    assert p.next_deadline() == 30  # before the 50 ms retransmission
    p.outbox()
    p.handle_timer(30)
    assert [e.status for e in p.events()] == ["unknown"]


def test_proposer_rejects_bad_configuration() -> None:
    for bad in ([], ["a", "a"]):
        with pytest.raises(InvalidArgument):
            Proposer(bad)
    with pytest.raises(InvalidArgument):
        Proposer(["a"], timeout_ms=0)


# -- seeded campaigns on Peers (hivemesh.sim.leases) --------------------------------
#
# Each seed runs the daemon's Peer on every node (LEASE frames over the
# simulated links, the voter log on the simulated disk, SWIM finding crashes)
# with applications acquiring, renewing and releasing through the Peers'
# lease commands; the history is checked for exclusion, increasing fencing
# tokens and (without crashes) spurious failures; every seed ends with the
# split prepare of a killed holder. A seed costs about 0.15-0.3 s of CPU: the
# file runs about 220 seeds (about 1 min of CPU).


def _net(loss: float) -> NetworkOptions:
    """A lossy, duplicating network whose delays (1-15 ms) reorder frames."""
    return NetworkOptions(
        one_way_delay_mean_ms=1,
        one_way_delay_jitter_ms=14,
        packet_loss_probability=loss,
        packet_replay_probability=0.05,
    )


#: No partitions, crashes or forgeries from the cluster's own fault plan
#: (crashes come from ``crash_per_s``); clock offsets up to 2 s.
QUIET = FaultOptions(
    partition_probability=0.0, crash_probability=0.0, forgeries=0, clock_skew_max_ms=2_000
)
#: 10% loss, 5% duplicates, clock rates within +-0.4% (pairwise under
#: DRIFT_RATIO), the daemon's protocol variant (thrifty, fast acquire,
#: token reserve 1024).
BASE = LeaseWorkload(network=_net(0.1), faults=QUIET, max_rate_skew=0.004)
#: The bare protocol: every voter asked at once, prepare before every
#: accept, the exact token written before each reply.
PLAIN = replace(BASE, thrifty=False, fast_acquire=False, token_reserve=0)


def _run(seed: int, nodes: int, workload: LeaseWorkload) -> tuple[SimResult, LeaseCluster]:
    with verification_memo():
        c = LeaseCluster(str(seed), lease_options(nodes, str(seed)), workload=workload)
        return c.run(), c


def _campaign(seeds: range, nodes: int, workload: LeaseWorkload) -> Counter[str]:
    totals: Counter[str] = Counter()
    for seed in seeds:
        res, c = _run(seed, nodes, workload)
        assert res.violations == [], (
            f"seed {seed}: replay with LeaseCluster('{seed}', lease_options({nodes}, "
            f"'{seed}'), workload={workload}).run(): {res.violations[:3]}"
        )
        totals.update(f"{o.kind}:{o.outcome}" for o in c.ops if o.resource != "split")
        totals["effects"] += res.stats["lease_fenced_effects"]
        totals["crashes"] += res.stats.get("crashes", 0)  # of the random phase
        totals["split_prepares"] += res.stats["lease_split_prepares"]
    return totals


#: seeds per campaign (about 0.2 s of CPU each); raise it for a longer run
SEEDS = int(os.environ.get("HIVEMESH_SIM_SEEDS", "12"))


@pytest.mark.parametrize("variant", ["daemon", "plain"])
def test_simulated_lossy_reordering_network_has_no_violations(variant: str) -> None:
    t = _campaign(range(SEEDS), 5, BASE if variant == "daemon" else PLAIN)
    assert t["acquire:ok"] > 6 * SEEDS and t["renew:ok"] > 6 * SEEDS, t
    assert t["release:ok"] > 3 * SEEDS and t["effects"] > 12 * SEEDS, t
    assert t["acquire:unknown"] > 0 and t["acquire:fail"] > 0, t
    assert t["split_prepares"] == SEEDS, t


def test_simulated_voter_crashes_and_heavy_loss_have_no_violations() -> None:
    w = replace(BASE, network=_net(0.25), crash_per_s=2.0, clients=4)
    t = _campaign(range(SEEDS), 5, w)
    assert t["crashes"] > 8 * SEEDS and t["acquire:ok"] > 4 * SEEDS, t


def test_simulated_three_voters_many_clients_two_resources() -> None:
    # nodes 3 and 4 run applications without voting
    w = replace(BASE, voters=3, clients=5, resources=2, network=_net(0.2))
    t = _campaign(range(SEEDS), 5, w)
    assert t["acquire:ok"] > 8 * SEEDS, t


def test_simulated_thrifty_proposers_with_crashes_and_loss_have_no_violations() -> None:
    # each node asks its own voter and the live ones first: majorities overlap partially
    thrifty = replace(PLAIN, thrifty=True)
    w = replace(thrifty, crash_per_s=1.0, network=_net(0.15))
    t = _campaign(range(SEEDS), 5, w)
    assert t["acquire:ok"] > 4 * SEEDS and t["crashes"] > 4 * SEEDS, t
    t = _campaign(range(SEEDS), 5, thrifty)
    assert t["acquire:ok"] > 6 * SEEDS and t["release:ok"] > 3 * SEEDS, t


def test_simulated_fast_acquire_with_crashes_and_loss_has_no_violations() -> None:
    fast = replace(PLAIN, fast_acquire=True)
    t = _campaign(range(SEEDS), 5, replace(fast, crash_per_s=1.0, network=_net(0.15)))
    assert t["acquire:ok"] > 4 * SEEDS and t["crashes"] > 4 * SEEDS, t
    for thrifty in (False, True):
        t = _campaign(range(SEEDS), 5, replace(fast, thrifty=thrifty))
        assert t["acquire:ok"] > 6 * SEEDS and t["release:ok"] > 3 * SEEDS, t


#: 3 voters (every node), a crash every 200 ms restarting within 20 ms, TTLs
#: short enough that a restarted voter's quarantine ends between crashes: a
#: voter that forgets an acknowledged vote is caught here (see the mutation test)
HEAVY_CRASHES = replace(
    PLAIN,
    crash_per_s=5.0,
    restart_after_ms=(1, 20),
    ttls_ms=(60, 100, 200),
    timeout_ms=400,
)


def test_simulated_token_reserve_with_crashes_and_loss_has_no_violations() -> None:
    # a tiny reserve crosses its bound often; 1024 is the daemon's (rarely crossed)
    for reserve in (2, 1024):
        w = replace(
            PLAIN,
            token_reserve=reserve,
            fast_acquire=True,
            thrifty=reserve == 2,
            crash_per_s=2.0,
            network=_net(0.15),
        )
        t = _campaign(range(SEEDS), 5, w)
        assert t["acquire:ok"] > 4 * SEEDS and t["crashes"] > 8 * SEEDS, t
        w = replace(HEAVY_CRASHES, token_reserve=reserve, fast_acquire=True)
        t = _campaign(range(SEEDS), 3, w)
        assert t["acquire:ok"] > 6 * SEEDS and t["crashes"] > 10 * SEEDS, t


def test_fast_acquire_skips_prepare_when_known_and_falls_back_when_refused() -> None:
    vs = {v: Voter(v) for v in VOTERS}
    p = Proposer(VOTERS, fast_acquire=True)

    def settle() -> list[Outcome]:
        while out := p.outbox():
            for v, msg in out:
                p.receive(v, vs[v].receive(msg, 0), 0)
        return p.events()

    rid = p.start(Acquire("r", "a", 1000), 0)
    (ev,) = settle()
    assert (ev.rid, ev.status, ev.token) == (rid, "ok", 1)
    p.start(Release("r", "a", 1), 0)
    settle()
    rid = p.start(Acquire("r", "a", 1000), 0)
    assert {m[0] for _, m in p.outbox()} == {"acc"}  # straight to accept with token 2
    p.cancel(rid, 0)
    settle()
    # another proposer moved the resource on: the fast attempt is refused, falls back
    other = Proposer(VOTERS)
    other.start(Acquire("r", "b", 1000), 0)
    while out := other.outbox():
        for v, msg in out:
            other.receive(v, vs[v].receive(msg, 0), 0)
    (won,) = other.events()
    other.start(Release("r", "b", won.token or 0), 0)
    while out := other.outbox():
        for v, msg in out:
            other.receive(v, vs[v].receive(msg, 0), 0)
    rid = p.start(Acquire("r", "a", 1000), 0)
    (ev,) = settle()
    assert (ev.rid, ev.status) == (rid, "ok") and ev.token is not None
    assert ev.token > (won.token or 0) and p.counters["fast_fallback"] == 1


def test_thrifty_proposer_asks_a_majority_then_the_rest_on_retransmit() -> None:
    p = Proposer(VOTERS, fanout=3, retransmit_ms=10)
    p.prefer(["v4", "v2", "nobody"])
    p.start(Show("r"), 0)
    assert sorted(v for v, _ in p.outbox()) == ["v0", "v2", "v4"]
    p.handle_timer(10)
    assert sorted(v for v, _ in p.outbox()) == list(VOTERS)


def test_simulation_replays_exactly_from_its_seed() -> None:
    w = replace(BASE, crash_per_s=2.0)
    (a, ca), (b, cb) = _run(7, 5, w), _run(7, 5, w)
    assert (a.trace_digest, a.stats, ca.ops) == (b.trace_digest, b.stats, cb.ops)
    other, co = _run(8, 5, w)
    assert other.trace_digest != a.trace_digest and co.ops != ca.ops


def _broken_rules(seeds: range, nodes: int, workload: LeaseWorkload) -> Counter[str]:
    rules: Counter[str] = Counter()
    for seed in seeds:
        for v in _run(seed, nodes, workload)[0].violations:
            rules[v.split(":")[0]] += 1
    return rules


@pytest.mark.parametrize("mutant", ["ignore_live_leases", "minority_quorum", "ack_before_disk"])
def test_campaign_catches_a_broken_protocol(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation + checker must be able to fail: break the protocol, see
    it caught, and the same seeds clean without the break."""
    seeds, nodes, w = range(4), 5, BASE
    if mutant == "ack_before_disk":
        # The driver reports the voter log synced at once and syncs it 300 ms
        # later: a crash loses votes that were already acknowledged.
        seeds, nodes, w = range(10), 3, replace(HEAVY_CRASHES, fsync_ms=300)
    assert _broken_rules(seeds, nodes, w) == Counter()
    if mutant == "ack_before_disk":
        w = replace(w, ack_before_sync=True)
    elif mutant == "ignore_live_leases":
        original = lease_voter._Slot.live
        monkeypatch.setattr(
            lease_voter._Slot, "live", lambda self, now: original(self, now) and now % 2 == 0
        )
    else:
        init = Proposer.__init__

        def weak(self: Proposer, *a: object, **kw: object) -> None:
            init(self, *a, **kw)  # type: ignore[arg-type]
            self.majority = 2

        monkeypatch.setattr(Proposer, "__init__", weak)
    rules = _broken_rules(seeds, nodes, w)
    assert rules["overlap"] > 0 or rules["token_reused"] > 0, rules


def test_show_is_a_majority_read(cluster: tuple[dict[str, Voter], Proposer, Proposer]) -> None:
    vs, a, b = cluster
    free = one(b, vs, Show("r"), 0)
    assert (free.status, free.holder, free.token) == ("ok", "", None)
    g = one(a, vs, Acquire("r", "alice", 1000), 0)
    seen = one(b, vs, Show("r"), 100, down=frozenset({"v0", "v1"}))
    assert (seen.holder, seen.token, seen.remaining_ms) == ("alice", g.token, 900)
    one(a, vs, Release("r", "alice", 1), 200)
    assert one(b, vs, Show("r"), 300).holder == ""


def test_clock_rates_beyond_the_drift_bound_are_flagged() -> None:
    """The drift assumption is visible: a holder clock 10 % slow over-believes its lease."""
    rules = _broken_rules(range(5), 5, replace(BASE, max_rate_skew=0.1))
    assert rules["belief_too_long"] > 0, rules
    assert _broken_rules(range(5), 5, BASE)["belief_too_long"] == 0


def test_abort_of_one_attempt_never_releases_another_attempt_with_the_same_token() -> None:
    """Regression (found by a 1000-seed campaign): a failed attempt and a later
    successful one by the same holder can carry the same token."""
    w = Voter("w")
    assert w.receive(["acc", 2, "r", 8, "c3", 1000, "p/2"], 0) == ["acc_r", 2, True]
    assert w.receive(["rel", 3, "r", 8, "c3", "p/3", "p/1"], 1) == ["rel_r", 3, False]
    assert w.receive(["prep", 4, "r"], 2)[3] == "c3"  # still held
    # a late duplicate accept of the failed attempt is not mistaken for the live one
    assert w.receive(["acc", 1, "r", 8, "c3", 1000, "p/1"], 3) == ["acc_r", 1, False]
    # the holder's own release (no attempt) works, and its retransmission keeps its yes
    assert w.receive(["rel", 5, "r", 8, "c3", "p/5", ""], 4) == ["rel_r", 5, True]
    assert w.receive(["acc", 6, "r", 9, "c1", 1000, "q/6"], 5) == ["acc_r", 6, True]
    assert w.receive(["rel", 5, "r", 8, "c3", "p/5", ""], 6) == ["rel_r", 5, True]
    assert w.receive(["prep", 7, "r"], 7)[3] == "c1"  # and did not touch the new grant


def test_a_lease_split_by_its_holders_dead_voter_is_held_not_unavailable() -> None:
    """The e2e ``kill -9`` of a holder: its grant reached a bare majority, the
    holder's own voter among them; that voter dies. The live voters answer
    2 "held" / 2 "free": neither "M free" nor "more than N - M held" can be
    reached without the dead voter. The prepare used to wait for it until the
    deadline (``unknown`` -> BackendUnavailable, for the whole TTL); it now
    fails (busy) one retransmission after every voter was asked."""
    vs = {v: Voter(v) for v in VOTERS}
    holder = Proposer(VOTERS, fanout=3)
    holder.prefer(["v1", "v0", "v4"])  # v1 is the holder's own node
    got = one(holder, vs, Acquire("r", "v1-app", 3000), 0)
    assert got.status == "ok"  # granted by v1, v0, v4 only (thrifty, perfect link)
    other = Proposer(VOTERS, fanout=3, timeout_ms=2000)
    other.prefer(["v2", "v0", "v3"])
    other.start(Acquire("r", "v2-app", 3000), 10)
    down = frozenset({"v1"})
    assert drive(other, vs, 10, down) == []  # v2, v3 free; v0 held: undecided
    other.handle_timer(60)  # retransmit: now v1 and v4 are asked too
    assert drive(other, vs, 60, down) == []  # v4 held; v1 silent: still undecided
    other.handle_timer(110)
    (ev,) = other.events()
    assert (ev.status, ev.token, ev.finished_ms) == ("fail", None, 110)
    assert other.counters["prepare_held_early"] == 1
    # a free majority is never cut short: with v1 answering, the same split
    # resolves as before (held > N - M), and once the TTL ran out it is granted
    assert one(other, vs, Acquire("r", "v2-app", 3000), 3100, down=down).status == "ok"
