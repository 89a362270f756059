"""The journal on a broker's log: publish our feed, read everyone's.

Theory of operation
-------------------
In broker mode the shared log (a JetStream stream, a Redis stream) is the
*push* half of replication; the Peer's own push is off
(``NodeConfig.push = False``) and its anti-entropy (HAVE/WANT over broker
links) remains the *pull* half.

**Publishing.** A :class:`FeedLog` publishes our own feed, in order, as the
same ``EVENTS`` frames gossip carries (``author, [raw events], head
signature, 0``), one log entry per signed chunk (up to 1024 events and
``_MAX_ENTRY_BYTES``), under our own subject. Only what may leave the node
is published: up to the own feed's durable mark (moved up to cover it, as
when a peer asks for it). An entry counts as published when the broker
acknowledges it; until then it is retried with backoff (an unknown outcome
is published again under the same message id, which JetStream stores once;
readers drop duplicates by seq anyway). Where publishing left off is read
back from the log at start (the last entry under our subject); a log that
lost it (purged, retention) is simply published again from there.

**Reading.** One reader hands every entry -- our own subject's too: a
forged batch of our feed is refused and counted like any other, and a
node whose store lost its own feed recovers it from there -- to the Peer's
receive path with the entry's subject author as the sending peer: the batch goes through the
journal's gate exactly as a gossiped one (chain, signature, trust, clock
bound) -- the broker is not trusted. An entry whose frame names another
author than its subject is refused before that and counted
(``mesh_broker_misrouted``), as is one whose head is not an EVENTS frame
(``mesh_<code>``; only the head is read here, the Peer decodes the frame
once); a tampered one fails the Peer's and the journal's checks and is
counted by their codes (``malformed``, ``bad_signature``, ...). A
batch beyond what we hold (entries we never saw: retention dropped them, or
the log was purged) is a journal *gap*: the Peer asks the author for the
missing range over the broker links (a WANT), and its periodic anti-entropy
with any linked peer fills it otherwise; what nobody still holds stays
missing and is reported (``gap`` counts, ``hivemesh status``).

**Catching up.** While the reader is behind the log's end (the engine's
``backlog``, JetStream's pending count) it tells the Peer
(``log_backlog``): the Peer then pulls nothing by anti-entropy until
``push_grace_ms`` after the backlog ends, so a late joiner is not sent
the same history a second time by its peers over the broker links.

While it reads a backlog the reader also keeps Python's cyclic garbage
collector off (as a rehydration does: the events it allocates are freed by
reference counting, and the collector's passes over them cost ~3% of a
catch-up), at most :data:`_GC_PAUSE_ENTRIES` entries in a row, and turns it
back on when the backlog ends or the reader stops.

**Where reading resumes.** The reader's position is kept in
``<data_dir>/mesh_cursor.json`` with the log's incarnation. It is saved only
when everything handed over has been committed to the store (no pending
group, no unsettled run), so a crash never leaves the cursor past events the
store lacks; it is saved every ``_CURSOR_SAVE_S`` and when a backlog has
been read to its end (the store commits the catch-up at once, not at the
next group commit). A late joiner or a restarted node reads the log from there;
a new log incarnation (deleted and created again) is read from its start.
While the broker is down the node keeps working from its own store (appends
land there, views answer); publishing and reading resume when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hivemesh.core.event import decode_event
from hivemesh.core.frames import FrameType, decode_frame, encode_frame, events_author
from hivemesh.core.identity import address_of
from hivemesh.core.node import Node
from hivemesh.errors import HivemeshError, RemoteProtocolError, TransportError
from hivemesh.mesh.engine import BrokerEngine, backoff

__all__ = ["FeedLog"]

log = logging.getLogger("hivemesh.mesh")

_MAX_ENTRY_BYTES = 900 * 1024  # under nats-server's default 1 MiB max_payload
_IDLE_CHECK_S = 0.25  # publish check when nothing woke us (a missed wake-up)
_CURSOR_SAVE_S = 0.5
_GC_PAUSE_ENTRIES = 1024  # backlog entries (up to ~1M events) read with the collector off

FramesCallback = Callable[[str, list[bytes]], Awaitable[None]]


class FeedLog:
    """Publish our feed to the broker's log and read the swarm's (module docs)."""

    def __init__(
        self,
        node: Node,
        engine: BrokerEngine,
        data_dir: Path,
        *,
        on_frames: FramesCallback,
        committed: Callable[[], bool],
        now_ms: Callable[[], int],
    ) -> None:
        self.node = node
        self._now_ms = now_ms
        self.engine = engine
        self._me = node.identity.public
        self._addr = node.address
        self._on_frames = on_frames
        self._committed = committed
        self._path = data_dir / "mesh_cursor.json"
        self._wake = asyncio.Event()
        self.counters: Counter[str] = Counter()
        #: the last seq of our feed the log acknowledged
        self.published = 0
        self._published_known = False
        self._pos: str | None = None  # the last entry handed to the Peer
        self._log_id = ""
        self._saved: str | None = None
        self._behind = False  # the last entry had more waiting behind it
        self._gc_paused = 0  # entries read since the reader turned the collector off

    # -- publishing -------------------------------------------------------------

    def grew(self) -> None:
        """Our feed may have grown: publish soon (the daemon calls it per own event)."""
        self._wake.set()

    async def _published_head(self) -> int:
        data = await self.engine.last_feed(self._addr)
        if data is None:
            return 0
        try:
            _t, fields = decode_frame(data)
            return int(decode_event(fields[1][-1]).seq)
        except (HivemeshError, IndexError, TypeError, ValueError):
            return 0  # not ours to trust: publish from the start again (duplicates are cheap)

    async def publish_loop(self) -> None:
        """Publish our feed as it grows, until cancelled (a supervised loop)."""
        failures = 0
        while True:
            try:
                if not self._published_known:
                    self.published = await self._published_head()
                    self._published_known = True
                await self._publish_pending()
                failures = 0
            except TransportError as exc:
                self.counters["mesh_publish_retry"] += 1
                log.debug("feed publish retries after %s", exc)
                await backoff(failures)
                failures += 1
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_IDLE_CHECK_S):
                    await self._wake.wait()

    async def _publish_pending(self) -> None:
        journal = self.node.journal
        head = journal.head(self._me).seq
        if head <= self.published:
            return
        upto = self.node.feed_gate.sending(head)
        while self.published < upto:
            start = self.published + 1
            chunk = journal.read_chunk(self._me, start, upto)
            if chunk is None:
                return  # nothing servable yet (an unsigned tail): the next wake
            raws, sig = chunk
            while len(raws) > 1 and sum(len(r) for r in raws) > _MAX_ENTRY_BYTES:
                smaller = journal.read_chunk(self._me, start, start + len(raws) // 2 - 1)
                if smaller is None or len(smaller[0]) >= len(raws):
                    break
                raws, sig = smaller
            last = start + len(raws) - 1
            frame = encode_frame(FrameType.EVENTS, self._me, raws, sig, 0)
            if len(frame) > _MAX_ENTRY_BYTES:  # one signed batch too big for the broker
                self.counters["mesh_entry_too_large"] += 1  # peers pull it instead
            else:
                await self.engine.publish_feed(self._addr, start, last, frame)
                self.counters["mesh_published_events"] += len(raws)
            self.published = last

    # -- reading ----------------------------------------------------------------

    def _load_cursor(self, log_id: str) -> str | None:
        try:
            saved = json.loads(self._path.read_text("utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("log") != log_id:
            return None  # another log incarnation: read it from its start
        pos = saved.get("pos")
        return pos if isinstance(pos, str) else None

    def _save_cursor(self) -> None:
        if self._pos is None or self._pos == self._saved or not self._committed():
            return
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"log": self._log_id, "pos": self._pos}), "utf-8")
        os.replace(tmp, self._path)
        self._saved = self._pos

    async def cursor_loop(self) -> None:
        """Save the reader's position when the store has committed it (module docs)."""
        while True:
            await asyncio.sleep(_CURSOR_SAVE_S)
            self._save_cursor()

    async def read_loop(self) -> None:
        """Read the log from the saved position, until cancelled (a supervised loop)."""
        failures = 0
        while True:
            try:
                self._log_id = await self.engine.log_id()
                break
            except TransportError:
                await backoff(failures)
                failures += 1
        if self._pos is None:
            self._pos = self._saved = self._load_cursor(self._log_id)
        self.node.log_backlog(self._now_ms())  # until the first read says otherwise
        try:
            await self.engine.consume_feeds(self._pos, self._on_entry)
        finally:
            self._collector(False)

    def _collector(self, behind: bool) -> None:
        """Keep the cyclic GC off while a backlog is read (module docs)."""
        if self._gc_paused:
            self._gc_paused += 1
            if not behind or self._gc_paused > _GC_PAUSE_ENTRIES:
                self._gc_paused = 0
                gc.enable()
        elif behind and gc.isenabled():  # (not if someone else turned it off)
            gc.disable()
            self._gc_paused = 1

    async def _on_entry(self, pos: str, author: str, data: bytes) -> None:
        self.counters["mesh_entries_in"] += 1
        self._pos = pos
        behind, was_behind = self.engine.backlog > 0, self._behind
        self._behind = behind
        if behind:  # the log brings the rest: peers need not
            self.node.log_backlog(self._now_ms())
        self._collector(behind)
        try:
            claimed = _entry_author(data)
        except RemoteProtocolError as exc:
            self.counters[f"mesh_{exc.code}"] += 1
            claimed = None
        if claimed is not None and claimed != author:
            self.counters["mesh_broker_misrouted"] += 1
        elif claimed is not None:
            await self._on_frames(author, [data])
        if was_behind and not behind:  # caught up: commit the backlog and save the position now
            with contextlib.suppress(OSError):  # else the next periodic save
                self._save_cursor()

    def close(self) -> None:
        """Save the position one last time (if committed)."""
        with contextlib.suppress(OSError):
            self._save_cursor()

    def statistics(self) -> dict[str, Any]:
        """What ``status`` shows under ``mesh``."""
        return {
            "published_seq": self.published,
            "log_position": self._pos,
            "saved_position": self._saved,
            **dict(self.counters),
        }


def _entry_author(data: bytes) -> str:
    """The author address an EVENTS frame names, from its head alone
    (:func:`~hivemesh.core.frames.events_author`: the Peer decodes the frame
    once, after this check; decoding it here too cost 20-60 us per entry)."""
    return address_of(events_author(data))
