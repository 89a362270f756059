"""What a node does with the direct messages it receives, and its requests.

Theory of operation
-------------------
The protocol is :class:`~hivemesh.core.direct.Direct` (retries, acks, dedup,
relay); with ``ack_when_stored`` it withholds each ack until the node says
the message is safe. A :class:`Mailbox` (part of the
:class:`~hivemesh.core.peer.Peer`) decides where each accepted message goes,
after every input:

* a **reply** ``{"$reply_to": id, "body" | "error"}`` answers our request
  ``id`` (from the address it was sent to; anything else is counted
  ``stale_reply``) and is acked at once;
* a **request** ``{"$type": kind, "body": b}`` of a kind the driver serves
  (:meth:`Mailbox.serve`) becomes a :class:`~hivemesh.core.effects.Handle`
  effect and is acked at once; the driver runs its handler and reports with
  :meth:`Peer.handled`, whose result travels back as a reply. A kind nobody
  serves is answered at once with ``{"error": {"code": "no_handler"}}``
  (counted ``no_handler``);
* a **plain** message ``{"type": kind, ...}`` of a kind the driver serves as
  plain is a ``Handle`` too, acked only when the handler succeeded
  (released unacked when it failed: the sender retries);
* anything else goes to the durable inbox: a
  :class:`~hivemesh.core.effects.Persist` effect, acked when the driver
  reports it stored (:meth:`Peer.persisted`), released unacked when that
  failed (counted ``inbox_store_failed``).

Backpressure, not loss: messages wait unacknowledged in the core's bounded
inbox while the durable inbox has no room (the driver says how much it has:
:meth:`Peer.inbox_room`) or :data:`MAX_HANDLERS` handlers run.

A request we make (``Request`` command) is answered by its reply, or fails:
the message was not acknowledged, or no reply came by its deadline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from hivemesh.core.direct import Direct, InboxMessage
from hivemesh.core.effects import Effect, Handle, Persist, Reply
from hivemesh.errors import DeadlineExceeded, HivemeshError, NoHandler, RemoteProtocolError

__all__ = ["MAX_HANDLERS", "Mailbox"]

#: Handlers the driver may run at once.
MAX_HANDLERS = 256


@dataclass(slots=True)
class _Request:
    rid: int
    to: str
    deadline_ms: int
    timeout_ms: int


class Mailbox:
    """Routing of received direct messages, and our requests (module docs)."""

    def __init__(self, direct: Direct, address: str) -> None:
        self.direct = direct
        self.address = address
        self.counters: Counter[str] = Counter()
        self.served: set[str] = set()
        self.served_plain: set[str] = set()
        self.room = 0  # the durable inbox's, as the driver last said, minus what is out
        self._requests: dict[str, _Request] = {}  # msg_id -> our request
        self._persisting: dict[int, list[InboxMessage]] = {}
        self._handling: dict[int, tuple[InboxMessage, bool]] = {}  # key -> (message, plain)
        self._next = 0

    def serve(self, kind: str, *, plain: bool) -> None:
        """The driver answers requests (or plain messages) of ``kind``."""
        (self.served_plain if plain else self.served).add(kind)

    # -- requests we make -----------------------------------------------------------

    def request(
        self, rid: int, to: str, kind: str, body: Any, timeout_ms: int, now_ms: int
    ) -> None:
        """Send request ``rid``; answered by :meth:`route` or :meth:`expire`."""
        msg_id = self.direct.send(to, {"$type": kind, "body": body}, now_ms, deadline_ms=timeout_ms)
        self._requests[msg_id] = _Request(rid, to, now_ms + timeout_ms, timeout_ms)

    def unacked(self, msg_id: str) -> list[Effect]:
        """Message ``msg_id`` failed: if it was a request, that fails it."""
        req = self._requests.pop(msg_id, None)
        if req is None:
            return []
        err = DeadlineExceeded(f"request to {req.to[:12]} not acknowledged")
        return [Reply(req.rid, error=err)]

    def next_deadline(self) -> int | None:
        """The earliest deadline of a request waiting for its reply."""
        if not self._requests:
            return None
        return min(r.deadline_ms for r in self._requests.values())

    def expire(self, now_ms: int) -> list[Effect]:
        """Fail the requests whose reply did not come in time."""
        out: list[Effect] = []
        for msg_id in sorted(self._requests):
            req = self._requests[msg_id]
            if req.deadline_ms <= now_ms:
                del self._requests[msg_id]
                err = DeadlineExceeded(f"no reply from {req.to[:12]} in {req.timeout_ms / 1000}s")
                out.append(Reply(req.rid, error=err))
        return out

    # -- messages we receive ------------------------------------------------------------

    def route(self, now_ms: int) -> list[Effect]:
        """Take what the core accepted, as far as there is room (module docs)."""
        direct = self.direct
        if not direct.inbox() or len(self._handling) >= MAX_HANDLERS or self.room <= 0:
            return []
        out: list[Effect] = []
        taken = direct.drain_inbox(self.room)
        now: list[InboxMessage] = []
        keep: list[InboxMessage] = []
        for m in taken:
            data = m.data
            reply_to = data.get("$reply_to") if isinstance(data, dict) else None
            if isinstance(reply_to, str):
                out += self._on_reply(m, reply_to, data)
                now.append(m)
                continue
            kind = data.get("$type") if isinstance(data, dict) else None
            if isinstance(kind, str):
                now.append(m)
                if kind not in self.served:
                    self.counters["no_handler"] += 1
                    text = f"{self.address[:12]} serves no {kind[:40]!r} requests"
                    self._reply(m, {"error": {"code": NoHandler.code, "message": text}}, now_ms)
                    continue
                key = self._key()
                self._handling[key] = (m, False)
                out.append(Handle(key, m.sender, m.msg_id, kind, data.get("body"), plain=False))
                continue
            plain = data.get("type") if isinstance(data, dict) else None
            if isinstance(plain, str) and plain in self.served_plain:
                key = self._key()
                self._handling[key] = (m, True)
                out.append(Handle(key, m.sender, m.msg_id, plain, data, plain=True))
                continue
            keep.append(m)
        direct.stored(now)
        if keep:
            self.room -= len(keep)
            batch = self._key()
            self._persisting[batch] = keep
            out.append(Persist(batch, tuple(keep)))
        return out

    def persisted(self, batch: int, ok: bool) -> None:
        """The driver stored ``batch`` (ack it) or could not (release it)."""
        msgs = self._persisting.pop(batch, None)
        if msgs is None:
            return
        if ok:
            self.direct.stored(msgs)
        else:
            self.counters["inbox_store_failed"] += 1
            self.room += len(msgs)
            self.direct.release(msgs)

    def handled(self, key: int, reply: Any, error: str | None, now_ms: int) -> None:
        """The driver's handler for :class:`Handle` ``key`` finished: answer a
        request with ``reply`` (or ``error``), ack a plain message (release it
        when the handler failed)."""
        got = self._handling.pop(key, None)
        if got is None:
            return
        m, plain = got
        if error is not None:
            self.counters["handler_failed"] += 1
        if plain:
            (self.direct.release if error is not None else self.direct.stored)([m])
            return
        body = {"ok": False, "error": error} if error is not None else reply
        self._reply(m, {"body": body}, now_ms)

    # -- helpers ------------------------------------------------------------------------

    def _key(self) -> int:
        self._next += 1
        return self._next

    def _on_reply(self, m: InboxMessage, reply_to: str, data: dict[str, Any]) -> list[Effect]:
        req = self._requests.get(reply_to)
        if req is None or req.to != m.sender:
            self.counters["stale_reply"] += 1
            return []
        del self._requests[reply_to]
        err = data.get("error")
        if isinstance(err, dict):
            text = f"{m.sender[:12]}: {str(err.get('message', ''))[:200]}"
            error: HivemeshError = (
                NoHandler(text) if err.get("code") == NoHandler.code else RemoteProtocolError(text)
            )
            return [Reply(req.rid, error=error)]
        return [Reply(req.rid, data.get("body"))]

    def _reply(self, m: InboxMessage, fields: dict[str, Any], now_ms: int) -> None:
        try:
            self.direct.send(m.sender, {"$reply_to": m.msg_id, **fields}, now_ms)
        except HivemeshError as exc:
            self.counters[f"reply_refused_{exc.code}"] += 1
