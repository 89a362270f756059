"""The supervisor's rules (:mod:`hivemesh.core.restarts`), without an event loop."""

from __future__ import annotations

from hivemesh.core.restarts import FATAL, GiveUp, Policy, Restart, Restarts, stalled_for


def test_failures_back_off_doubling_up_to_the_cap_then_give_up() -> None:
    r = Restarts(Policy(restart=True, max_restarts=5, backoff_min_s=0.05, backoff_max_s=0.3))
    verdicts = [r.failed(float(t)) for t in range(6)]
    assert verdicts[:5] == [Restart(0.05), Restart(0.1), Restart(0.2), Restart(0.3), Restart(0.3)]
    assert verdicts[5] == GiveUp(" (6 failures in 60 s)")


def test_failures_older_than_the_window_are_forgotten() -> None:
    r = Restarts(Policy(restart=True, max_restarts=1, window_s=10.0, backoff_min_s=1.0))
    assert r.failed(0.0) == Restart(1.0)
    assert isinstance(r.failed(5.0), GiveUp)  # two within 10 s
    assert r.failed(100.0) == Restart(1.0)  # the earlier ones left the window
    assert r.failed(111.0) == Restart(1.0)


def test_a_fatal_policy_gives_up_at_the_first_failure() -> None:
    assert Restarts(FATAL).failed(0.0) == GiveUp("")


def test_a_stall_is_a_silence_longer_than_its_limit() -> None:
    assert stalled_for(None, 100.0, 30.0) is None  # never beat yet
    assert stalled_for(80.0, 100.0, 30.0) is None
    assert stalled_for(80.0, 110.0, 30.0) is None  # exactly the limit: not yet
    assert stalled_for(80.0, 110.5, 30.0) == 30.5


def test_a_streak_logs_its_first_failure_every_hundredth_and_its_end() -> None:
    from hivemesh.core.restarts import Streak

    streak = Streak()
    logged = [n for n in range(1, 251) if streak.failed()]
    assert logged == [1, 100, 200] and streak.failing == 250
    assert streak.ok() == 250 and streak.ok() == 0  # the end is reported once
    assert streak.failed() and Streak(every=2).failed()


def test_a_tasks_health_reports_a_stall_once_until_it_beats_again() -> None:
    from hivemesh.core.restarts import TaskHealth

    h = TaskHealth()
    assert h.stall(100.0, 30.0) is None  # not running yet
    h.started(0.0)
    assert h.stall(20.0, 30.0) is None
    assert h.stall(40.0, 30.0) == 40.0 and h.stalled
    assert h.stall(80.0, 30.0) is None  # reported once
    assert h.beat(81.0) is True and not h.stalled  # the stall ended: logged
    assert h.beat(82.0) is False
    assert h.stall(200.0, 30.0) == 118.0  # a new stall
    h.failed("RuntimeError: boom")
    h.running = False
    assert h.stall(400.0, 30.0) is None  # a task that is not running does not stall
    assert h.snapshot(82.5) == {
        "running": False,
        "failures": 1,
        "restarts": 0,
        "last_error": "RuntimeError: boom",
        "stalled": True,
        "beat_s_ago": 0.5,
    }
