"""The daemon's pump: frames in, output out, timers, group commit.

A mixin of :class:`~hivemesh.runtime.daemon.Daemon` (the wiring, start and
stop live there; the attributes declared below are set there). The pump
moves bytes and time between the channels and the sans-IO
:class:`~hivemesh.core.peer.Peer`, and carries out its effects:

* **Input.** Frames reach :meth:`Pump._on_frames_now` straight from a
  channel's read callback while that link's reader is idle and nothing
  waits in the pump (no task woken per read); otherwise the link's reader
  task hands them to :meth:`Pump._on_frames`, in order behind what is
  queued (see :mod:`hivemesh.runtime.connections`).
* **Output.** After every input :meth:`Pump.flush` carries out
  ``peer.effects()``: frames into the peers' send queues, events to
  subscribers, dials, closes, replies to waiting callers. The
  inline path never waits: a frame the connection manager cannot take at
  once (a full send queue, no link yet, a handover) goes to ``_unsent``,
  and a flush task sends it (and everything after it, in order) through
  :meth:`ConnectionManager.send`, waiting for room -- the backpressure
  reaches the readers, since inline input is declined while anything is
  unsent.
* **Group commit.** Batches received from peers, our own logged appends and
  attested runs' signature checks are committed together at most
  ``commit_delay_ms`` after the first of them (:meth:`Pump._group_commit`:
  ``peer.settle``, whose ``Fsync`` effect syncs the store).
* **Time.** One timer task sleeps until the Peer's deadline; it also polls
  ``trust.json`` for edits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from typing import Any

from hivemesh.config import Config
from hivemesh.core.effects import (
    Close,
    Count,
    Deliver,
    Dial,
    Effect,
    Fsync,
    Handle,
    LeaseLog,
    LeaseSync,
    Log,
    Persist,
    Redeem,
    Reply,
    SaveVoters,
    Send,
    TrustEdit,
)
from hivemesh.core.frames import FrameType
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node
from hivemesh.core.peer import Peer
from hivemesh.error_codes import error_class
from hivemesh.errors import HivemeshError, LocalProtocolError
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.status import Subscription
from hivemesh.runtime.supervise import Supervisor
from hivemesh.trust import TrustStore

__all__ = ["Pump"]

#: Byte 2 of an encoded EVENTS frame (msgpack ``[version, type, ...]``).
_EVENTS_TYPE_BYTE = bytes([FrameType.EVENTS])
_RT_JOIN_TYPE_BYTE = bytes([FrameType.RT_JOIN])

log = logging.getLogger("hivemesh.runtime")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


class Pump:
    """Input, output, timers and the group commit of a daemon (module docs)."""

    config: Config
    identity: Identity
    peer: Peer
    node: Node
    conns: ConnectionManager
    messaging: Messaging
    invites: Invites
    trust: TrustStore
    counters: Counter[str]
    _store: Any
    _subs: list[Subscription]
    supervisor: Supervisor
    _ready: asyncio.Event
    _wake: asyncio.Event
    _flush_lock: asyncio.Lock
    _unsent: deque[tuple[str, bytes]]
    _armed_ms: int
    _started: bool
    _flush_scheduled: bool
    _commit_timer: asyncio.TimerHandle | None
    _calls: dict[int, asyncio.Future[Any]]
    voter_disk: Any

    async def _on_peer(self, peer: str, up: bool) -> None:  # pragma: no cover - the Daemon's
        raise NotImplementedError

    def sync_trust(self) -> bool:  # pragma: no cover - the Daemon's
        raise NotImplementedError

    def learn(self, address: str, endpoints: list[str]) -> None:  # pragma: no cover
        raise NotImplementedError

    async def _on_frame(self, peer: str, frame: bytes) -> None:
        await self._ready.wait()
        self.peer.receive(peer, frame, now_ms())
        await self.flush()

    async def _on_frames(self, peer: str, frames: list[bytes]) -> None:
        """A batch of frames read from ``peer`` at once: handle them all, then
        flush once (outputs wait at most one batch, 64 frames)."""
        await self._ready.wait()
        receive = self.peer.receive
        only_events = True
        for frame in frames:
            only_events = only_events and frame[2:3] == _EVENTS_TYPE_BYTE
            receive(peer, frame, now_ms())
        await self.flush(deadlines=not only_events)

    def _on_frames_now(self, peer: str, frames: list[bytes]) -> bool:
        """:meth:`_on_frames` inline from the channel's read callback, when
        nothing could make it wait (else False: the reader task takes them)."""
        if self._flush_lock.locked() or self._unsent or not self._ready.is_set():
            return False
        self._flush_now(deadlines=not self._receive_all(peer, frames))
        return True

    def _receive_all(self, peer: str, frames: list[bytes]) -> bool:
        """Hand ``frames`` to the Peer; True if all were EVENTS frames."""
        only_events = all(frame[2:3] == _EVENTS_TYPE_BYTE for frame in frames)
        self.peer.receive_many(peer, frames, now_ms())
        return only_events

    def disconnect_later(self, peer: str, reason: str, error: HivemeshError | None = None) -> None:
        """Close the channel to ``peer`` from synchronous code (the peer's CLOSE
        carries ``error``'s code)."""
        self.supervisor.spawn_once("disconnect", self.conns.disconnect(peer, reason, error=error))

    async def flush(self, *, deadlines: bool = True) -> None:
        """Drain the core's outbox and events (see module docs).

        ``deadlines=False`` (a flush after EVENTS frames only) skips looking
        for a new earlier timer unless the flush sent something: applying
        pushed events moves no deadline earlier, and a gap's pull sends a WANT.
        """
        async with self._flush_lock:
            sent = self._drain()
            unsent = self._unsent
            while unsent:  # a send queue was full: wait for room, in order
                peer, frame = unsent.popleft()
                await self.conns.send(peer, frame)
                if not unsent:
                    sent = self._drain() or sent
        self._after_flush(deadlines or sent)

    def _flush_now(self, *, deadlines: bool) -> None:
        """:meth:`flush` without waiting: what cannot be sent at once is left
        in ``_unsent`` for a flush task (scheduled here) to send in order."""
        sent = self._drain()
        if self._unsent:
            self._schedule_flush()
        self._after_flush(deadlines or sent)

    def _drain(self, *, queue: bool = False) -> bool:
        """Carry out the Peer's effects: frames to the send queues (or, once
        one is full, to ``_unsent``; every frame with ``queue``, for a flush
        that waits for room to send in order), events to subscribers, the rest
        by kind (:meth:`_execute`); True if it sent."""
        sent = False
        unsent = self._unsent
        send_fast = self.conns.send_fast
        peer_fx = self.peer.effects
        while True:
            fx = peer_fx()
            if not fx:
                break
            for e in fx:
                if type(e) is Send:
                    sent = True
                    peer, frame = e.peer, e.frame
                    if queue or unsent or not send_fast(peer, frame):
                        unsent.append((peer, frame))
                else:
                    self._execute(e)
        self._group_commit()
        return sent

    def _execute(self, e: Effect) -> None:
        """Carry out one effect other than :class:`Send`."""
        if isinstance(e, Deliver):
            for sub in self._subs:
                for ev in e.events:
                    sub.offer(ev)
        elif isinstance(e, Count):
            self.counters[e.name] += e.n
        elif isinstance(e, Dial):
            self.learn(e.address, list(e.endpoints))
        elif isinstance(e, Close):
            if e.forget:
                self.conns.forget(e.peer)
            if e.if_silent_ms is not None:
                self.conns.drop_if_silent(e.peer, e.if_silent_ms / 1000)
            else:  # the peer's CLOSE carries the code
                error = None if e.code is None else error_class(e.code)(e.reason)
                self.disconnect_later(e.peer, e.reason, error)
        elif isinstance(e, Redeem):
            self.invites.redeem(e)
        elif isinstance(e, TrustEdit):
            self.invites.edit(e)
        elif isinstance(e, Reply):
            fut = self._calls.pop(e.rid, None)
            if fut is not None and not fut.done():
                if e.error is not None:
                    fut.set_exception(e.error)
                else:
                    fut.set_result(e.value)
        elif isinstance(e, Persist):
            self.messaging.persist(e)
        elif isinstance(e, Handle):
            self.messaging.handle(e)
        elif isinstance(e, LeaseLog):
            self.voter_disk.write(e.resource, e.bound, e.max_ttl_ms)
        elif isinstance(e, LeaseSync):
            self.voter_disk.sync_soon(e.upto)
        elif isinstance(e, SaveVoters):
            self.voter_disk.save_voters(e.voters)
        elif isinstance(e, Log):
            log.log(_LEVELS.get(e.level, logging.WARNING), "%s", e.message)
        elif isinstance(e, Fsync):
            # the group commit's write: a store error is counted and retried,
            # anything else (a bug) ends the node (runtime.daemon's task table)
            self.supervisor.guard("group_commit", self._fsync, fatal=True)()

    def _fsync(self) -> None:
        try:
            self._store.sync()
        except HivemeshError:  # disk full, I/O error: retried at the next commit
            self.counters["group_commit_failed"] += 1
            log.exception("group commit failed")

    def call(self, cmd: Any) -> asyncio.Future[Any]:
        """Run a Peer command now; the future resolves with its reply (the
        next flush carries it out)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[self.peer.command(cmd, now_ms())] = fut
        self._carry_out()  # lease frames leave now (latency)
        return fut

    def call_now(self, cmd: Any) -> Any:
        """Run a Peer command that the Peer answers at once (a local append);
        its reply's value, or its error raised."""
        fut = self.call(cmd)
        if not fut.done():  # a bug: the command waits for an input
            raise LocalProtocolError(f"{type(cmd).__name__} is not answered at once")
        return fut.result()

    def _carry_out(self) -> None:
        """Carry out the Peer's effects now; while a flush waits for room,
        its frames queue behind that flush's (the order of sends holds)."""
        if self._flush_lock.locked():
            self._drain(queue=True)
            self._schedule_flush()
        else:
            self._flush_now(deadlines=True)

    def _after_flush(self, deadlines: bool) -> None:
        if self._started and deadlines and self._next_deadline() < self._armed_ms:
            self._wake.set()

    def _group_commit(self) -> None:
        """Commit batches received from peers and our own logged appends at
        most ``commit_delay_ms`` after the first of them (one commit for many
        frames; see the store's module docs)."""
        if (self._store.pending or self.node.journal.unsettled) and self._commit_timer is None:
            self._commit_timer = asyncio.get_running_loop().call_later(
                self.config.commit_delay_ms / 1000,
                # a store error is counted and retried; anything else ends the node
                self.supervisor.guard("group_commit", self._commit_group, fatal=True),
            )

    def _commit_group(self) -> None:
        self._commit_timer = None
        if not self._started:
            return  # stop() closes the store, which commits
        try:
            self.peer.settle(now_ms())  # verify attested runs, store them; then Fsync
        except HivemeshError:  # disk full, I/O error: retried at the next commit
            self.counters["group_commit_failed"] += 1
            log.exception("group commit failed")
        if self._flush_lock.locked():  # a flush waits for room: the Fsync goes after it
            self._schedule_flush()
        else:
            self._flush_now(deadlines=False)  # the Fsync (and any Close) now

    async def _timer_loop(self) -> None:
        while self._started:
            self.supervisor.beat("timer")  # a round that hangs is reported (runtime.supervise)
            t = now_ms()
            self.peer.handle_timer(t)
            self.sync_trust()  # trust.json edited: the Peer rechecks whom it admits
            await self.flush()
            self._wake.clear()
            self._armed_ms = min(self._next_deadline(), now_ms() + 1000)
            delay_s = max(0.0, (self._armed_ms - now_ms()) / 1000)
            try:
                async with asyncio.timeout(delay_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _next_deadline(self) -> int:
        return self.peer.next_deadline()

    def _schedule_flush(self) -> None:
        """Flush soon from a synchronous caller (coalesced into one task)."""
        if self._flush_scheduled or not self._started:
            return
        self._flush_scheduled = True

        async def run() -> None:
            self._flush_scheduled = False
            await self.flush()

        self.supervisor.spawn_once("flush", run())
