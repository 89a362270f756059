"""The simulator's own-feed scenarios: a node restored from an old backup,
a node whose append log is damaged while it is partitioned. The checkers
must find the old bug (a node that writes on from its store forks its feed)
and find nothing with the mark."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from hivemesh.core.ownfeed import Mark, MemoryMarkStore
from hivemesh.sim.campaign import default_options, run_campaign
from hivemesh.sim.cluster import Cluster, SimNode
from hivemesh.sim.options import FaultOptions, SimOptions

OPTS = SimOptions(
    nodes=5,
    appends=80,
    faults=FaultOptions(
        partition_probability=0.2,
        crash_probability=0.1,
        restore_probability=0.3,
        log_damage_probability=0.3,
    ),
)


class StoreTrustingCluster(Cluster):
    """main's behaviour: each boot takes the store as the whole own feed."""

    def _boot(self, sn: SimNode) -> None:
        head = sn.store.heads().get(sn.identity.public, (0, b"\0" * 32))
        sn.marks = MemoryMarkStore(Mark(*head))
        super()._boot(sn)


def test_restores_and_damaged_logs_recover_without_a_fork_or_a_lost_write() -> None:
    summary = run_campaign(range(1, 41), OPTS, jobs=2)
    assert summary["violations"] == 0, summary["examples"]
    t = summary["totals"]
    assert t["restores"] >= 20 and t["log_damages"] >= 20
    assert t["boots_recovering"] >= 20 and t["appends_refused"] > 0
    assert t["own_events_recovered"] > 0  # recovered from peers ...
    assert t["operator_accepted_loss"] > 0  # ... or given up when nobody held them


def _run_store_trusting(seed: int) -> list[str]:
    """One seed of :class:`StoreTrustingCluster`, in a worker process of its
    own: a forked context author can make loro panic, which poisons that
    process's loro state."""
    try:
        return StoreTrustingCluster(str(seed), OPTS).run().violations
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        return [f"loro panicked: {exc}"]


def test_without_the_mark_the_checkers_find_forks_and_lost_writes() -> None:
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as pool:
        problems = [p for ps in pool.map(_run_store_trusting, range(1, 21)) for p in ps]
    assert any("fork" in p for p in problems), problems
    assert any("lost acknowledged" in p for p in problems), problems


def test_the_scenarios_replay_exactly() -> None:
    a = Cluster("17", OPTS).run()
    b = Cluster("17", OPTS).run()
    assert a.trace_digest == b.trace_digest and a.stats == b.stats


def test_the_journal_campaign_includes_both_scenarios() -> None:
    faults = default_options(5).faults
    assert faults.restore_probability > 0 and faults.log_damage_probability > 0
    assert replace(default_options(5, "claims").faults).restore_probability == 0
