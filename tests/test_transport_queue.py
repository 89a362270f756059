"""The bounded frame queue: limits, FIFO backpressure, cancellation, close."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.errors import ConnectionClosed
from hivemesh.transports._queue import FrameQueue


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await coro

    asyncio.run(bounded())


def closed() -> ConnectionClosed:
    return ConnectionClosed("closed")


def test_count_and_byte_limits_and_oversize_admission_when_empty() -> None:
    q = FrameQueue(max_frames=3, max_bytes=10)
    assert q.put_nowait(b"a" * 50)  # larger than the byte limit, but the queue is empty
    assert not q.put_nowait(b"b")
    assert q.get_nowait() == b"a" * 50
    assert q.put_nowait(b"12345") and q.put_nowait(b"12345")
    assert not q.put_nowait(b"x")  # bytes full
    assert q.take_batch(100) == ([b"12345", b"12345"], 10)
    assert all(q.put_nowait(b"%d" % i) for i in range(3))
    assert not q.put_nowait(b"3")  # count full
    assert q.put_many_nowait([b"4"]) == 0
    assert q.get_nowait() == b"0"
    assert q.put_many_nowait([b"4", b"5"]) == 1
    assert len(q) == 3 and q.nbytes == 3


def test_waiting_putters_are_served_in_order() -> None:
    async def main() -> None:
        q = FrameQueue(max_frames=1, max_bytes=100)
        q.put_nowait(b"first")
        tasks = [asyncio.create_task(q.put(b"p%d" % i)) for i in range(5)]
        await asyncio.sleep(0)
        assert not q.put_nowait(b"jumper")  # no overtaking waiting putters
        got = []
        for _ in range(6):
            got.append(await q.get())
        await asyncio.gather(*tasks)
        assert got == [b"first"] + [b"p%d" % i for i in range(5)]

    run(main())


def test_cancelled_putter_leaves_nothing_and_passes_its_turn() -> None:
    async def main() -> None:
        q = FrameQueue(max_frames=1, max_bytes=100)
        q.put_nowait(b"a")
        doomed = asyncio.create_task(q.put(b"doomed"))
        keeper = asyncio.create_task(q.put(b"kept"))
        await asyncio.sleep(0)
        doomed.cancel()
        assert await q.get() == b"a"
        await keeper
        assert await q.get() == b"kept"
        assert len(q) == 0
        with pytest.raises(asyncio.CancelledError):
            await doomed

    run(main())


def test_close_wakes_waiters_and_keeps_or_discards_frames() -> None:
    async def main() -> None:
        q = FrameQueue(max_frames=1, max_bytes=100)
        q.put_nowait(b"a")
        putter = asyncio.create_task(q.put(b"b"))
        await asyncio.sleep(0)
        assert q.close(closed, discard=False) == 0
        with pytest.raises(ConnectionClosed):
            await putter
        assert await q.get() == b"a"  # still readable
        with pytest.raises(ConnectionClosed):
            await q.get()
        q2 = FrameQueue(max_frames=4, max_bytes=100)
        q2.put_nowait(b"x")
        q2.put_nowait(b"y")
        getter_q = FrameQueue(max_frames=1, max_bytes=1)
        getter = asyncio.create_task(getter_q.get())
        await asyncio.sleep(0)
        getter_q.close(closed, discard=True)
        with pytest.raises(ConnectionClosed):
            await getter
        assert q2.close(closed, discard=True) == 2 and len(q2) == 0

    run(main())


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 64),
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=6),
    st.randoms(use_true_random=False),
)
def test_concurrent_putters_lose_nothing_and_keep_their_order(
    max_frames: int, max_bytes: int, putters: list[tuple[int, int]], rnd: random.Random
) -> None:
    """Whatever the interleaving and cancellations: a put that returned is
    delivered exactly once; a cancelled put never is; each task's order holds."""

    async def main() -> None:
        q = FrameQueue(max_frames, max_bytes)
        returned: list[bytes] = []

        async def putter(tid: int, count: int, size: int) -> None:
            for i in range(count):
                frame = b"%d:%d:" % (tid, i) + b"\0" * size
                await q.put(frame)
                returned.append(frame)

        tasks = [asyncio.create_task(putter(t, c, s)) for t, (c, s) in enumerate(putters)]
        got: list[bytes] = []
        for _ in range(2000):  # bounded
            if all(t.done() for t in tasks) and not len(q):
                break
            choice = rnd.random()
            if choice < 0.1:
                victim = rnd.choice(tasks)
                victim.cancel()
            elif choice < 0.5:
                got += q.take_batch(rnd.randint(1, 80))[0]
            elif len(q):
                frame = q.get_nowait()
                assert frame is not None
                got.append(frame)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks, return_exceptions=True)
        got += q.take_batch(10**9)[0]
        assert sorted(got) == sorted(returned)
        assert len(set(got)) == len(got)
        for tid in range(len(putters)):
            mine = [int(f.split(b":")[1]) for f in got if f.startswith(b"%d:" % tid)]
            assert mine == sorted(mine)

    run(main())
