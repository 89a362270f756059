"""Running the adapters' async methods from LangGraph's sync calls.

LangGraph's sync ``invoke`` calls a checkpointer's and a store's sync
methods from a worker thread, while the node lives on its event loop. The
sync face submits the coroutine to that loop and waits with a deadline;
called on the loop itself it would deadlock, so that is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from hivemesh.errors import LocalProtocolError

__all__ = ["node_loop", "run_on_loop"]

T = TypeVar("T")


def run_on_loop(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout_s: float
) -> T:
    """Run ``coro`` on ``loop`` from another thread and return its result."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise LocalProtocolError(
            "a sync LangGraph method was called on the node's event loop: use the async one"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=timeout_s)


def node_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running loop (the node's): adapters are created inside it."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise LocalProtocolError(
            f"create the {what} inside the node's event loop (in `async with Node(...)`)"
        ) from None
