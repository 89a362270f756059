"""Direct messages, the durable inbox and ``ping``, wired for the daemon.

Theory of operation
-------------------
The protocol is :class:`hivemesh.core.direct.Direct` (sans-IO: retries,
acks, dedup, one-hop relay). This module adds what needs I/O:

* **Futures for senders.** :meth:`Messaging.send` returns an asyncio future
  resolved from ``Direct.results()`` (acked or failed at its deadline).
* **A durable inbox.** After every input, messages the core accepted (and
  acknowledged) are moved into ``inbox.db`` (SQLite, WAL), so the inbox
  survives restarts. When the durable inbox holds ``inbox_max`` messages the
  core inbox is left to fill up, and a full core inbox withholds acks: the
  senders retry -- backpressure, not loss. (A crash in the instant between
  the core's ack and the SQLite commit can lose that one message; the
  window is one event-loop turn.)
* **Ping.** ``RT_PING``/``RT_PONG`` frames carry a nonce; the round-trip
  time is measured on the sender with wall-clock milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hivemesh.core.codec import pack, unpack
from hivemesh.core.direct import Direct, DirectAcked, DirectConfig, InboxMessage
from hivemesh.core.frames import encode_frame
from hivemesh.core.node import Node
from hivemesh.errors import DeadlineExceeded, DecodeError, StoreError

__all__ = ["RT_PING", "RT_PONG", "Inbox", "Messaging"]

#: Runtime frame types (outside the core table's ranges; see core.frames).
RT_PING = 60
RT_PONG = 61


class Inbox:
    """Received direct messages in SQLite, oldest first."""

    def __init__(self, path: Path) -> None:
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS inbox (n INTEGER PRIMARY KEY AUTOINCREMENT,"
                " sender TEXT NOT NULL, msg_id TEXT NOT NULL, data BLOB NOT NULL,"
                " received_ms INTEGER NOT NULL, relayed_by TEXT, UNIQUE (sender, msg_id))"
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the inbox: {exc}") from None

    def count(self) -> int:
        """Messages held."""
        return int(self.db.execute("SELECT count(*) FROM inbox").fetchone()[0])

    def add(self, messages: list[InboxMessage]) -> int:
        """Store messages (a duplicate ``(sender, msg_id)`` is ignored)."""
        with contextlib.closing(self.db.cursor()) as cur:
            cur.execute("BEGIN")
            for m in messages:
                cur.execute(
                    "INSERT OR IGNORE INTO inbox (sender, msg_id, data, received_ms, relayed_by)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (m.sender, m.msg_id, pack(m.data), m.received_ms, m.relayed_by),
                )
            cur.execute("COMMIT")
        return len(messages)

    def list(self, limit: int, *, remove: bool = False) -> list[dict[str, Any]]:
        """The oldest ``limit`` messages (removed if ``remove``)."""
        rows = self.db.execute(
            "SELECT n, sender, msg_id, data, received_ms, relayed_by FROM inbox ORDER BY n LIMIT ?",
            (limit,),
        ).fetchall()
        out = []
        for n, sender, msg_id, data, received_ms, relayed_by in rows:
            try:
                value = unpack(data)
            except DecodeError:
                value = None
            out.append(
                {
                    "n": n,
                    "sender": sender,
                    "msg_id": msg_id,
                    "data": value,
                    "received_ms": received_ms,
                    "relayed_by": relayed_by,
                }
            )
        if remove and out:
            self.db.execute("DELETE FROM inbox WHERE n <= ?", (out[-1]["n"],))
        return out

    def close(self) -> None:
        """Close the database."""
        self.db.close()


class Messaging:
    """Direct messages and pings of one daemon (see module docs)."""

    def __init__(
        self,
        node: Node,
        rng: random.Random,
        inbox_path: Path,
        *,
        inbox_max: int,
        relays: Callable[[str], list[str]],
    ) -> None:
        self.node = node
        self.rng = rng
        self.inbox_max = inbox_max
        self.direct = Direct(
            node, rng, DirectConfig(inbox_capacity=min(inbox_max, 10_000)), relays=relays
        )
        self.inbox = Inbox(inbox_path)
        self.counters: Counter[str] = Counter()
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._pings: dict[int, tuple[asyncio.Future[float], int]] = {}
        node.register_handler(RT_PING, self._on_ping)
        node.register_handler(RT_PONG, self._on_pong)

    # -- sending -------------------------------------------------------------------

    def send(
        self, to: str, data: Any, now_ms: int, timeout_ms: int
    ) -> asyncio.Future[dict[str, Any]]:
        """Queue a message; the future resolves when it is acked or fails."""
        msg_id = self.direct.send(to, data, now_ms, deadline_ms=timeout_ms)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[msg_id] = fut
        return fut

    def ping(self, to: str, now_ms: int) -> tuple[int, asyncio.Future[float]]:
        """Send a ping; the future resolves with the round trip in ms."""
        nonce = self.rng.getrandbits(62)
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[nonce] = (fut, now_ms)
        self.node.send(to, encode_frame(RT_PING, nonce))
        return nonce, fut

    def forget_ping(self, nonce: int) -> None:
        """Drop a ping that timed out."""
        self._pings.pop(nonce, None)

    def _on_ping(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1 or type(fields[0]) is not int:
            raise DecodeError("RT_PING takes one int nonce")
        self.node.send(peer, encode_frame(RT_PONG, fields[0]))

    def _on_pong(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1 or type(fields[0]) is not int:
            raise DecodeError("RT_PONG takes one int nonce")
        got = self._pings.pop(fields[0], None)
        if got is None:
            self.counters["stale_pong"] += 1
            return
        fut, sent_ms = got
        if not fut.done():
            fut.set_result(float(now_ms - sent_ms))

    # -- pump hooks ------------------------------------------------------------------

    def after_input(self) -> None:
        """Resolve finished sends; move accepted messages into the durable inbox."""
        for res in self.direct.results():
            fut = self._waiters.pop(res.msg_id, None)
            if fut is None or fut.done():
                continue
            if isinstance(res, DirectAcked):
                fut.set_result(
                    {"msg_id": res.msg_id, "to": res.to, "acked": True, "attempts": res.attempts}
                )
            else:
                fut.set_exception(
                    DeadlineExceeded(
                        f"message {res.msg_id} to {res.to[:12]} not acknowledged"
                        f" ({res.reason}, {res.attempts} attempts)"
                    )
                )
        room = self.inbox_max - self.inbox.count() if self.direct.inbox() else 0
        if room > 0:
            self.inbox.add(self.direct.drain_inbox(room))

    def next_deadline(self) -> int | None:
        """The core's next retransmission or expiry."""
        return self.direct.next_deadline()

    def handle_timer(self, now_ms: int) -> None:
        """Retransmit and expire messages."""
        self.direct.handle_timer(now_ms)

    def close(self) -> None:
        """Fail pending sends and close the inbox."""
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(DeadlineExceeded("the node is shutting down"))
        for ping, _ in self._pings.values():
            if not ping.done():
                ping.cancel()
        self.inbox.close()
