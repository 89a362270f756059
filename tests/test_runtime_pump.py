"""The daemon's pump: its inline input path and what it does when a send
queue is full.

Unit tests of a :class:`Daemon` that was never started, with fakes of the
Peer and the connection manager in place of the ones ``start`` would open
(the real ones are exercised by every e2e test): frames handled inline send
what fits at once; output that does not fit waits in order in ``_unsent``
for a flush task, and inline input is declined meanwhile so nothing
overtakes it. (The pump was a mixin, ``runtime.pump.Pump``, before it was
folded into the daemon.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from hivemesh.config import Config
from hivemesh.core.effects import Effect, Send
from hivemesh.runtime.daemon import Daemon

FAR = 1 << 62


class _Peer:
    """Receives a frame and answers it to two peers."""

    def __init__(self) -> None:
        self.out: list[Effect] = []
        self.node = SimpleNamespace(journal=SimpleNamespace(unsettled=False))

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        self.out += [Send("p1", b"out-" + frame), Send("p2", b"out-" + frame)]

    def receive_many(self, peer: str, frames: list[bytes], now_ms: int) -> None:
        for frame in frames:
            self.receive(peer, frame, now_ms)

    def effects(self) -> list[Effect]:
        out, self.out = self.out, []
        return out

    def next_deadline(self) -> int:
        return FAR


class _Conns:
    """Send queues that can be made full; ``send`` waits for room."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.room = asyncio.Event()
        self.sent: list[tuple[str, bytes]] = []

    def send_fast(self, peer: str, frame: bytes) -> bool:
        if peer in self.full:
            return False
        self.sent.append((peer, frame))
        return True

    async def send(self, peer: str, frame: bytes) -> bool:
        while peer in self.full:
            await self.room.wait()
            self.room.clear()
        self.sent.append((peer, frame))
        return True


def _pump() -> tuple[Daemon, _Conns]:
    p = Daemon(Config(data_dir=Path("/nonexistent/never-started")))
    p.peer, conns = _Peer(), _Conns()  # type: ignore[assignment]
    p.node = p.peer.node  # type: ignore[assignment]
    p.conns = conns  # type: ignore[assignment]
    p._store = SimpleNamespace(pending=0)
    p._ready.set()
    p._armed_ms, p._started = FAR, True
    return p, conns


def test_a_full_send_queue_holds_inline_input_back_until_its_output_is_sent() -> None:
    async def main() -> None:
        p, conns = _pump()
        assert p._on_frames_now("a", [b"1"])
        assert conns.sent == [("p1", b"out-1"), ("p2", b"out-1")]
        conns.full.add("p1")
        assert p._on_frames_now("a", [b"2"])  # handled; p1's answer does not fit
        # p2's answer waits behind p1's: output leaves in the order it was made
        assert list(p._unsent) == [("p1", b"out-2"), ("p2", b"out-2")]
        assert not p._on_frames_now("a", [b"3"])  # declined: the reader takes it
        await asyncio.sleep(0)  # the flush task starts and waits for room
        assert list(p._unsent) == [("p2", b"out-2")]
        conns.full.clear()
        conns.room.set()
        while p._unsent or p._flush_lock.locked():
            await asyncio.sleep(0)
        assert p._on_frames_now("a", [b"4"])
        assert [f for peer, f in conns.sent if peer == "p1"] == [b"out-1", b"out-2", b"out-4"]
        assert [f for peer, f in conns.sent if peer == "p2"] == [b"out-1", b"out-2", b"out-4"]

    asyncio.run(asyncio.wait_for(main(), 10))


def test_inline_input_waits_for_a_running_flush() -> None:
    async def main() -> None:
        p, _conns = _pump()
        async with p._flush_lock:  # a flush (or the timer loop) is mid-way
            assert not p._on_frames_now("a", [b"1"])
        p._ready.clear()  # a daemon still starting
        assert not p._on_frames_now("a", [b"1"])

    asyncio.run(main())
