"""The supervisor of a daemon's tasks (:mod:`hivemesh.runtime.supervise`), and
the daemon's timer loop under it.

Unit tests drive the supervisor with small coroutines; the daemon tests run
a real in-process node (real SQLite, real sockets) whose timer step raises.
The cross-process faults (trust file, store, frame handler) are in
``test_supervision_e2e.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from aiotest import eventually, run
from hivemesh.core.identity import Identity
from hivemesh.runtime import connections as dialling
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.supervise import FATAL, Policy, Supervisor, TaskFailed, reap

QUICK = Policy(restart=True, max_restarts=3, window_s=60.0, backoff_min_s=0.001)


class _Boom(Exception):
    pass


class _Panic(BaseException):
    """Like loro's PanicException: not an Exception."""


def _supervisor() -> tuple[Supervisor, Counter[str], list[TaskFailed]]:
    counters: Counter[str] = Counter()
    fatal: list[TaskFailed] = []
    return Supervisor(counters, fatal.append), counters, fatal


def test_a_failing_loop_is_logged_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        sup, counters, fatal = _supervisor()
        runs: list[int] = []
        forever = asyncio.Event()

        async def loop() -> None:
            runs.append(1)
            if len(runs) == 1:
                raise _Boom("first run fails")
            if len(runs) == 2:
                raise _Panic("second run panics")
            await forever.wait()

        sup.spawn("tick", loop, QUICK)
        await eventually(lambda: len(runs) == 3, "the third run")
        assert counters["task_failed_tick"] == 2 and counters["task_restarted_tick"] == 2
        stats = sup.statistics()["tick"]
        assert stats["running"] and stats["restarts"] == 2
        assert stats["last_error"] == "_Panic: second run panics"
        assert fatal == []
        await sup.close()

    run(scenario())
    assert "the tick task failed: _Boom: first run fails" in caplog.text
    assert "Traceback" in caplog.text


def test_a_loop_that_keeps_failing_ends_the_daemon() -> None:
    async def scenario() -> None:
        sup, counters, fatal = _supervisor()

        async def loop() -> None:
            raise _Boom("always")

        task = sup.spawn("tick", loop, QUICK)
        await asyncio.wait_for(task, 5)
        assert counters["task_failed_tick"] == 4 and counters["task_restarted_tick"] == 3
        assert len(fatal) == 1 and sup.failure is fatal[0]
        assert isinstance(fatal[0].__cause__, _Boom)
        assert "4 failures in 60 s" in str(fatal[0]) and fatal[0].code == "task_failed"
        await sup.close()

    run(scenario())


def test_a_loop_that_hangs_is_reported_once_per_stall(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        sup, counters, fatal = _supervisor()
        go = asyncio.Event()
        beats: list[int] = []

        async def loop() -> None:
            while True:
                sup.beat("tick")
                beats.append(1)
                if len(beats) == 3:
                    await go.wait()  # hangs until the test lets it go
                await asyncio.sleep(0.001)

        sup.spawn("tick", loop, Policy(restart=True, stall_s=0.1))
        await eventually(lambda: counters["task_stalled_tick"] == 1, "the stall reported")
        assert sup.statistics()["tick"]["stalled"] and sup.statistics()["tick"]["running"]
        await asyncio.sleep(0.3)
        assert counters["task_stalled_tick"] == 1  # once per stall, not once per check
        go.set()
        await eventually(lambda: not sup.statistics()["tick"]["stalled"], "progress again")
        assert fatal == [] and counters["task_failed_tick"] == 0  # reported, not cancelled
        await sup.close()

    run(scenario())
    assert "the tick task made no progress for" in caplog.text and "in loop" in caplog.text


def test_a_fatal_loop_ends_the_daemon_at_its_first_failure() -> None:
    async def scenario() -> None:
        sup, counters, fatal = _supervisor()

        async def loop() -> None:
            raise _Boom("once")

        await asyncio.wait_for(sup.spawn("commit", loop, FATAL), 5)
        assert counters["task_failed_commit"] == 1 and counters["task_fatal_commit"] == 1
        assert counters["task_restarted_commit"] == 0 and len(fatal) == 1

    run(scenario())


def test_a_loop_that_returns_while_the_node_runs_has_failed() -> None:
    async def scenario() -> None:
        sup, _, fatal = _supervisor()

        async def loop() -> None:
            return

        await asyncio.wait_for(sup.spawn("timer", loop, FATAL), 5)
        assert "returned while the node runs" in str(fatal[0])
        sup2, counters2, fatal2 = _supervisor()
        sup2.closing()  # stopping: a loop that ends has finished
        await asyncio.wait_for(sup2.spawn("timer", loop, FATAL), 5)
        assert fatal2 == [] and counters2["task_failed_timer"] == 0

    run(scenario())


def test_short_jobs_and_callbacks_are_counted_and_fatal_only_if_asked() -> None:
    async def scenario() -> None:
        sup, counters, fatal = _supervisor()

        async def job() -> None:
            raise _Boom("job")

        await asyncio.wait([sup.spawn_once("flush", job())])
        await asyncio.sleep(0)
        assert counters["task_failed_flush"] == 1 and fatal == []
        sup.guard("commit", lambda: None)()
        assert counters["task_failed_commit"] == 0

        def panics() -> None:
            raise _Panic("callback")

        asyncio.get_running_loop().call_soon(sup.guard("commit", panics, fatal=True))
        await eventually(lambda: bool(fatal), "the fatal callback")
        assert counters["task_failed_commit"] == 1 and "_Panic: callback" in str(fatal[0])
        await asyncio.wait([sup.spawn_once("check", job(), fatal=True)])
        await asyncio.sleep(0)
        assert counters["task_fatal_check"] == 1 and len(fatal) == 1  # on_fatal runs once

    run(scenario())


def test_what_reaches_the_event_loop_is_counted_and_the_handler_given_back() -> None:
    async def scenario() -> None:
        sup, counters, _ = _supervisor()
        loop = asyncio.get_running_loop()
        before = loop.get_exception_handler()
        sup.install(loop)

        def unguarded() -> None:
            raise _Boom("nobody guarded this callback")

        loop.call_soon(unguarded)
        await eventually(lambda: counters["loop_exception"] == 1, "the loop's handler")
        await sup.close()
        assert loop.get_exception_handler() is before

    run(scenario())


def _fail_timer_step(node: hivemesh.Node, times: int) -> list[int]:
    """Make the daemon's timer step raise the next ``times`` times."""
    daemon = node.daemon
    sync_trust = daemon.sync_trust  # called once every timer round
    calls: list[int] = []

    def faulty() -> bool:
        calls.append(len(calls))
        if len(calls) <= times:
            raise _Boom(f"timer step {len(calls)}")
        return sync_trust()

    daemon.sync_trust = faulty  # type: ignore[method-assign]
    return calls


def test_the_timer_loop_of_a_node_is_restarted_after_a_failure(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with hivemesh.Node(tmp_path / "n", trust_mode="open") as node:
            calls = _fail_timer_step(node, 1)
            node.daemon._wake.set()
            await eventually(lambda: len(calls) >= 3, "the timer runs again", 10)
            status = node.status()
            timer = status["tasks"]["timer"]
            assert timer["beat_s_ago"] < 5 and not timer.pop("stalled")
            del timer["beat_s_ago"]
            assert timer == {
                "running": True,
                "failures": 1,
                "restarts": 1,
                "last_error": "_Boom: timer step 1",
            }
            assert status["counters"]["task_failed_timer"] == 1

    run(scenario())


def test_a_node_whose_timer_keeps_failing_stops_and_says_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = hivemesh.Node(tmp_path / "n", trust_mode="open")
        await node.start()
        daemon = node.daemon
        _fail_timer_step(node, 1_000)
        daemon._wake.set()
        with pytest.raises(TaskFailed, match="the timer task failed \\(6 failures in 60 s\\)"):
            await asyncio.wait_for(daemon.run_until_stopped(), 20)
        assert not (tmp_path / "n" / "ctl.sock").exists()  # stopped: nothing answers

    run(scenario(), timeout_s=40)


def _manager(ident: Identity, sup: Supervisor) -> ConnectionManager:
    async def on_frames(peer: str, frames: list[bytes]) -> None:
        return None

    async def on_peer(peer: str, up: bool) -> None:
        return None

    return ConnectionManager(
        ident,
        authorize=lambda _a: True,
        on_frames=on_frames,
        on_peer=on_peer,
        dial_timeout_s=2.0,
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
        slow_peer_timeout_s=5.0,
        rng=random.Random(1),
        spawn=sup.watch,
    )


def test_a_bug_on_the_dial_path_is_counted_and_the_dialler_dials_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_connect = dialling.connect
    calls: list[int] = []

    async def connect_with_a_bug(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise _Boom("a bug in the dial path")
        return await real_connect(*args, **kwargs)

    monkeypatch.setattr(dialling, "connect", connect_with_a_bug)

    async def scenario() -> None:
        sup, counters, fatal = _supervisor()
        a = _manager(Identity.from_seed(b"\x01" * 32), sup)
        b = _manager(Identity.from_seed(b"\x02" * 32), sup)
        port = await b.listen("127.0.0.1", 0)
        a.want("127.0.0.1", port, b.address)
        await eventually(lambda: b.address in a.links, "a dials b again", 10)
        assert a.counters["dial_crashed"] == 1 and len(calls) >= 2
        assert counters["task_failed_dialler"] == 0 and fatal == []  # it never ended
        await a.close()
        await b.close()

    run(scenario())


def test_a_bug_in_a_channels_write_loop_ends_the_channel_and_the_link_comes_back() -> None:
    async def scenario() -> None:
        sup, _, _ = _supervisor()
        a = _manager(Identity.from_seed(b"\x01" * 32), sup)
        b = _manager(Identity.from_seed(b"\x02" * 32), sup)
        port = await b.listen("127.0.0.1", 0)
        a.want("127.0.0.1", port, b.address)
        await eventually(lambda: b.address in a.links, "a linked to b", 10)
        channel = a.links[b.address].channel
        session = channel._session

        def encode_with_a_bug(frames: Any) -> bytes:
            raise _Boom("a bug in the write loop")

        session.encode_frames = encode_with_a_bug  # type: ignore[method-assign]
        for _ in range(2):  # the first is written at once; the second is the write loop's
            assert a.send_fast(b.address, b"\x93\x01\x7f\xc0")
        await eventually(lambda: channel.is_closed, "the channel ends, not mute", 10)
        assert "write loop failed" in str(channel.close_reason)
        await eventually(
            lambda: (link := a.links.get(b.address)) is not None and link.channel is not channel,
            "a new link to b",
            10,
        )
        await a.close()
        await b.close()

    run(scenario())


def test_reap_suppresses_only_the_cancellation_it_asked_for() -> None:
    async def scenario() -> None:
        async def idle() -> None:
            await asyncio.sleep(60)

        async def bad_cleanup() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                raise _Boom("cleanup failed")

        async def failed_early() -> None:
            raise _Boom("failed before the stop")

        early = asyncio.get_running_loop().create_task(failed_early())
        await asyncio.sleep(0)
        assert early.done()
        quiet = [asyncio.get_running_loop().create_task(idle()) for _ in range(3)]
        await asyncio.sleep(0)
        await reap([*quiet, early], "test")  # cancelled ones and one that had failed: quiet
        assert all(t.cancelled() for t in quiet)
        loud = asyncio.get_running_loop().create_task(bad_cleanup())
        await asyncio.sleep(0)
        with pytest.raises(_Boom, match="cleanup failed"):
            await reap([loud], "test")  # a failure while ending is not swallowed

        # our own cancellation while reaping propagates
        stuck = asyncio.get_running_loop().create_task(idle())
        reaper = asyncio.get_running_loop().create_task(reap([stuck]))
        await asyncio.sleep(0)
        reaper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reaper

    run(scenario())
