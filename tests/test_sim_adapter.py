"""The simulator's core-node adapter: without a Peer's SWIM, a live node
reports a crash as member.down a fixed delay after it, which releases the
crashed holder's claim; with no report, the claim stays held."""

from __future__ import annotations

from hivemesh.core.event import decode_event
from hivemesh.sim.cluster import Cluster
from hivemesh.sim.options import FaultOptions, SimOptions

QUIET = FaultOptions(partition_probability=0, crash_probability=0, forgeries=0)


def _kinds(c: Cluster, index: int) -> list[str]:
    return [decode_event(raw).kind for _, raws, _ in c.nodes[index].store.scan() for raw in raws]


def _held_then_crash(detect_ms: int) -> Cluster:
    opts = SimOptions(
        nodes=5, appends=0, faults=QUIET, active_ms=40_000, failure_detect_ms=detect_ms
    )
    c = Cluster("1", opts)
    c.append(1, [("claim.intent", {"r": "job"})])
    c.run_until(3_000)
    assert all(sn.claims.is_claimed("job") for sn in c.nodes)
    c._crash(c.nodes[1])
    c.run_until(c.now + 10_000)
    return c


def test_a_reported_crash_releases_the_holders_claim() -> None:
    c = _held_then_crash(1_500)
    assert c.nodes[1].node is None  # still down: the release came from the report
    assert all(not sn.claims.is_claimed("job") for sn in c.nodes if sn.node is not None)
    assert any("member.down" in _kinds(c, i) for i in (0, 2, 3, 4))


def test_without_a_report_the_claim_stays_held() -> None:
    c = _held_then_crash(10**9)
    assert all(sn.claims.is_claimed("job") for sn in c.nodes if sn.node is not None)
    assert "member.down" not in _kinds(c, 0)
