"""The simulator's clock adversary: a trusted peer with far-future and
backdated clocks (hivemesh.sim.adversary), and checkers that can fail."""

from __future__ import annotations

import pytest

from hivemesh.core.hlc import HLC
from hivemesh.core.witness import WitnessIndex
from hivemesh.sim.adversary import ClockAdversaryCluster
from hivemesh.sim.campaign import default_options, run_campaign

OPTS = default_options(5, "clock")


def test_the_clock_adversary_campaign_has_no_violations() -> None:
    summary = run_campaign(range(1, 7), OPTS, factory=ClockAdversaryCluster, workload="clock")
    assert summary["violations"] == 0, summary["examples"]
    totals = summary["totals"]
    assert totals["backdated_claims_checked"] > 0  # the attack met names held long enough
    assert totals["crashes"] > 0  # restarts rehydrate whatever the liar got stored
    assert summary["replay"] == []


def test_same_seed_same_trace() -> None:
    a = ClockAdversaryCluster("9", OPTS).run()
    assert a.trace_digest == ClockAdversaryCluster("9", OPTS).run().trace_digest


def _problems(seed: str) -> str:
    return " ".join(ClockAdversaryCluster(seed, OPTS).run().violations)


def test_the_checkers_catch_a_name_taken_by_backdating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WitnessIndex, "order", lambda self, a, s, hlc, w: hlc)  # hlc alone
    assert "the adversary took svc-" in _problems("4")


def test_the_checkers_catch_events_applied_beyond_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hivemesh.core.node.horizon", lambda now_ms: (1 << 63) - 1)
    assert "applied an event beyond the bound" in _problems("4")


def test_the_checkers_catch_a_clock_dragged_by_rehydration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hivemesh.core.node.horizon", lambda now_ms: (1 << 63) - 1)

    def unclamped(self: HLC, stored: int, now_ms: int) -> None:
        self.last = max(self.last, stored)

    monkeypatch.setattr(HLC, "restore", unclamped)
    problems = _problems("5")
    assert "clock was dragged past the bound" in problems
