"""Small helpers for asyncio tests over real sockets: deadlines on everything."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

__all__ = ["eventually", "read_to_eof", "run"]


def run(coro: Coroutine[Any, Any, None], timeout_s: float = 30.0) -> None:
    """Run one test coroutine with an overall deadline."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout_s):
            await coro

    asyncio.run(bounded())


async def eventually(pred: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait until ``pred()`` holds; fail with ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for: {what}")
        await asyncio.sleep(0.005)


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server hangs up (a reset counts as hanging up); 5 s deadline."""
    async with asyncio.timeout(5):
        try:
            return await reader.read()
        except ConnectionResetError:
            return b""
