"""What the feed log reader hands to the Peer (hivemesh.mesh.feedlog).

The reader reads only an entry's head (array header, version, type, author)
to check it against the subject it came under; the Peer decodes the whole
frame once. Entries whose head is not an EVENTS frame of a public key, or
names another author than its subject, are refused and counted
(``mesh_<code>``, ``mesh_broker_misrouted``) before the Peer; an entry whose
head is fine and whose rest is tampered with is refused by the Peer's
receive path and counted there by code. While a backlog is read the cyclic
garbage collector is off. No broker: the engine is a stub.
"""

from __future__ import annotations

import asyncio
import gc
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FRAME_VERSION, FrameType, decode_frame, encode_frame, events_author
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore
from hivemesh.errors import DecodeError, FrameTooLarge, UnsupportedVersion
from hivemesh.mesh import feedlog as feedlog_module
from hivemesh.mesh.feedlog import FeedLog
from hivemesh.sim.views import EventSetDigest

ME = Identity.from_seed(b"n" * 32)
AUTHOR = Identity.from_seed(b"a" * 32)
OTHER = Identity.from_seed(b"o" * 32)
NOW = 1_800_000_000_000


class _Engine:
    backlog = 0


def _batch(n: int = 3) -> tuple[list[bytes], bytes]:
    writer = FeedWriter(AUTHOR, Head(), HLC())
    for i in range(n):
        writer.append("app.note", {"i": i}, NOW)
    sealed = writer.seal()
    assert sealed is not None
    return [e.raw for e in sealed[0]], sealed[1]


def _reader(tmp_path: Path) -> tuple[FeedLog, Node, EventSetDigest, list[str]]:
    node = Node(ME, MemoryStore(), random.Random(1), now_ms=NOW)
    seen = EventSetDigest()
    node.add_view(seen)
    handed: list[str] = []

    async def on_frames(author: str, frames: list[bytes]) -> None:
        handed.append(author)
        for frame in frames:
            node.receive(author, frame, NOW)

    engine: Any = _Engine()
    feedlog = FeedLog(
        node, engine, tmp_path, on_frames=on_frames, committed=lambda: True, now_ms=lambda: NOW
    )
    return feedlog, node, seen, handed


def _read(feedlog: FeedLog, *entries: tuple[str, bytes]) -> None:
    async def run() -> None:
        for i, (author, data) in enumerate(entries, 1):
            await feedlog._on_entry(str(i), author, data)

    asyncio.run(run())


def test_a_genuine_entry_is_handed_over_once_and_applied(tmp_path: Path) -> None:
    feedlog, node, seen, handed = _reader(tmp_path)
    raws, sig = _batch()
    _read(feedlog, (AUTHOR.address, encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)))
    assert handed == [AUTHOR.address]
    assert seen.count == 3 and node.journal.head(AUTHOR.public).seq == 3
    assert not {k for k in feedlog.counters if k != "mesh_entries_in"}


def test_a_misrouted_entry_never_reaches_the_peer(tmp_path: Path) -> None:
    feedlog, _node, seen, handed = _reader(tmp_path)
    raws, sig = _batch()
    _read(feedlog, (OTHER.address, encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)))
    assert handed == [] and not seen.count
    assert feedlog.counters["mesh_broker_misrouted"] == 1


_A = AUTHOR.public
_GARBAGE = [
    (b"", "mesh_malformed"),
    (b"garbage", "mesh_malformed"),
    (b"\x96\x01", "mesh_malformed"),  # a head cut short
    (b"\x96\x01" + bytes([FrameType.EVENTS]) + b"\xc4", "mesh_malformed"),
    (msgpack.packb({"a": 1}), "mesh_malformed"),
    (encode_frame(FrameType.HAVE, {}, False), "mesh_malformed"),  # not EVENTS
    (msgpack.packb([FRAME_VERSION, "x", _A, [], b"", 0]), "mesh_malformed"),
    (msgpack.packb([FRAME_VERSION, int(FrameType.EVENTS), _A, []]), "mesh_malformed"),
    (msgpack.packb([FRAME_VERSION, int(FrameType.EVENTS), b"short", [], b"", 0]), "mesh_malformed"),
    (msgpack.packb([FRAME_VERSION, int(FrameType.EVENTS), "text", [], b"", 0]), "mesh_malformed"),
    (msgpack.packb([FRAME_VERSION + 1, int(FrameType.EVENTS), _A, [], b"", 0]), "mesh_bad_version"),
    (b"\x96" + b"x" * (5 << 20), "mesh_oversize"),
]


@pytest.mark.parametrize(("data", "counter"), _GARBAGE)
def test_garbage_is_refused_before_the_peer_and_counted(
    tmp_path: Path, data: bytes, counter: str
) -> None:
    feedlog, _node, seen, handed = _reader(tmp_path)
    _read(feedlog, (AUTHOR.address, data))
    assert handed == [] and not seen.count
    assert feedlog.counters[counter] == 1
    assert feedlog.counters["mesh_entries_in"] == 1


def test_the_head_is_read_as_the_whole_frame_would_be() -> None:
    raws, sig = _batch()
    frame = encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)
    assert events_author(frame) == AUTHOR.public
    for data, exc in (
        (b"\x00", DecodeError),
        (
            msgpack.packb([FRAME_VERSION + 1, int(FrameType.EVENTS), _A, [], b"", 0]),
            UnsupportedVersion,
        ),
        (b"\x96" + b"x" * (5 << 20), FrameTooLarge),
    ):
        with pytest.raises(exc):
            events_author(data)


def test_the_head_never_accepts_what_the_whole_frame_refuses_at_its_head() -> None:
    """Random damage to a frame's first bytes: wherever the whole decode
    sees an EVENTS frame with a 32-byte author, the head reads that author;
    a head the whole decode refuses for its version or type, the head
    refuses too (the rest of the frame is the Peer's to refuse)."""
    raws, sig = _batch()
    frame = encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)
    rng = random.Random(7)
    for _ in range(500):
        data = bytearray(frame)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(40)] = rng.randrange(256)
        try:
            ftype, fields = decode_frame(bytes(data))
        except UnsupportedVersion:
            with pytest.raises((UnsupportedVersion, DecodeError)):
                events_author(bytes(data))
            continue
        except DecodeError:
            continue  # the head may be fine and the rest not: the Peer refuses it
        author = fields[0] if ftype == FrameType.EVENTS and len(fields) == 4 else None
        if type(author) is bytes and len(author) == 32:
            assert events_author(bytes(data)) == author
            continue
        with pytest.raises(DecodeError):  # a whole frame that is not one with an author
            events_author(bytes(data))


def test_a_tampered_body_under_a_good_head_is_refused_by_the_peer(tmp_path: Path) -> None:
    """The head names the subject's author; the rest is cut short or altered:
    the Peer's receive path refuses it and counts it by code."""
    feedlog, node, seen, handed = _reader(tmp_path)
    raws, sig = _batch()
    good = encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)
    altered = [raws[0], raws[1][:-1] + bytes([raws[1][-1] ^ 1]), raws[2]]
    _read(
        feedlog,
        (AUTHOR.address, good[: len(good) // 2]),  # truncated
        (AUTHOR.address, good + b"\x00"),  # trailing bytes
        (AUTHOR.address, encode_frame(FrameType.EVENTS, AUTHOR.public, altered, sig, 0)),
        (AUTHOR.address, encode_frame(FrameType.EVENTS, AUTHOR.public, raws, bytes(64), 0)),
    )
    assert handed == [AUTHOR.address] * 4
    assert not seen.count and node.journal.head(AUTHOR.public).seq == 0
    assert node.counters["malformed"] == 2
    assert sum(node.counters.values()) >= 4, node.counters
    assert not {k for k in feedlog.counters if k != "mesh_entries_in"}


class _Backlog:
    """An engine whose log holds ``left`` more entries after each one read."""

    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries
        self.backlog = 0
        self.collector_on: list[bool] = []
        self.reading = asyncio.Event()

    async def log_id(self) -> str:
        return "log"

    async def consume_feeds(self, after: str | None, on_msg: Any) -> None:
        for i, data in enumerate(self.entries, 1):
            self.backlog = len(self.entries) - i
            await on_msg(str(i), AUTHOR.address, data)
            self.collector_on.append(gc.isenabled())
            await asyncio.sleep(0)  # the broker's next entry arrives
        self.reading.set()
        await asyncio.Event().wait()  # a live reader waits for more


def _backlog_reader(tmp_path: Path, n: int) -> tuple[FeedLog, _Backlog]:
    feedlog, _node, _seen, _handed = _reader(tmp_path)
    raws, sig = _batch()
    engine = _Backlog([encode_frame(FrameType.EVENTS, AUTHOR.public, raws, sig, 0)] * n)
    feedlog.engine = engine  # type: ignore[assignment]
    return feedlog, engine


def _read_until_stopped(feedlog: FeedLog, engine: _Backlog, stop_early: bool) -> None:
    async def run() -> None:
        task = asyncio.create_task(feedlog.read_loop())
        if stop_early:  # stopped in the middle of the backlog
            while not engine.collector_on:
                await asyncio.sleep(0)
        else:
            await engine.reading.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


def test_the_collector_is_off_while_a_backlog_is_read(tmp_path: Path) -> None:
    assert gc.isenabled()
    feedlog, engine = _backlog_reader(tmp_path, 4)
    _read_until_stopped(feedlog, engine, stop_early=False)
    assert engine.collector_on == [False, False, False, True]  # on again once caught up
    assert gc.isenabled()


def test_the_collector_comes_back_when_the_reader_stops_mid_backlog(tmp_path: Path) -> None:
    feedlog, engine = _backlog_reader(tmp_path, 50)
    _read_until_stopped(feedlog, engine, stop_early=True)
    assert engine.collector_on[0] is False and len(engine.collector_on) < 50
    assert gc.isenabled()


def test_a_long_backlog_gets_the_collector_back_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feedlog_module, "_GC_PAUSE_ENTRIES", 3)
    feedlog, engine = _backlog_reader(tmp_path, 10)
    _read_until_stopped(feedlog, engine, stop_early=False)
    assert True in engine.collector_on[:-1] and engine.collector_on.count(False) >= 6
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(tmp_path: Path) -> None:
    feedlog, engine = _backlog_reader(tmp_path, 3)
    gc.disable()
    try:
        _read_until_stopped(feedlog, engine, stop_early=False)
        assert engine.collector_on == [False, False, False] and not gc.isenabled()
    finally:
        gc.enable()
