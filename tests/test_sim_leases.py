"""The leases workload of the simulator: the Peers vote their own leases
(their lease commands, LEASE frames over the simulated links, the voter log
on the simulated disk), the history is checked for linearizability and
fencing, and the split prepare first seen on real processes (a holder's node
killed) is a scenario that fails when its fix is taken out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from hivemesh.core.effects import Effect, LeaseSync
from hivemesh.core.lease_quorum import Acquire, Proposer
from hivemesh.core.lease_voter import PREPARE, Voter
from hivemesh.sim.campaign import ci_scenario, default_options, run_campaign, run_seed
from hivemesh.sim.cluster import SimNode
from hivemesh.sim.leases import LeaseCluster, LeaseWorkload, lease_options
from hivemesh.sim.options import SimOptions
from hivemesh.sim.peer_adapter import PeerAdapter


@pytest.mark.parametrize("nodes", [3, 5, 6, 9])
def test_leases_workload_has_no_violations(nodes: int) -> None:
    for seed in range(1, 7):
        res = run_seed(seed, default_options(nodes), LeaseCluster)
        assert res.violations == [], (seed, res.violations)
        assert res.stats["lease_split_prepares"] == 1 and res.stats["lease_ok"] > 5
        assert res.stats["lease_fenced_effects"] > 0


def test_the_leases_are_voted_by_peers() -> None:
    c = LeaseCluster("3", default_options(5))
    c.run()
    assert all(isinstance(sn.adapter, PeerAdapter) for sn in c.nodes if sn.adapter is not None)
    voted = sum(
        sn.adapter.peer.leases.statistics()["mesh"].get("voted", 0)
        for sn in c.nodes
        if sn.adapter is not None
    )
    assert voted > 20
    assert any(log.synced for log in c._logs.values())  # the voter log reached the disk


def test_the_workload_sets_the_peers_voter_set_and_protocol_variant() -> None:
    """The knobs reach the Peers' own lease parts: else the protocol's
    campaigns (tests/test_lease_quorum.py) would run the daemon's variant
    under other names."""
    plain = LeaseWorkload(voters=3, thrifty=False, fast_acquire=False, token_reserve=0)
    for w in (LeaseWorkload(), plain):
        c = LeaseCluster("3", default_options(5), workload=w)
        c.run()
        voters = {c.nodes[i].identity.address for i in range(w.voters or 5)}
        fast = voted = 0
        for sn in c.nodes:
            if sn.adapter is None:  # the split prepare's holder, killed
                continue
            leases = sn.adapter.peer.leases
            assert leases.voter.token_reserve == w.token_reserve
            stats = leases.statistics()
            if leases.proposer is not None:
                assert set(leases.proposer.voters) == voters
                assert leases.proposer.fanout == (3 if w.thrifty else 0)
                fast += stats["proposer"].get("fast_acquire", 0)
            voted += sum(stats["voter"].values())
            if sn.identity.address not in voters:
                assert stats["voter"] == {}  # asked nothing
        assert voted > 20 and (fast > 0) == w.fast_acquire


def test_clock_rates_drift_each_node_clock() -> None:
    c = LeaseCluster("5", default_options(5), workload=LeaseWorkload(max_rate_skew=0.05))
    start = [sn.skew_ms for sn in c.nodes]
    c.run()
    for sn, rate, skew in zip(c.nodes, c._rates, start, strict=True):
        assert abs(sn.skew_ms - skew - rate * c.now) <= 1, (rate, skew, sn.skew_ms)
    assert max(abs(r) for r in c._rates) > 0.01


def test_leases_seed_replays_exactly() -> None:
    a = LeaseCluster("11", default_options(5)).run()
    b = LeaseCluster("11", default_options(5)).run()
    assert (a.trace_digest, a.stats) == (b.trace_digest, b.stats)
    assert LeaseCluster("12", default_options(5)).run().trace_digest != a.trace_digest


def test_split_prepare_fails_with_its_bug_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the early "held" answer (wave 1's fix), the competing acquire
    waits for the dead voter until its deadline and ends unknown."""
    monkeypatch.setattr(Proposer, "_held_at_a_majority", lambda self, p, now_ms: False)
    for nodes in (3, 5, 7):
        res = run_seed(1, default_options(nodes), LeaseCluster)
        assert any("split prepare" in v and "ended unknown" in v for v in res.violations), res


class CrashyCluster(LeaseCluster):
    """A crash at every fault event, no partitions."""

    @staticmethod
    def options(nodes: int, seed: str) -> SimOptions:
        opts = lease_options(nodes, seed)
        faults = replace(opts.faults, crash_probability=1.0, partition_probability=0.0)
        return replace(opts, faults=faults)


class AckBeforeSyncCluster(CrashyCluster):
    """A broken driver: it reports the voter log synced at once, and the
    writes stay in the cache (a crash loses them) -- replies leave before
    their votes are on disk."""

    def _effect(self, sn: SimNode, e: Effect) -> None:
        if type(e) is LeaseSync:
            assert sn.adapter is not None
            sn.adapter.lease_synced(e.upto, None, self.now + sn.skew_ms)
            return
        super()._effect(sn, e)


def test_acknowledging_votes_before_the_sync_is_caught() -> None:
    bad = run_campaign(range(1, 41), default_options(3), factory=AckBeforeSyncCluster, jobs=2)
    assert bad["violations"] > 0, bad
    good = run_campaign(range(1, 41), default_options(3), factory=CrashyCluster, jobs=2)
    assert good["violations"] == 0, good["examples"]


def test_leases_are_in_the_ci_mix_at_odd_and_even_sizes() -> None:
    sizes = {sc.nodes for s in range(1, 2_000) if (sc := ci_scenario(s)).workload == "leases"}
    assert {5, 6, 7} <= sizes and max(sizes) >= 25


def _acquire_with(
    voters: dict[str, Voter], p: Proposer, reach: Callable[[str, list[object]], bool], now: int
) -> list[object]:
    """Run ``p``'s acquire of ``r`` (2 s deadline) in 10 ms steps, delivering only
    what ``reach(voter, msg)`` lets through; its outcomes."""
    rid = p.start(Acquire("r", p.proposer_id, 1_000), now, timeout_ms=2_000)
    assert rid
    got: list[object] = []
    for t in range(now, now + 2_200, 10):
        p.handle_timer(t)
        for vid, msg in p.outbox():
            if reach(vid, msg):
                reply = voters[vid].receive(msg, t)
                if reply is not None:
                    p.receive(vid, reply, t)
        got += p.events()
        if got:
            break
    return got


def test_a_stale_grant_at_a_minority_does_not_fail_an_acquire_early() -> None:
    """Seed 1410 of the CI campaign (9 voters, 20% loss): an aborted acquire
    left its grant at 2 voters (its release was lost); a new acquire heard 2
    "held" and 3 free while 4 voters were silent, and the early "held" answer
    (meant for a dead voter splitting the prepare) failed it although a free
    majority was within reach: a spurious failure. It must keep asking."""
    ids = [f"v{i}" for i in range(9)]
    voters = {v: Voter(v) for v in ids}
    old = Proposer(ids, timeout_ms=2_000, retransmit_ms=50, proposer_id="old")
    # the old holder's accepts reach v1 and v3 only (its abort is lost too)
    got = _acquire_with(voters, old, lambda v, m: m[0] == PREPARE or v in ("v1", "v3"), 0)
    assert got and got[0].status != "ok"  # type: ignore[attr-defined]
    assert voters["v1"].durable("r")[0] >= 1
    new = Proposer(ids, timeout_ms=2_000, retransmit_ms=50, proposer_id="new")
    silent = {"v5", "v6", "v7", "v8"}
    late = {"n": 0}

    def reach(v: str, m: list[object]) -> bool:  # v5..v8 answer from the 4th round on
        late["n"] += v == "v5"
        return v not in silent or late["n"] > 3

    got = _acquire_with(voters, new, reach, 100)
    assert got and got[0].status == "ok", got  # type: ignore[attr-defined]


def test_an_abort_overtaken_by_its_accept_leaves_no_stale_grant() -> None:
    """Seed 589 (5 voters, 20% loss, links reorder): a fast acquire fell back
    and aborted its attempt, the abort reached two voters before the accept,
    which then held them for 1.2 s; every acquire failed spuriously meanwhile
    (the voter now refuses an accept whose abort came first)."""
    res = LeaseCluster("589", lease_options(5, "589")).run()
    assert res.violations == []


def test_a_release_cut_short_by_its_node_crash_still_ends_the_belief() -> None:
    """CI seed 8283: c1 releases token 3 (every voter holding it applies the
    release) and its node crashes before the reply; c0 then acquires token 4.
    The release is recorded unknown *with the token it presented*, so the
    checker cuts c1's belief at the release (it recorded no token before,
    and reported c1's released lease as overlapping c0's)."""
    res = run_seed(8283, default_options(5), LeaseCluster)
    assert res.violations == [], res.violations
    c = LeaseCluster("8283", default_options(5))
    c.run()
    cut = [o for o in c.ops if o.kind == "release" and o.outcome == "unknown"]
    assert [(o.client, o.token) for o in cut] == [("c1", 3)], cut
