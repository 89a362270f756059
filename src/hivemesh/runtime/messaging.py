"""Direct messages, the durable inbox and ``ping``, wired for the daemon.

Theory of operation
-------------------
The protocol is :class:`hivemesh.core.direct.Direct` (sans-IO: retries,
acks, dedup, one-hop relay), owned and timed by the node's
:class:`~hivemesh.core.peer.Peer`. This module adds what needs I/O:

* **Futures for senders.** :meth:`Messaging.send` returns an asyncio future
  resolved from the Peer's ``MessageOutcome`` effects (acked or failed at
  its deadline; :meth:`Messaging.outcome`).
* **A durable inbox.** After every input, messages the core accepted are
  moved into ``inbox.db`` (SQLite, WAL, ``synchronous=NORMAL``: a commit
  survives ``kill -9``), so the inbox survives restarts. The core withholds
  each ack until that commit (``DirectConfig.ack_when_stored``): a sender
  hears "delivered" only for a message in ``inbox.db``. When the durable
  inbox holds ``inbox_max`` messages, or every handler slot is busy,
  messages wait unacknowledged in the core's bounded inbox and the senders
  retry -- backpressure, not loss. A failed commit releases the messages
  unacknowledged (counted ``inbox_store_failed``): their retransmissions are
  taken anew.
* **Request/reply.** A message ``{"$type": t, "body": b}`` for which the
  receiver registered a handler (:meth:`Messaging.on_message`) bypasses the
  inbox: the handler's result travels back as a direct message
  ``{"$reply_to": msg_id, "body": result}``, which resolves the sender's
  :func:`request` future (also bypassing the inbox). At most
  :data:`MAX_HANDLERS` handlers run at once; beyond that messages wait in the
  core's bounded inbox (backpressure: they are not acknowledged meanwhile).
  A request of a kind nobody here handles is answered at once with
  ``{"$reply_to": msg_id, "error": {"code": "no_handler", ...}}`` (counted
  ``no_handler``), which the requester raises as
  :class:`~hivemesh.errors.NoHandler` instead of waiting out its deadline.
  Used by telemetry (records to ``metrics-collector``, the collector's ack
  dict as the reply). A plain message ``{"type": t, ...}`` for which a
  handler was registered with :meth:`Messaging.on_plain` (telemetry
  ``{"type": "metrics", ...}`` sent to the collector's *address*)
  goes to that handler instead of the inbox; no reply is sent, and the ack
  waits until the handler is done (a handler that fails releases it
  unacknowledged, so the sender retries).
* **Ping.** ``RT_PING``/``RT_PONG`` frames carry a nonce; the round-trip
  time is measured on the sender (``perf_counter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.core.codec import pack, unpack
from hivemesh.core.direct import InboxMessage
from hivemesh.core.effects import MessageOutcome
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.peer import Peer
from hivemesh.errors import (
    DeadlineExceeded,
    DecodeError,
    HivemeshError,
    NoHandler,
    RemoteProtocolError,
    StoreError,
    UnknownPeer,
)
from hivemesh.stores.private import create_private

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "MAX_HANDLERS",
    "RT_PING",
    "RT_PONG",
    "Handler",
    "Inbox",
    "Messaging",
    "ping",
    "request",
    "send_direct",
]

#: Concurrent request handlers.
MAX_HANDLERS = 256
#: ``handler(sender_address, body) -> reply`` for a request type.
Handler = Callable[[str, Any], Awaitable[Any]]

#: Runtime frame types (outside the core table's ranges; see core.frames).
RT_PING = int(FrameType.RT_PING)
RT_PONG = int(FrameType.RT_PONG)


class Inbox:
    """Received direct messages in SQLite, oldest first."""

    def __init__(self, path: Path) -> None:
        try:
            create_private(path)  # 0600, and so its -wal and -shm
            self.db = sqlite3.connect(str(path), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS inbox (n INTEGER PRIMARY KEY AUTOINCREMENT,"
                " sender TEXT NOT NULL, msg_id TEXT NOT NULL, data BLOB NOT NULL,"
                " received_ms INTEGER NOT NULL, relayed_by TEXT, UNIQUE (sender, msg_id))"
            )
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{path}: cannot open the inbox: {exc}") from None

    def count(self) -> int:
        """Messages held."""
        return int(self.db.execute("SELECT count(*) FROM inbox").fetchone()[0])

    def add(self, messages: list[InboxMessage]) -> int:
        """Store messages in one commit (a duplicate ``(sender, msg_id)`` is
        ignored); raises :class:`StoreError` with nothing stored."""
        with contextlib.closing(self.db.cursor()) as cur:
            try:
                cur.execute("BEGIN")
                for m in messages:
                    cur.execute(
                        "INSERT OR IGNORE INTO inbox (sender, msg_id, data, received_ms,"
                        " relayed_by) VALUES (?, ?, ?, ?, ?)",
                        (m.sender, m.msg_id, pack(m.data), m.received_ms, m.relayed_by),
                    )
                cur.execute("COMMIT")
            except sqlite3.Error as exc:
                if self.db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                raise StoreError(f"inbox write failed: {exc}") from None
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

    def __init__(self, peer: Peer, rng: random.Random, inbox_path: Path, *, inbox_max: int) -> None:
        node = self.node = peer.node
        self.rng = rng
        self.inbox_max = inbox_max
        self.direct = peer.direct  # its config: DirectConfig(ack_when_stored=True)
        self.inbox = Inbox(inbox_path)
        self.counters: Counter[str] = Counter()
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._pings: dict[int, tuple[asyncio.Future[float], int]] = {}
        self.handlers: dict[str, Handler] = {}
        self.plain_handlers: dict[str, Handler] = {}
        self._replies: dict[str, tuple[str, asyncio.Future[Any]]] = {}
        self._handling: set[asyncio.Task[None]] = set()
        #: Called after sending from a task (the daemon schedules a flush).
        self.on_output: Callable[[], None] | None = None
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

    def on_message(self, kind: str, handler: Handler) -> None:
        """Answer requests of ``kind`` with ``handler`` (instead of the inbox)."""
        self.handlers[kind] = handler

    def on_plain(self, kind: str, handler: Handler) -> None:
        """Give plain messages ``{"type": kind, ...}`` to ``handler`` (its result is dropped)."""
        self.plain_handlers[kind] = handler

    def expect_reply(
        self, to: str, now_ms: int, kind: str, body: Any, timeout_ms: int
    ) -> tuple[str, asyncio.Future[dict[str, Any]], asyncio.Future[Any]]:
        """Send a request; returns (msg_id, ack future, reply future)."""
        data = {"$type": kind, "body": body}
        msg_id = self.direct.send(to, data, now_ms, deadline_ms=timeout_ms)
        loop = asyncio.get_running_loop()
        ack: asyncio.Future[dict[str, Any]] = loop.create_future()
        reply: asyncio.Future[Any] = loop.create_future()
        self._waiters[msg_id] = ack
        self._replies[msg_id] = (to, reply)
        return msg_id, ack, reply

    def forget_reply(self, msg_id: str) -> None:
        """Stop waiting for the reply to ``msg_id``."""
        self._replies.pop(msg_id, None)

    def _route(self, messages: list[InboxMessage]) -> tuple[list[InboxMessage], set[int]]:
        """Handle replies and requests; return the messages for the inbox and
        the ids of those a plain handler acknowledges when it is done."""
        keep = []
        later: set[int] = set()
        for m in messages:
            data = m.data
            if isinstance(data, dict) and isinstance(data.get("$reply_to"), str):
                got = self._replies.pop(data["$reply_to"], None)
                if got is None or got[0] != m.sender:
                    self.counters["stale_reply"] += 1
                elif not got[1].done() and isinstance(data.get("error"), dict):
                    got[1].set_exception(_reply_error(m.sender, data["error"]))
                elif not got[1].done():
                    got[1].set_result(data.get("body"))
                continue
            kind = data.get("$type") if isinstance(data, dict) else None
            handler = self.handlers.get(kind) if isinstance(kind, str) else None
            if isinstance(kind, str) and handler is None:  # answer now: no one will
                self.counters["no_handler"] += 1
                message = f"{self.node.address[:12]} serves no {kind[:40]!r} requests"
                self._reply(m, {"error": {"code": NoHandler.code, "message": message}})
                continue
            plain = data.get("type") if handler is None and isinstance(data, dict) else None
            if isinstance(plain, str) and plain in self.plain_handlers:
                coro = self.plain_handlers[plain](m.sender, data)
                task = asyncio.get_running_loop().create_task(self._consume(coro, m))
                self._handling.add(task)
                task.add_done_callback(self._handling.discard)
                later.add(id(m))
                continue
            if handler is None:
                keep.append(m)
                continue
            task = asyncio.get_running_loop().create_task(self._answer(handler, m))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)
        return keep, later

    async def _consume(self, coro: Awaitable[Any], m: InboxMessage) -> None:
        """Run a plain handler; ack its message once it is done (released
        unacked if it failed, so the sender retries)."""
        try:
            await coro
        except Exception:  # counted; a plain message has no one to answer
            self.counters["handler_failed"] += 1
            self.direct.release([m])
        else:
            self.direct.stored([m])
        if self.on_output is not None:
            self.on_output()

    async def _answer(self, handler: Handler, m: InboxMessage) -> None:
        try:
            reply = await handler(m.sender, m.data.get("body"))
        except Exception as exc:  # the handler's failure is the requester's answer
            self.counters["handler_failed"] += 1
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self._reply(m, {"body": reply})

    def _reply(self, m: InboxMessage, fields: dict[str, Any]) -> None:
        try:
            self.direct.send(m.sender, {"$reply_to": m.msg_id, **fields}, _now_ms())
        except HivemeshError as exc:
            self.counters[f"reply_refused_{exc.code}"] += 1
        if self.on_output is not None:
            self.on_output()

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

    def outcome(self, res: MessageOutcome) -> None:
        """A message was acknowledged or failed: resolve its sender's future."""
        fut = self._waiters.pop(res.msg_id, None)
        if fut is None and not res.acked:
            self.counters["reply_failed"] += 1  # replies are the only untracked sends
        if fut is None or fut.done():
            return
        if res.acked:
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

    def after_input(self) -> None:
        """Move messages the core accepted into the durable inbox (or to handlers)."""
        if not self.direct.inbox() or len(self._handling) >= MAX_HANDLERS:
            return
        room = self.inbox_max - self.inbox.count()
        if room > 0:
            taken = self.direct.drain_inbox(room)
            keep, later = self._route(taken)
            try:
                if keep:
                    self.inbox.add(keep)
            except StoreError:  # disk full, I/O error: not stored, so not acked
                self.counters["inbox_store_failed"] += 1
                self.direct.release(keep)
                later |= {id(m) for m in keep}
            self.direct.stored([m for m in taken if id(m) not in later])

    def close(self) -> None:
        """Fail pending sends and close the inbox."""
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(DeadlineExceeded("the node is shutting down"))
        for ping, _ in self._pings.values():
            if not ping.done():
                ping.cancel()
        for _to, reply in self._replies.values():
            if not reply.done():
                reply.set_exception(DeadlineExceeded("the node is shutting down"))
        for task in self._handling:
            task.cancel()
        self.inbox.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _reply_error(sender: str, err: dict[str, Any]) -> HivemeshError:
    """The typed error a request's error reply stands for (peer text, bounded)."""
    text = f"{sender[:12]}: {str(err.get('message', ''))[:200]}"
    return NoHandler(text) if err.get("code") == NoHandler.code else RemoteProtocolError(text)


async def send_direct(d: Daemon, to: str, data: Any, *, timeout_s: float) -> dict[str, Any]:
    """Send through ``d`` and wait for the acknowledgement (see Daemon.send_direct)."""
    address = d.resolve(to)
    t0 = time.perf_counter()
    fut = d.messaging.send(address, data, _now_ms(), int(timeout_s * 1000))
    await d.flush()
    result = await fut
    result["rtt_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    return result


async def request(d: Daemon, to: str, kind: str, body: Any, *, timeout_s: float) -> Any:
    """Send a request of ``kind`` and return the handler's reply (see module docs)."""
    address = d.resolve(to)
    deadline = time.perf_counter() + timeout_s
    msg_id, ack, reply = d.messaging.expect_reply(
        address, _now_ms(), kind, body, int(timeout_s * 1000)
    )
    await d.flush()
    try:
        await ack
        async with asyncio.timeout(max(0.0, deadline - time.perf_counter())):
            return await reply
    except TimeoutError:
        raise DeadlineExceeded(f"no reply from {address[:12]} in {timeout_s}s") from None
    finally:
        d.messaging.forget_reply(msg_id)


async def ping(d: Daemon, target: str, *, timeout_s: float) -> dict[str, Any]:
    """Ping a connected peer of ``d`` (see Daemon.ping)."""
    address = d.resolve(target)
    if address not in d.conns.links:
        st = d.peer.member_state(address)
        state = "unknown" if st is None else st.value
        raise UnknownPeer(f"no channel to {address[:12]} (state: {state})")
    t0 = time.perf_counter()
    nonce, fut = d.messaging.ping(address, _now_ms())
    await d.flush()
    try:
        async with asyncio.timeout(timeout_s):
            await fut
            rtt = round((time.perf_counter() - t0) * 1000, 3)
    except TimeoutError:
        d.messaging.forget_ping(nonce)
        raise DeadlineExceeded(f"no pong from {address[:12]} in {timeout_s}s") from None
    return {"address": address, "rtt_ms": rtt}
