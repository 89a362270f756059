"""The leases workload of the simulator: nodes vote their own leases, and the
split prepare first seen on real processes (a holder's node killed) is a
scenario that fails when its fix is taken out."""

from __future__ import annotations

import pytest

from hivemesh.core.lease_quorum import Proposer
from hivemesh.leases.simlease import LeaseCluster, LeaseOptions, run_sim
from hivemesh.sim.campaign import ci_scenario, default_options, run_seed, workload_factory

LEASES = workload_factory("leases")


@pytest.mark.parametrize("nodes", [3, 5, 6, 9])
def test_leases_workload_has_no_violations(nodes: int) -> None:
    for seed in range(1, 9):
        res = run_seed(seed, default_options(nodes), LEASES)
        assert res.violations == [], (seed, res.violations)
        assert res.stats["lease_split_prepares"] == 1 and res.stats["lease_ok"] > 5


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
        res = run_seed(1, default_options(nodes), LEASES)
        assert any("split prepare" in v and "ended unknown" in v for v in res.violations), res


def test_split_prepare_needs_the_random_phase_to_end() -> None:
    run = run_sim(4, LeaseOptions(voters=5, clients=2, ops_per_client=3, split_prepare=True))
    assert run.problems == [] and any(op.resource == "split" for op in run.ops)
    assert run.crashes >= 1


def test_leases_are_in_the_ci_mix_at_odd_and_even_sizes() -> None:
    sizes = {sc.nodes for s in range(1, 2_000) if (sc := ci_scenario(s)).workload == "leases"}
    assert {5, 6, 7, 50} <= sizes
