"""The simulator's node adapter: with real SWIM a crashed claim holder is
found by the other nodes' failure detection, which releases its claim."""

from __future__ import annotations

from hivemesh.core.event import decode_event
from hivemesh.core.membership import MembershipConfig
from hivemesh.sim.cluster import Cluster
from hivemesh.sim.options import FaultOptions, SimOptions

QUIET = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)


def _cluster(swim: MembershipConfig | None) -> Cluster:
    opts = SimOptions(nodes=5, appends=0, faults=QUIET, swim=swim, active_ms=40_000)
    c = Cluster("1", opts)
    c.append(1, [("claim.intent", {"r": "job"})])
    c.run_until(3_000)
    return c


def _kinds(c: Cluster, index: int) -> list[str]:
    return [decode_event(raw).kind for _, raws, _ in c.nodes[index].store.scan() for raw in raws]


def test_swim_finds_a_crashed_holder_and_its_claim_is_released() -> None:
    c = _cluster(MembershipConfig.lan())
    assert all(sn.claims.is_claimed("job") for sn in c.nodes)
    c._crash(c.nodes[1])
    bound = MembershipConfig.lan().detection_bound_ms(5)
    c.run_until(c.now + bound + 2_000)
    for sn in c.nodes:
        if sn.index != 1:
            assert not sn.claims.is_claimed("job"), sn.index
            assert "member.down" in _kinds(c, sn.index)
    assert c.nodes[1].node is None  # still down: the release came from SWIM, not a restart


def test_without_a_failure_detector_the_claim_stays_held() -> None:
    """The adapter's SWIM is what releases it: with neither SWIM nor the
    fixed-delay observer (failure_detect_ms beyond the run), it stays held."""
    opts = SimOptions(nodes=5, appends=0, faults=QUIET, active_ms=40_000, failure_detect_ms=10**9)
    c = Cluster("1", opts)
    c.append(1, [("claim.intent", {"r": "job"})])
    c.run_until(3_000)
    c._crash(c.nodes[1])
    c.run_until(c.now + 30_000)
    assert all(sn.claims.is_claimed("job") for sn in c.nodes if sn.node is not None)
    assert "member.down" not in _kinds(c, 0)
