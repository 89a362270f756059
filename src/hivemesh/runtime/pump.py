"""The daemon's pump: frames in, output out, timers, group commit.

A mixin of :class:`~hivemesh.runtime.daemon.Daemon` (the wiring, start and
stop live there; the attributes declared below are set there). The pump
moves bytes and time between the channels and the sans-IO core:

* **Input.** Frames reach :meth:`Pump._on_frames_now` straight from a
  channel's read callback while that link's reader is idle and nothing
  waits in the pump (no task woken per read); otherwise the link's reader
  task hands them to :meth:`Pump._on_frames`, in order behind what is
  queued (see :mod:`hivemesh.runtime.connections`).
* **Output.** After every input :meth:`Pump.flush` drains ``node.outbox()``
  into the peers' send queues and ``node.events()`` to subscribers. The
  inline path never waits: a frame the connection manager cannot take at
  once (a full send queue, no link yet, a handover) goes to ``_unsent``,
  and a flush task sends it (and everything after it, in order) through
  :meth:`ConnectionManager.send`, waiting for room -- the backpressure
  reaches the readers, since inline input is declined while anything is
  unsent.
* **Group commit.** Batches received from peers, our own logged appends and
  attested runs' signature checks are committed together at most
  ``commit_delay_ms`` after the first of them (:meth:`Pump._group_commit`).
* **Time.** One timer task sleeps until the earliest deadline of the core,
  membership, direct messages, blob fetches and invite probation.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from typing import Any

from hivemesh.config import Config
from hivemesh.core.event import Event
from hivemesh.core.frames import FrameType
from hivemesh.core.identity import Identity, address_of, short
from hivemesh.core.node import Node
from hivemesh.errors import HivemeshError
from hivemesh.runtime.blobs import Blobs
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.endpoints import KIND_HELLO, EndpointsView
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.members import MemberDriver
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.ownfeed import OwnFeedWatch
from hivemesh.runtime.status import Subscription
from hivemesh.runtime.supervise import Supervisor
from hivemesh.runtime.trustview import TrustView
from hivemesh.trust import TrustStore

__all__ = ["Pump"]

#: Byte 2 of an encoded EVENTS frame (msgpack ``[version, type, ...]``).
_EVENTS_TYPE_BYTE = bytes([FrameType.EVENTS])
_RT_JOIN_TYPE_BYTE = bytes([FrameType.RT_JOIN])

log = logging.getLogger("hivemesh.runtime")


class Pump:
    """Input, output, timers and the group commit of a daemon (module docs)."""

    config: Config
    identity: Identity
    node: Node
    conns: ConnectionManager
    members: MemberDriver
    messaging: Messaging
    blobs: Blobs
    invites: Invites
    endpoints: EndpointsView
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
    _trust_generation: int
    own_feed: OwnFeedWatch

    async def _on_peer(self, peer: str, up: bool) -> None:  # pragma: no cover - the Daemon's
        raise NotImplementedError

    async def _recheck_trust(self) -> None:  # pragma: no cover - the Daemon's
        raise NotImplementedError

    def learn(self, address: str, endpoints: list[str]) -> None:  # pragma: no cover
        raise NotImplementedError

    async def _on_frame(self, peer: str, frame: bytes) -> None:
        await self._ready.wait()
        t = now_ms()
        if peer in self.invites.probation:
            if self.invites.on_probation_frame(peer, frame, t):
                await self._on_peer(peer, True)
            return
        self.node.receive(peer, frame, t)
        await self.flush()

    async def _on_frames(self, peer: str, frames: list[bytes]) -> None:
        """A batch of frames read from ``peer`` at once: handle them all, then
        flush once (outputs wait at most one batch, 64 frames)."""
        await self._ready.wait()
        receive = self.node.receive
        only_events = True
        for frame in frames:
            if peer in self.invites.probation:
                await self._on_frame(peer, frame)
                continue
            only_events = only_events and frame[2:3] == _EVENTS_TYPE_BYTE
            receive(peer, frame, now_ms())
        await self.flush(deadlines=not only_events)

    def _on_frames_now(self, peer: str, frames: list[bytes]) -> bool:
        """:meth:`_on_frames` inline from the channel's read callback, when
        nothing could make it wait (else False: the reader task takes them)."""
        if (
            self._flush_lock.locked()
            or self._unsent
            or not self._ready.is_set()
            or peer in self.invites.probation
        ):
            return False
        self._flush_now(deadlines=not self._receive_all(peer, frames))
        return True

    def _receive_all(self, peer: str, frames: list[bytes]) -> bool:
        """Hand ``frames`` to the core; True if all were EVENTS frames."""
        receive = self.node.receive
        only_events = True
        for frame in frames:
            only_events = only_events and frame[2:3] == _EVENTS_TYPE_BYTE
            receive(peer, frame, now_ms())
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

    def _drain(self) -> bool:
        """Move the core's output to the send queues (or, once one is full,
        to ``_unsent``) and its events to subscribers; True if it sent."""
        sent = False
        node = self.node
        unsent = self._unsent
        send_fast = self.conns.send_fast
        awaiting = self.invites.awaiting  # inviters not admitting us yet: RT_JOIN only
        while True:
            t = now_ms()
            self.members.after_input(t)
            self.messaging.after_input()
            self.blobs.after_input()
            out = node.outbox()
            events = node.events()
            if not out and not events:
                break
            sent = sent or bool(out)
            for peer, frame in out:
                if awaiting and peer in awaiting and frame[2:3] != _RT_JOIN_TYPE_BYTE:
                    self.counters["dropped_before_admission"] += 1
                    continue
                if unsent or not send_fast(peer, frame):
                    unsent.append((peer, frame))
            for ev in events:
                self._dispatch(ev)
            if not node.has_output:  # handling them queued nothing new
                break
        self._group_commit()
        return sent

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
            for peer in self.node.settle():  # verify attested runs, then store them
                log.warning("%s sent an invalid head signature: disconnecting", short(peer))
                self.disconnect_later(peer, "invalid head signature")
            self._store.sync()
        except HivemeshError:  # disk full, I/O error: retried at the next commit
            self.counters["group_commit_failed"] += 1
            log.exception("group commit failed")

    def _dispatch(self, ev: Event) -> None:
        if ev.kind in TrustView.kinds and ev.author != self.identity.public:
            self.supervisor.spawn_once("trust_recheck", self._recheck_trust())
        if ev.kind == KIND_HELLO and ev.author != self.identity.public:
            addr = address_of(ev.author)
            self.learn(addr, self.endpoints.endpoints(addr))
        for sub in self._subs:
            sub.offer(ev)

    async def _timer_loop(self) -> None:
        while self._started:
            self.supervisor.beat("timer")  # a round that hangs is reported (runtime.supervise)
            t = now_ms()
            self.node.handle_timer(t)
            self.members.m.handle_timer(t)
            self.messaging.handle_timer(t)
            self.invites.expire(t)
            if self.trust.poll() != self._trust_generation:  # trust.json edited
                self._trust_generation = self.trust.generation
                await self._recheck_trust()
            self.blobs.handle_timer(t)
            self.own_feed.check()  # the own feed recovered, or fell behind
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
        d = min(self.node.next_deadline(), self.members.m.next_deadline())
        for extra in (
            self.messaging.next_deadline(),
            self.invites.next_deadline(),
            self.blobs.next_deadline(),
        ):
            if extra is not None:
                d = min(d, extra)
        return d

    def _schedule_flush(self) -> None:
        """Flush soon from a synchronous caller (coalesced into one task)."""
        if self._flush_scheduled or not self._started:
            return
        self._flush_scheduled = True

        async def run() -> None:
            self._flush_scheduled = False
            await self.flush()

        self.supervisor.spawn_once("flush", run())
