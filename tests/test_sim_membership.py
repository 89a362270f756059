"""The membership workload: real SWIM under crashes, partitions and stalls,
with checks that can fail."""

from __future__ import annotations

import pytest

from hivemesh.core.membership import Membership
from hivemesh.sim.campaign import default_options, run_seed, workload_factory
from hivemesh.sim.swim import MembershipCluster

SWIM = workload_factory("membership")


@pytest.mark.parametrize("nodes", [5, 8, 12])
def test_membership_workload_has_no_violations(nodes: int) -> None:
    faults = 0
    for seed in range(1, 7):
        res = run_seed(seed, default_options(nodes), SWIM)
        assert res.violations == [], (seed, res.violations)
        assert res.stats["detect_ms"] > 0
        faults += res.stats.get("crashes", 0) + res.stats.get("partitions", 0)
    assert faults > 0


def test_membership_seed_replays_exactly() -> None:
    a = MembershipCluster("5", default_options(6)).run()
    assert a.trace_digest == MembershipCluster("5", default_options(6)).run().trace_digest
    assert a.trace_digest != MembershipCluster("6", default_options(6)).run().trace_digest


def test_a_member_that_never_refutes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break refutation (a live node told it is suspected stays quiet): live
    members end up down after partitions, and convergence fails."""
    monkeypatch.setattr(Membership, "_about_self", lambda self, u: None)
    bad = [run_seed(seed, default_options(6), SWIM).violations for seed in range(1, 9)]
    assert any(v for v in bad), bad


def test_the_kept_counts_match_the_member_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWIM keeps its live count, suspects and sorted live members as states
    change (they are asked on every frame); after every input of a faulty run
    they must equal a fresh scan of the member table."""
    checked = []

    def check(m: Membership) -> None:
        live = [a for a in sorted(m._members) if m._members[a].state in ("up", "suspect")]
        suspects = {a for a, r in m._members.items() if r.state == "suspect"}
        assert (m._live_n, m._suspects) == (len(live), suspects)
        assert m._live_sorted is None or m._live_sorted == live
        assert m._live(exclude=None) == live
        checked.append(len(suspects))

    for name in ("receive", "handle_timer", "forget"):
        real = getattr(Membership, name)

        def wrapped(self: Membership, *args: object, _real: object = real) -> None:
            _real(self, *args)  # type: ignore[operator]
            check(self)

        monkeypatch.setattr(Membership, name, wrapped)
    for seed in (1, 2):
        assert run_seed(seed, default_options(8), SWIM).violations == []
    assert len(checked) > 1000 and max(checked) > 0  # suspects came and went
