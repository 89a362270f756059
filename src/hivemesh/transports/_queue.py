"""A bounded FIFO of frames for one asyncio loop (count and byte limits).

Unlike :class:`asyncio.Queue` it bounds *bytes* as well as items (a frame
can be 4 MiB), hands the writer a whole batch at once, and can be closed:
closing wakes every waiter with the close error. A frame larger than the
byte limit is still admitted when the queue is empty, so a legal frame can
never deadlock the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from hivemesh.errors import HivemeshError

__all__ = ["FrameQueue"]


class FrameQueue:
    """Bounded by ``max_frames`` and ``max_bytes``; single loop, no threads."""

    __slots__ = (
        "_closed",
        "_getters",
        "_handoff",
        "_items",
        "_putters",
        "max_bytes",
        "max_frames",
        "nbytes",
    )

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: deque[bytes] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()
        # True while one woken putter has not yet run: only one holds the turn,
        # so waiting putters are admitted strictly in arrival order.
        self._handoff = False
        self._closed: Callable[[], HivemeshError] | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed is not None

    def _has_room(self, size: int) -> bool:
        items = self._items
        return not items or (len(items) < self.max_frames and self.nbytes + size <= self.max_bytes)

    @staticmethod
    def _wake(waiters: deque[asyncio.Future[None]]) -> bool:
        """Wake the first live waiter; False if there was none."""
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return True
        return False

    def _wake_putter(self) -> None:
        if not self._handoff and self._putters:
            self._handoff = self._wake(self._putters)

    def put_many_nowait(self, frames: list[bytes]) -> int:
        """Append frames from the front while there is room; return how many."""
        if self._closed is not None:
            raise self._closed()
        if self._putters or self._handoff:
            return 0
        items = self._items
        room = self.max_frames - len(items)
        budget = self.max_bytes - self.nbytes
        taken = 0
        for frame in frames:
            size = len(frame)
            if items and (taken >= room or size > budget):
                break
            items.append(frame)
            budget -= size
            taken += 1
        self.nbytes = self.max_bytes - budget
        if taken and self._getters:
            self._wake(self._getters)
        return taken

    def put_nowait(self, frame: bytes) -> bool:
        """Append ``frame`` if there is room (and no earlier putter waits); else False."""
        if self._closed is not None:
            raise self._closed()
        items = self._items
        size = len(frame)
        if (
            self._putters
            or self._handoff
            or (items and (len(items) >= self.max_frames or self.nbytes + size > self.max_bytes))
        ):
            return False
        items.append(frame)
        self.nbytes += size
        if self._getters:
            self._wake(self._getters)
        return True

    async def put(self, frame: bytes) -> None:
        """Append ``frame``, waiting for room (backpressure). FIFO among putters."""
        if self.put_nowait(frame):
            return
        loop = asyncio.get_running_loop()
        at_head = False
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            if at_head:
                self._putters.appendleft(fut)
            else:
                self._putters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in self._putters:
                    self._putters.remove(fut)
                elif fut.done() and not fut.cancelled():  # we held the turn: pass it on
                    self._handoff = False
                    self._wake_putter()
                raise
            self._handoff = False
            if self._closed is not None:
                raise self._closed()
            if self._has_room(len(frame)):
                self._items.append(frame)
                self.nbytes += len(frame)
                if self._getters:
                    self._wake(self._getters)
                if self._has_room(0):
                    self._wake_putter()  # room left: the next in line re-checks
                return
            at_head = True  # still no room: keep our place at the front

    def get_nowait(self) -> bytes | None:
        """The oldest frame, or None if empty (raises if closed and empty)."""
        items = self._items
        if not items:
            if self._closed is not None:
                raise self._closed()
            return None
        frame = items.popleft()
        self.nbytes -= len(frame)
        self._wake_putter()
        return frame

    async def wait_nonempty(self) -> None:
        """Return once a frame is queued; raise the close error if closed and empty."""
        loop = asyncio.get_running_loop()
        while not self._items:
            if self._closed is not None:
                raise self._closed()
            fut: asyncio.Future[None] = loop.create_future()
            self._getters.append(fut)
            try:
                await fut
            except BaseException:
                fut.cancel()
                raise

    async def get(self) -> bytes:
        """The oldest frame, waiting for one."""
        await self.wait_nonempty()
        frame = self.get_nowait()
        assert frame is not None
        return frame

    def take_batch(self, max_bytes: int) -> tuple[list[bytes], int]:
        """Up to ``max_bytes`` of frames (at least one if any): ``(frames, nbytes)``."""
        items = self._items
        if self.nbytes <= max_bytes:  # common case: take everything
            batch = list(items)
            total = self.nbytes
            items.clear()
        else:
            batch = []
            total = 0
            while items and (not batch or total + len(items[0]) <= max_bytes):
                frame = items.popleft()
                batch.append(frame)
                total += len(frame)
        self.nbytes -= total
        self._wake_putter()
        return batch, total

    def close(self, error: Callable[[], HivemeshError], *, discard: bool) -> int:
        """Close: waiters get ``error()``. With ``discard``, drop queued frames
        and return how many were dropped; otherwise they stay readable."""
        self._closed = error
        dropped = 0
        if discard:
            dropped = len(self._items)
            self._items.clear()
            self.nbytes = 0
        while self._wake(self._getters) or self._wake(self._putters):
            pass
        self._handoff = False
        return dropped
