"""Direct messages for the daemon: the durable inbox, handlers, ping.

Theory of operation
-------------------
The protocol (:class:`hivemesh.core.direct.Direct`: retries, acks, dedup,
relay) and the rules for what arrives (:mod:`hivemesh.core.mailbox`:
replies, requests, plain messages, the inbox; acks withheld until a message
is stored) belong to the node's :class:`~hivemesh.core.peer.Peer`. This
module does their I/O:

* **The durable inbox.** A ``Persist`` effect's messages go into
  ``inbox.db`` (:class:`hivemesh.stores.inbox.Inbox`) in one commit, then
  ``peer.persisted`` (ok or not: a failed
  commit releases them unacknowledged, and their retransmissions are taken
  anew). The Peer is told how much room the inbox has (``inbox_max``) at
  start and whenever messages are taken out; with none, messages wait
  unacknowledged in the core and the senders retry -- backpressure, not loss.
* **Handlers.** :meth:`Messaging.on_message` serves requests ``{"$type":
  kind, "body": b}`` with an async handler whose result travels back as the
  reply (a failure as ``{"ok": False, "error": ...}``);
  :meth:`Messaging.on_plain` serves plain messages ``{"type": kind, ...}``
  (acknowledged once the handler returned; released when it failed, so the
  sender retries). A ``Handle`` effect runs one; ``peer.handled`` reports it.
  Used by telemetry (records to ``metrics-collector``).
* **Senders** are the Peer's commands (``Send``, ``Request``, ``Ping``),
  which the daemon runs and waits for.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.commands.peer import Serve
from hivemesh.core.effects import Handle, Persist
from hivemesh.errors import StoreError
from hivemesh.runtime.clock import now_ms as _now_ms
from hivemesh.stores.inbox import Inbox

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["Handler", "Messaging"]

#: ``handler(sender_address, body) -> reply`` for a request type.
Handler = Callable[[str, Any], Awaitable[Any]]


class Messaging:
    """One daemon's durable inbox and message handlers (see module docs)."""

    def __init__(self, daemon: Daemon, inbox_path: Path, *, inbox_max: int) -> None:
        self.d = daemon
        self.inbox_max = inbox_max
        self.inbox = Inbox(inbox_path, on_removed=self._room_changed)
        self.counters: Counter[str] = Counter()
        self.handlers: dict[str, Handler] = {}
        self.plain_handlers: dict[str, Handler] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self._room_changed()

    def _room_changed(self) -> None:
        self.d.peer.inbox_room(max(0, self.inbox_max - self.inbox.count()), _now_ms())
        self.d._schedule_flush()

    def on_message(self, kind: str, handler: Handler) -> None:
        """Answer requests of ``kind`` with ``handler`` (instead of the inbox)."""
        self.handlers[kind] = handler
        self.d.peer.command(Serve(kind), _now_ms())

    def on_plain(self, kind: str, handler: Handler) -> None:
        """Give plain messages ``{"type": kind, ...}`` to ``handler`` (its result is dropped)."""
        self.plain_handlers[kind] = handler
        self.d.peer.command(Serve(kind, plain=True), _now_ms())

    def persist(self, e: Persist) -> None:
        """Carry out a ``Persist`` effect: one commit, then tell the Peer."""
        try:
            self.inbox.add(list(e.messages))
            ok = True
        except StoreError:  # disk full, I/O error: not stored, so not acked
            ok = False
        self.d.peer.persisted(e.batch, ok, _now_ms())

    def handle(self, e: Handle) -> None:
        """Carry out a ``Handle`` effect: run the handler in a task."""
        handler = (self.plain_handlers if e.plain else self.handlers).get(e.kind)
        # a handler's failure is its requester's answer; anything escaping
        # that (a bug here) is logged and counted by the supervisor
        task = self.d.supervisor.watch("message_handler", self._run(handler, e))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _run(self, handler: Handler | None, e: Handle) -> None:
        reply: Any = None
        error: str | None = None
        try:
            if handler is None:
                raise LookupError(f"no handler for {e.kind!r}")
            reply = await handler(e.sender, e.data)
        except Exception as exc:  # the handler's failure is the requester's answer
            error = f"{type(exc).__name__}: {exc}"
        self.d.peer.handled(e.key, None if e.plain else reply, error, _now_ms())
        self.d._schedule_flush()

    def close(self) -> None:
        """Stop the handlers and close the inbox."""
        for task in self._handling:
            task.cancel()
        self.inbox.close()
