"""The simulator driving the daemon's sans-IO Peer: the journal and claims
workloads converge with the Peer's own SWIM, trust and new-life rules."""

from __future__ import annotations

from dataclasses import replace

from hivemesh.core.event import decode_event
from hivemesh.sim.campaign import ci_scenario, default_options, run_seed
from hivemesh.sim.options import FaultOptions, SimOptions
from hivemesh.sim.peer_adapter import PeerAdapter, PeerCluster


def test_journal_and_claims_on_peers_have_no_violations() -> None:
    for workload in ("journal", "claims"):
        for seed in range(1, 5):
            res = run_seed(seed, default_options(5, workload), PeerCluster)
            assert res.violations == [], (workload, seed, res.violations)


def test_every_node_is_a_peer_in_one_swarm() -> None:
    c = PeerCluster("2", default_options(5))
    c.run_until(5_000)
    for sn in c.nodes:
        assert isinstance(sn.adapter, PeerAdapter)
        web = sn.adapter.peer.web()
        others = {n.identity.address for n in c.nodes} - {sn.identity.address}
        assert others <= web.admitted
        assert all(web.shares(a, b) for a in others for b in others)


def test_the_peers_swim_releases_a_crashed_holders_claim() -> None:
    quiet = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)
    c = PeerCluster("1", SimOptions(nodes=5, appends=0, faults=quiet, active_ms=60_000))
    c.run_until(2_000)
    c.append(1, [("claim.intent", {"r": "job"})])
    c.run_until(4_000)
    assert all(sn.claims.is_claimed("job") for sn in c.nodes)
    c._crash(c.nodes[1])
    c.run_until(c.now + 40_000)
    for sn in c.nodes:
        if sn.index != 1:
            assert not sn.claims.is_claimed("job"), sn.index
    kinds = [decode_event(r).kind for _, raws, _ in c.nodes[0].store.scan() for r in raws]
    assert "member.down" in kinds


def test_the_peer_workload_is_in_the_ci_mix() -> None:
    assert any(ci_scenario(s).workload == "peer" for s in range(1, 300))
    assert replace(default_options(5, "peer")).swim is None  # PeerCluster brings its own
