"""The log reader's first request is on the wire when the engine says so
(``BrokerEngine.requested``), so the daemon's start may go on without the
event loop while the broker sends the first entries (runtime.broker's
``open_links``). Against the shared nats-server (127.0.0.1:4222) and Redis
(127.0.0.1:6379); each test drops its swarm (tests/broker_cleanup.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker_cleanup import drop_swarm
from hivemesh.mesh import open_engine, parse_mesh_url

pytestmark = pytest.mark.broker

ENTRIES = 3


async def _nothing(data: bytes) -> None:
    return None


@contextlib.asynccontextmanager
async def _reading(engine: Any, on_msg: Any) -> AsyncIterator[None]:
    """``engine.consume_feeds`` in a task, cancelled on leaving."""
    task = asyncio.create_task(engine.consume_feeds(None, on_msg))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _read_after_a_blocking_start(url: str) -> list[str]:
    """Publish entries; start a reader, wait for ``requested``, block the
    loop for a moment (a daemon's synchronous start); the positions read."""
    writer, reader = (open_engine(parse_mesh_url(url)) for _ in range(2))
    await writer.start("writer", _nothing, _nothing, lambda up: None)
    await reader.start("reader", _nothing, _nothing, lambda up: None)
    try:
        for i in range(1, ENTRIES + 1):
            await writer.publish_feed("writer", i, i, b"entry %d" % i)
        got: list[str] = []
        done = asyncio.Event()

        async def on_msg(pos: str, author: str, data: bytes) -> None:
            got.append(pos)
            if len(got) == ENTRIES:
                done.set()

        async with _reading(reader, on_msg):
            await asyncio.wait_for(reader.requested.wait(), 10.0)
            time.sleep(0.1)  # the loop is blocked: only what was sent gets answered
            await asyncio.wait_for(done.wait(), 10.0)
            return got
    finally:
        await reader.close()
        await writer.close()


@pytest.mark.parametrize("broker", ["nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0"])
def test_both_engines_say_when_the_first_read_is_requested(broker: str) -> None:
    url = f"{broker}?swarm=rs{uuid.uuid4().hex[:10]}"
    try:
        got = asyncio.run(_read_after_a_blocking_start(url))
        assert len(got) == ENTRIES and len(set(got)) == ENTRIES
    finally:
        drop_swarm(url)


def test_nats_requests_are_flushed_before_requested_returns() -> None:
    """After ``requested`` fires and the waiter resumes, nats-py holds no
    unsent bytes: the pull requests left with the flusher's first turn."""
    url = f"nats://127.0.0.1:4222?swarm=rs{uuid.uuid4().hex[:10]}"

    async def run() -> int:
        engine: Any = open_engine(parse_mesh_url(url))
        await engine.start("reader", _nothing, _nothing, lambda up: None)
        try:

            async def on_msg(pos: str, author: str, data: bytes) -> None:
                return None

            async with _reading(engine, on_msg):
                async with asyncio.timeout(10.0):  # as runtime.broker waits (no extra task)
                    await engine.requested.wait()
                pending: int = engine._nc._pending_data_size
                return pending
        finally:
            await engine.close()

    try:
        assert asyncio.run(run()) == 0
    finally:
        drop_swarm(url)
