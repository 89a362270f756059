"""The simulator driving the daemon's sans-IO Peer: the journal and claims
workloads converge with the Peer's own SWIM, trust and new-life rules, and
the simulated network carries out the Peer's Dial and Close effects."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hivemesh.core.event import decode_event
from hivemesh.sim.campaign import WORKLOADS, ci_scenario, default_options, run_seed
from hivemesh.sim.cluster import Cluster
from hivemesh.sim.options import FaultOptions, SimOptions
from hivemesh.sim.peer_adapter import PeerAdapter


def test_journal_and_claims_on_peers_have_no_violations() -> None:
    for workload in ("journal", "claims"):
        for seed in range(1, 5):
            res = run_seed(seed, default_options(5, workload), Cluster)
            assert res.violations == [], (workload, seed, res.violations)


def test_every_node_is_a_peer_in_one_swarm() -> None:
    c = Cluster("2", default_options(5))
    c.run_until(5_000)
    for sn in c.nodes:
        assert isinstance(sn.adapter, PeerAdapter)
        web = sn.adapter.peer.web()
        others = {n.identity.address for n in c.nodes} - {sn.identity.address}
        assert others <= web.admitted
        assert all(web.shares(a, b) for a in others for b in others)


def test_the_peers_swim_releases_a_crashed_holders_claim() -> None:
    quiet = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)
    c = Cluster("1", SimOptions(nodes=5, appends=0, faults=quiet, active_ms=60_000))
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


def test_every_workload_of_the_ci_mix_runs_peers() -> None:
    """No workload drives a node otherwise than through a PeerAdapter (the
    journal's old ``peer`` name stays for replay commands)."""
    seen = {ci_scenario(s).workload for s in range(1, 400)}
    assert {"journal", "claims", "clock", "leases", "plan", "membership"} <= seen
    assert "peer" not in seen and WORKLOADS["peer"] == WORKLOADS["journal"]
    assert replace(default_options(5)).swim is None  # the cluster brings the LAN timing


def test_a_partition_closes_half_open_links_and_they_come_back() -> None:
    """SWIM declares a cut-off node down; its peers' Close(if silent) drops
    their links (link_down on both sides as far as the notice gets); the
    dialler redials, and after the heal every link is up again."""
    quiet = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)
    c = Cluster("5", SimOptions(nodes=5, appends=0, faults=quiet, active_ms=60_000))
    c.run_until(3_000)
    addrs = {sn.identity.address for sn in c.nodes}
    for sn in c.nodes:
        assert set(sn.links) == addrs - {sn.identity.address}, sn.index
    victim = c.nodes[2].identity.address
    c.set_partition({a: int(a == victim) for a in addrs})
    c.run_until(c.now + 20_000)
    assert c.stats["links_closed"] > 0
    for sn in c.nodes:
        if sn.index != 2:
            assert victim not in sn.links, sn.index
            assert victim in sn.dialling  # still dialled: it may come back
    assert c.stats["dials_failed"] > 0
    c.set_partition(None)
    c.run_until(c.now + 15_000)
    for sn in c.nodes:
        assert set(sn.links) == addrs - {sn.identity.address}, sn.index
    member_down = [
        decode_event(r).kind for _, raws, _ in c.nodes[0].store.scan() for r in raws
    ].count("member.down")
    assert member_down >= 1


def test_without_dials_a_restarted_node_stays_unlinked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The links come from the network's dialling: with dial attempts
    dropped, a restarted node gets no link and nothing replicates to it."""
    quiet = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)
    c = Cluster("6", SimOptions(nodes=3, appends=0, faults=quiet, active_ms=60_000))
    c.run_until(3_000)
    c._crash(c.nodes[1])
    monkeypatch.setattr(Cluster, "_dial", lambda self, index, inc, address: None)
    c._boot(c.nodes[1])
    c.append(0, [("app.note", {"after": 1})])
    c.run_until(c.now + 10_000)
    assert c.nodes[1].links == {}
    assert c.stats["frames_unlinked"] > 0
