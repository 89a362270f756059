"""SWIM membership over the simulator's seeded network with loss and delay
(:class:`hivemesh.sim.swim.SwimNet`)."""

from __future__ import annotations

import random
import statistics

import pytest

from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.membership import MemberChange, Membership, MembershipConfig, MemberState
from hivemesh.errors import InvalidArgument
from hivemesh.sim.swim import SwimNet, swim_address

CFG = MembershipConfig.fast(100)


addr = swim_address


def cluster(
    seed: int, n: int, *, loss: float = 0.0, dup: float = 0.0, delay_ms: int = 10
) -> SwimNet:
    net = SwimNet(seed, loss=loss, dup=dup, delay_ms=delay_ms, cfg=CFG)
    first = net.add(1)
    for i in range(2, n + 1):
        net.add(i).join(first.address, first.endpoints, net.now)
    everyone_up = lambda: all(  # noqa: E731
        len(m.members()) == n - 1 and all(x.state is MemberState.UP for x in m.members())
        for m in net.nodes.values()
    )
    assert net.run(200 * CFG.probe_interval_ms, everyone_up), f"seed {seed}: no convergence"
    return net


def test_cluster_converges_with_endpoints() -> None:
    net = cluster(1, 6)
    m = net.nodes[addr(3)]
    assert [x.endpoints for x in m.members() if x.address == addr(5)] == [("10.0.0.5:7000",)]
    ups = [ch for _, ch in net.log if ch.state is MemberState.UP]
    assert len(ups) == 6 * 5


@pytest.mark.parametrize("seed", range(40))
def test_crash_detected_within_bound_under_loss(seed: int) -> None:
    n = 8
    net = cluster(seed, n, loss=0.10)
    victim = net.nodes[addr(1 + seed % n)]
    net.crash(victim)
    t0 = net.now
    bound = CFG.detection_bound_ms(n)
    ok = net.run(bound, net.all_see(victim.address, MemberState.DOWN))
    assert ok, f"seed {seed}: not all down after {bound} ms (replay: pytest -k 'bound and {seed}')"
    # Failure was never reported for live members.
    assert not [
        c for _, c in net.log if c.state is MemberState.DOWN and c.address != victim.address
    ]
    assert net.now - t0 <= bound


def test_typical_detection_is_well_under_the_bound() -> None:
    n, times = 8, []
    for seed in range(20):
        net = cluster(100 + seed, n, loss=0.10)
        victim = net.nodes[addr(2)]
        net.crash(victim)
        t0 = net.now
        assert net.run(CFG.detection_bound_ms(n), net.all_see(victim.address, MemberState.DOWN))
        times.append(net.now - t0)
    # Lifeguard confirmations shorten suspicion when many members see the crash.
    assert statistics.median(times) < CFG.suspicion_timeout_ms(n, 0)


@pytest.mark.parametrize("seed", range(12))
def test_no_false_down_under_loss(seed: int) -> None:
    net = cluster(1000 + seed, 8, loss=0.10)
    net.run(300 * CFG.probe_interval_ms)
    downs = [c for _, c in net.log if c.state is MemberState.DOWN]
    assert downs == [], f"seed {seed}: false DOWN {downs[:3]}"
    for m in net.nodes.values():
        assert all(x.state is not MemberState.DOWN for x in m.members())


def test_refutation_happens_under_loss() -> None:
    refuted = 0
    for seed in range(3):
        net = cluster(2000 + seed, 8, loss=0.10)
        net.run(150 * CFG.probe_interval_ms)
        refuted += sum(m.counters["refuted"] for m in net.nodes.values())
    # The loss rate makes some probes fail; suspected nodes must have refuted.
    assert refuted > 0


def test_indirect_probe_bridges_a_broken_link() -> None:
    net = cluster(7, 5)
    a, b = addr(1), addr(2)
    net.cut |= {(a, b), (b, a)}
    net.run(200 * CFG.probe_interval_ms)
    assert not [c for _, c in net.log if c.state in (MemberState.SUSPECT, MemberState.DOWN)]
    assert net.nodes[a].counters["indirect_probes"] > 0


def test_restarted_node_comes_back_up_with_higher_incarnation() -> None:
    n = 5
    net = cluster(3, n)
    victim = net.nodes[addr(4)]
    net.crash(victim)
    assert net.run(CFG.detection_bound_ms(n), net.all_see(victim.address, MemberState.DOWN))
    down_inc = net.nodes[addr(1)].member(victim.address).incarnation  # type: ignore[union-attr]
    reborn = net.add(4)  # fresh process, incarnation 0
    seed_node = net.nodes[addr(2)]
    reborn.join(seed_node.address, seed_node.endpoints, net.now)
    assert net.run(50 * CFG.probe_interval_ms, net.all_see(victim.address, MemberState.UP))
    assert reborn.incarnation > down_inc
    assert len(reborn.members()) == n - 1


def test_graceful_leave_is_left_not_down() -> None:
    net = cluster(4, 5)
    leaver = net.nodes[addr(5)]
    leaver.leave(net.now)
    assert net.run(20 * CFG.probe_interval_ms, net.all_see(leaver.address, MemberState.LEFT))
    net.crash(leaver)
    net.run(CFG.detection_bound_ms(5))
    assert not [c for _, c in net.log if c.state is MemberState.DOWN]


def test_partition_heals_by_refutation() -> None:
    n = 6
    net = cluster(5, n)
    left = [addr(i) for i in (1, 2, 3)]
    right = [addr(i) for i in (4, 5, 6)]
    net.cut |= {(x, y) for x in left for y in right} | {(y, x) for x in left for y in right}
    both_down = lambda: all(  # noqa: E731
        net.view(net.nodes[x], y) is MemberState.DOWN for x in left for y in right
    )
    assert net.run(CFG.detection_bound_ms(n) * 2, both_down)
    net.cut.clear()
    # Dead members are not probed: the push-pull reconnect attempts heal it.
    all_up = lambda: all(  # noqa: E731
        all(m.state is MemberState.UP for m in node.members()) for node in net.nodes.values()
    )
    assert net.run(3 * CFG.push_pull_interval_ms, all_up)


def test_same_seed_same_history() -> None:
    def history(seed: int) -> list[tuple[str, MemberChange]]:
        net = cluster(seed, 6, loss=0.1)
        net.crash(net.nodes[addr(3)])
        net.run(CFG.detection_bound_ms(6))
        return net.log

    assert history(9) == history(9)


def test_suspicion_timeout_shrinks_with_confirmations() -> None:
    cfg = MembershipConfig()
    assert cfg.suspicion_timeout_ms(3, 0) == 4000  # k = 0 for tiny clusters: min
    assert cfg.suspicion_timeout_ms(10, 0) == 24_000
    assert cfg.suspicion_timeout_ms(10, 2) == 4000
    assert 4000 < cfg.suspicion_timeout_ms(10, 1) < 24_000
    assert cfg.suspicion_timeout_ms(100, 0) == 48_000  # log10(100) = 2
    with pytest.raises(InvalidArgument):
        MembershipConfig(probe_timeout_ms=1000)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00",
        encode_frame(FrameType.PING, 1, "nope", []),
        encode_frame(FrameType.PING, 1, addr(1), [[9, addr(2), 0, [], addr(2)]]),
        encode_frame(FrameType.PING, 1, addr(1), [[0, addr(2), -1, [], addr(2)]]),
        encode_frame(FrameType.ACK, "x", []),
        encode_frame(FrameType.SYNC, [[0, addr(2), 0, ["no-port"], addr(2)]], True),
        encode_frame(FrameType.GOSSIP, [[0, addr(2), 0, ["h:1"] * 99, addr(2)]]),
        encode_frame(FrameType.EVENTS),
    ],
)
def test_garbage_is_counted_not_raised(frame: bytes) -> None:
    net = SwimNet(0, cfg=CFG)
    m = net.add(1)
    m.receive(addr(2), frame, 0)
    assert sum(m.counters.values()) == 1
    assert m.members() == []


def test_unadmitted_members_are_ignored() -> None:
    sent: list[tuple[str, bytes]] = []
    m = Membership(
        addr(1),
        [],
        random.Random(1),
        CFG,
        0,
        lambda d, f: sent.append((d, f)),
        admit=lambda a: a != addr(3),
    )
    gossip = [[0, addr(2), 0, ["h:1"], addr(2)], [0, addr(3), 0, ["h:2"], addr(3)]]
    m.receive(addr(2), encode_frame(FrameType.GOSSIP, gossip), 0)
    assert [x.address for x in m.members()] == [addr(2)]
    m.receive(addr(3), encode_frame(FrameType.GOSSIP, gossip), 0)
    assert m.counters["untrusted_author"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_duplication_and_reordering(seed: int) -> None:
    # Delays of 1-15 ms reorder freely; 10% of frames are duplicated. (With a
    # round trip near probe_timeout_ms, indirect probes cannot finish inside
    # the interval and false suspicions become common: size timeouts to RTT.)
    n = 6
    net = cluster(3000 + seed, n, loss=0.10, dup=0.10, delay_ms=15)
    net.run(100 * CFG.probe_interval_ms)
    assert not [c for _, c in net.log if c.state is MemberState.DOWN]
    victim = net.nodes[addr(2)]
    net.crash(victim)
    assert net.run(CFG.detection_bound_ms(n), net.all_see(victim.address, MemberState.DOWN))


def test_larger_cluster_scales() -> None:
    n = 32
    net = cluster(77, n, loss=0.05)
    net.run(50 * CFG.probe_interval_ms)
    victim = net.nodes[addr(9)]
    net.crash(victim)
    t0 = net.now
    assert net.run(CFG.detection_bound_ms(n), net.all_see(victim.address, MemberState.DOWN))
    assert net.now - t0 < CFG.detection_bound_ms(n) / 3
    assert not [
        c for _, c in net.log if c.state is MemberState.DOWN and c.address != victim.address
    ]


def test_a_stalled_loop_accuses_nobody() -> None:
    net = cluster(11, 5)
    slow = net.nodes[addr(3)]
    net.run(5 * CFG.probe_interval_ms)
    # Worst moment: a PING just went out and its ACK is not processed yet.
    in_flight = lambda: slow._probe is not None and not slow._probe.acked  # noqa: E731
    assert net.run(5 * CFG.probe_interval_ms, in_flight)
    net.stalled[slow.address] = []  # its event loop blocks for 20 intervals
    net.run(20 * CFG.probe_interval_ms)
    net.resume(slow)
    net.run(30 * CFG.probe_interval_ms)
    assert slow.counters["timer_stall"] == 1
    accusations = [c for a, c in net.log if c.state is not MemberState.UP and a == slow.address]
    assert accusations == []
