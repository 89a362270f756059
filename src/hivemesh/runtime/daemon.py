"""The node daemon: an asyncio pump around the sans-IO core.

Theory of operation
-------------------
A :class:`Daemon` owns one node's parts -- identity, SQLite store, the core
:class:`~hivemesh.core.node.Node` with its views, the connection manager and
the control socket -- and moves bytes and time between them. It holds no
protocol logic of its own; that lives in the core (as aioquic's asyncio
package wraps its sans-IO connection):

* **Input.** Each channel's reader task hands frames to
  ``node.receive(peer, frame, now_ms)``; local writes call ``node.append``.
* **Output.** After every input, :meth:`Daemon.flush` drains
  ``node.outbox()`` into the per-peer bounded send queues (awaiting when one
  is full: backpressure reaches the reader that caused the traffic) and
  ``node.events()`` into subscribers' bounded queues.
* **Time.** One timer task sleeps until the earliest deadline of the core,
  membership, direct messages, blob fetches and invite probation, then calls
  each ``handle_timer(now_ms)``. Time is
  wall-clock milliseconds; randomness is a ``random.Random`` seeded from
  :mod:`secrets`.

**Start.** Open (or create) the key file and store, verify and replay every
stored feed into the views (rehydration), listen, announce our endpoint in a
``node.hello`` event if it changed, dial bootstrap endpoints and every
endpoint learnt from the journal, open the control socket.

**Stop.** Close the control socket, announce ``left`` to the members, send
what is queued (briefly), close channels, close the store. Every append was
already durable when it returned (in the store's append log until the next
group commit), so a ``kill -9`` loses nothing that was acknowledged either.

**Parts wired in.** SWIM membership (:mod:`hivemesh.runtime.members`),
direct messages with a durable inbox, request/reply and ping
(:mod:`hivemesh.runtime.messaging`), blobs (:mod:`hivemesh.runtime.blobs`),
trust (``trust.json`` plus the journal's web of trust: ``authorize`` at the
handshake and for membership, ``author_trusted`` at the journal gate;
:mod:`hivemesh.runtime.trustview`, :mod:`hivemesh.runtime.invites`), the
views (context, names, endpoints, blob index, trust) and any application
view added with :meth:`Daemon.add_view` (verified replay first). Only one
daemon runs per data dir (``daemon.lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import secrets
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

from hivemesh.config import Config, bootstrap_targets, parse_endpoint
from hivemesh.core.event import Event
from hivemesh.core.frames import FrameType
from hivemesh.core.identity import Identity, address_of, public_key_of, short
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.views.context import ContextView
from hivemesh.core.views.names import NamesView
from hivemesh.errors import (
    ConfigError,
    StoreError,
)
from hivemesh.runtime.blobs import Blobs
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.daemon_api import DaemonAPI
from hivemesh.runtime.endpoints import KIND_HELLO, EndpointsView, hello_body
from hivemesh.runtime.hostutil import lock_data_dir, primary_ipv4
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.members import MemberDriver
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.status import Subscription
from hivemesh.runtime.trustview import KIND_TRUST_ADD, KIND_TRUST_REVOKE, TrustView
from hivemesh.transports import ChannelOptions
from hivemesh.trust import TrustStore

__all__ = ["Daemon", "Subscription", "now_ms"]

#: Byte 2 of an encoded EVENTS frame (msgpack ``[version, type, ...]``).
_EVENTS_TYPE_BYTE = bytes([FrameType.EVENTS])

log = logging.getLogger("hivemesh.runtime")


class Daemon(DaemonAPI):
    """One running node (see module docs; the client API is in
    :mod:`hivemesh.runtime.daemon_api`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.counters: Counter[str] = Counter()
        self.started_ms = 0
        self.rehydrated = 0
        self.listen_port = 0
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._flush_lock = asyncio.Lock()
        self._unsent: deque[tuple[str, bytes]] = deque()  # output behind a full send queue
        self._wake = asyncio.Event()
        self._armed_ms = 0
        self._flush_scheduled = False
        self._commit_timer: asyncio.TimerHandle | None = None  # the group commit's
        self._bg: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._control: Any = None
        self._started = False
        self.identity: Identity
        self.node: Node
        self.context_view: ContextView
        self.names: NamesView
        self.endpoints: EndpointsView
        self.conns: ConnectionManager
        self.trust: TrustStore
        self.members: MemberDriver
        self.messaging: Messaging
        self.blobs: Blobs
        self.trust_view: TrustView
        self.invites = Invites(self)
        self._mdns: Any = None
        self._lock_fd: int | None = None
        self._trust_generation = 0
        self.advertised = ""

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Open everything and start serving (see module docs).

        On failure (port in use, corrupt store, another daemon on the data
        dir, ...) everything opened so far is closed again and the error
        propagates.
        """
        try:
            await self._start()
        except BaseException:
            await self._abort_start()
            raise

    async def _abort_start(self) -> None:
        with contextlib.suppress(Exception):
            if self._control is not None:
                await self._control.close()
        with contextlib.suppress(Exception):
            if self._mdns is not None:
                await self._mdns.close()
        if hasattr(self, "conns"):
            with contextlib.suppress(Exception):
                await self.conns.close()
        if hasattr(self, "messaging"):
            with contextlib.suppress(Exception):
                self.messaging.close()
        if hasattr(self, "leases"):
            with contextlib.suppress(Exception):
                self.leases.close()
        if hasattr(self, "node"):
            with contextlib.suppress(Exception):
                self.node.settle()
            with contextlib.suppress(Exception):
                self.node.journal.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _start(self) -> None:
        from hivemesh.stores.keyfile import load_or_create_identity
        from hivemesh.stores.sqlite import SQLiteStore

        cfg = self.config
        cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock_fd = lock_data_dir(cfg.data_dir)
        self.identity = load_or_create_identity(cfg.data_dir)
        self.trust = TrustStore(cfg.data_dir)
        self.trust.min_refresh_s = 1.0  # the timer loop's poll() catches edits
        self._trust_generation = self.trust.generation
        store = self._store = SQLiteStore(cfg.store_path)
        # Received batches and our own (logged) join one commit per commit_delay_ms.
        store.write_behind = store.append_log = cfg.commit_delay_ms > 0
        rng = random.Random(secrets.randbits(128))
        self.started_ms = now_ms()
        self.node = Node(
            self.identity,
            store,
            rng,
            now_ms=self.started_ms,
            config=NodeConfig(
                sync_interval_ms=cfg.sync_interval_ms,
                # Batches straight from their author (our channels authenticate
                # it) are verified per run at the group commit (core.journal).
                defer_direct_verify=cfg.commit_delay_ms > 0,
                settle_delay_ms=None,
            ),
            trusted=self.author_trusted,
        )
        self.context_view = ContextView(self.identity.public)
        self.names = NamesView()
        self.endpoints = EndpointsView()
        self.trust_view = TrustView()
        for view in (self.context_view, self.names, self.endpoints, self.trust_view):
            self.node.add_view(view)
        from hivemesh.runtime.leases import attach as attach_leases

        self.leases, self.claims = attach_leases(self)  # quorum voter/proposer, claims view
        self.blobs = Blobs(self, random.Random(secrets.randbits(128)))
        self.rehydrated = self.node.rehydrate(self._replay(store))
        self.claims.abandon_previous_life(now_ms())  # see hivemesh.core.claims
        self.conns = ConnectionManager(
            self.identity,
            authorize=lambda a: self.invites.admit_channel(a, now_ms()),
            on_frame=self._on_frame,
            on_frames=self._on_frames,
            on_frames_now=self._on_frames_now,
            on_peer=self._on_peer,
            dial_timeout_s=cfg.dial_timeout_s,
            reconnect_min_s=cfg.reconnect_min_s,
            reconnect_max_s=cfg.reconnect_max_s,
            slow_peer_timeout_s=cfg.slow_peer_timeout_s,
            rng=random.Random(secrets.randbits(128)),
            options=ChannelOptions(send_queue_frames=cfg.send_queue_frames),
        )
        host, port = cfg.listen_endpoint()
        self.listen_port = await self.conns.listen(host, port)
        endpoint = self.advertised = self._announce(host)
        t = now_ms()
        self.members = MemberDriver(self, [endpoint], random.Random(secrets.randbits(128)), t)
        self.messaging = Messaging(
            self.node,
            random.Random(secrets.randbits(128)),
            cfg.data_dir / "inbox.db",
            inbox_max=cfg.inbox_max,
            relays=self._relays,
        )
        self.messaging.on_output = self._schedule_flush
        self._ready.set()
        if cfg.mdns:
            from hivemesh.discovery.mdns import LanDiscovery

            self._mdns = LanDiscovery(
                self.address,
                self.listen_port,
                interfaces=cfg.mdns_interfaces,
                on_found=lambda found: self.learn(found.address, list(found.endpoints)),
            )
            await self._mdns.start()
        if cfg.name and self.names.resolve(cfg.name) != self.address:
            self.node.append(*NamesView.claim(cfg.name), t)
        for address, eps in self.endpoints.known().items():
            self.learn(address, eps)
        for addr, h, p in bootstrap_targets(cfg.bootstrap):
            self.conns.want(h, p, addr)
        from hivemesh.runtime.telemetry import DaemonTelemetry  # -- telemetry --

        self.telemetry = DaemonTelemetry(self)
        await self.telemetry.start()  # -- end telemetry --
        from hivemesh.runtime.control import ControlServer

        self._control = ControlServer(self, cfg.control_path, timeout_s=cfg.control_timeout_s)
        await self._control.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._timer_loop()))
        self._started = True
        await self.flush()
        # Everything loaded so far (modules, rehydrated views) lives as long as
        # the process: keep the cyclic GC from re-scanning it in every full
        # collection, which stalled the loop for ~100 ms under load (the
        # latency tail). Collect first so no garbage is frozen; frozen objects
        # are still freed by reference counting.
        gc.collect()
        gc.freeze()
        log.info(
            "node %s listening on %s:%d (%d events replayed)",
            short(self.address),
            host,
            self.listen_port,
            self.rehydrated,
        )

    async def stop(self) -> None:
        """Shut down cleanly: stop serving, close channels, close the store."""
        if not self._started:
            return
        await self.telemetry.stop()  # -- telemetry: send what is spooled, briefly --
        self._started = False
        self._stopping.set()
        if self._control is not None:
            await self._control.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        for t in list(self._bg):
            with contextlib.suppress(BaseException):
                await t
        self.leases.close()
        if self._commit_timer is not None:
            self._commit_timer.cancel()
        self.commit_nowait()
        self.members.m.leave(now_ms())
        await self.flush()
        if self._mdns is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._mdns.close(), 3.0)
        await self.conns.close()
        self.messaging.close()
        self.node.settle()  # store what was verified; a bad run is dropped
        self.node.journal.store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the data dir lock
            self._lock_fd = None
        log.info("node %s stopped", short(self.address))

    def request_stop(self) -> None:
        """Ask :meth:`run_until_stopped` to return (signal handlers, ``stop`` op)."""
        self._stopping.set()

    async def run_until_stopped(self) -> None:
        """Wait until :meth:`request_stop`; then :meth:`stop`."""
        await self._stopping.wait()
        await self.stop()

    def _replay(self, store: Any) -> Iterable[Event]:
        from hivemesh.stores.replay import verify_feeds

        yield from verify_feeds(store)

    def _announce(self, host: str) -> str:
        if self.config.advertise:
            ep = self.config.advertise
        else:
            if host in ("0.0.0.0", "", "::"):
                host = primary_ipv4()
            ep = f"{host}:{self.listen_port}"
        if self.endpoints.endpoints(self.address) != [ep]:
            self.node.append(KIND_HELLO, hello_body([ep]), now_ms())
        return ep

    # -- trust -------------------------------------------------------------------

    def authorize(self, address: str) -> bool:
        """May ``address`` connect (and be a member)? Revoked never may.

        ``open`` mode: anyone not revoked here. ``invite`` mode: the web of
        trust grown from ``trust.json`` through the journal's vouches
        (:mod:`hivemesh.runtime.trustview`).
        """
        if self.trust.is_revoked(address):
            return False
        if self.config.trust_mode == "open" or self.trust.is_trusted(address):
            return True
        admitted, revoked = self.trust_view.evaluate(
            self.trust.trusted(), self.trust.revoked(), self.address
        )
        return address in admitted and address not in revoked

    def author_trusted(self, author: bytes) -> bool:
        """The journal gate: may events authored by ``author`` be stored?"""
        return self.authorize(address_of(author))

    async def revoke(self, address: str) -> None:
        """Revoke ``address``: drop its channel, forget it, refuse its new events."""
        public_key_of(address)
        self.trust.revoke(address, now_ms() // 1000)
        self.node.append(KIND_TRUST_REVOKE, {"address": address}, now_ms())
        self.conns.forget(address)
        await self.conns.disconnect(address, "revoked", revoked=True)
        self.node.remove_peer(address)
        self.members.m.forget(address, now_ms())
        await self.flush()

    def admit(self, address: str) -> None:
        """Trust ``address`` (invite mode) and lift any revocation."""
        public_key_of(address)
        self.trust.add(address, now_ms() // 1000)
        self.vouch(address)
        self.learn(address, self.endpoints.endpoints(address))

    def vouch(self, address: str) -> None:
        """Publish that we trust ``address`` (others in the swarm may admit it)."""
        self.node.append(KIND_TRUST_ADD, {"address": address}, now_ms())
        self._schedule_flush()

    async def _recheck_trust(self) -> None:
        """After trust changed: drop peers no longer admitted, dial new ones."""
        for peer in sorted(self.conns.links):
            if peer not in self.invites.probation and not self.authorize(peer):
                self.counters["disconnected_revoked"] += 1
                self.conns.forget(peer)
                await self.conns.disconnect(peer, "revoked", revoked=True)
                self.node.remove_peer(peer)
                self.members.m.forget(peer, now_ms())
        for address, eps in self.endpoints.known().items():
            if address not in self.conns.links:
                self.learn(address, eps)

    def record(self, kind: str, address: str, incarnation: int, t: int) -> None:
        """Append a membership observation to our feed.

        ``a`` (the member's key) and ``upto`` (the last seq of its feed we
        hold) let claim and plan views release exactly the claims this
        observation is causally after (see :mod:`hivemesh.core.claims`).
        """
        author = public_key_of(address)
        body = {
            "address": address,
            "incarnation": incarnation,
            "observed_ms": t,
            "a": author,
            "upto": self.node.journal.head(author).seq,
        }
        self.node.append(kind, body, t)

    def _relays(self, destination: str) -> list[str]:
        peers = set(self.node.peers)
        return [a for a in sorted(self.conns.links) if a in peers and a != destination]

    # -- the pump ------------------------------------------------------------------

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
        receive = self.node.receive
        only_events = True
        for frame in frames:
            only_events = only_events and frame[2:3] == _EVENTS_TYPE_BYTE
            receive(peer, frame, now_ms())
        self._flush_now(deadlines=not only_events)
        return True

    def disconnect_later(self, peer: str, reason: str) -> None:
        """Close the channel to ``peer`` from synchronous code."""
        task = asyncio.get_running_loop().create_task(self.conns.disconnect(peer, reason))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _on_peer(self, peer: str, up: bool) -> None:
        await self._ready.wait()
        if up and peer in self.invites.probation:
            return  # not a member until it presents a valid join proof
        if up:
            self.invites.send_proof(peer)
            eps = self.endpoints.endpoints(peer)
            link = self.conns.links.get(peer)
            if link is not None and link.endpoint is not None and not eps:
                eps = [f"{link.endpoint[0]}:{link.endpoint[1]}"]
            self.members.channel_up(peer, eps, now_ms())
        else:
            self.invites.probation.pop(peer, None)
            self.node.remove_peer(peer)
            self.learn(peer, self.endpoints.endpoints(peer))
        await self.flush()

    def learn(self, address: str, endpoints: list[str]) -> None:
        """Keep dialling ``address`` at ``endpoints`` (if it may connect)."""
        if address == self.address or not self.authorize(address):
            return
        for ep in endpoints:
            try:
                h, p = parse_endpoint(ep)
            except ConfigError:
                self.counters["bad_endpoint"] += 1
                continue
            self.conns.want(h, p, address)

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
                    self._drain()
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
        """Commit batches received from peers at most ``commit_delay_ms``
        after the first of them was applied (one commit for many frames; our
        own appends are committed when made, see the store's module docs)."""
        if (self._store.pending or self.node.journal.unsettled) and self._commit_timer is None:
            self._commit_timer = asyncio.get_running_loop().call_later(
                self.config.commit_delay_ms / 1000, self._commit_group
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
        except StoreError:  # disk full, I/O error: retried at the next commit
            self.counters["group_commit_failed"] += 1
            log.exception("group commit failed")

    def _dispatch(self, ev: Event) -> None:
        if ev.kind in TrustView.kinds and ev.author != self.identity.public:
            task = asyncio.get_running_loop().create_task(self._recheck_trust())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        if ev.kind == KIND_HELLO and ev.author != self.identity.public:
            addr = address_of(ev.author)
            self.learn(addr, self.endpoints.endpoints(addr))
        for sub in self._subs:
            sub.offer(ev)

    async def _timer_loop(self) -> None:
        while self._started:
            t = now_ms()
            self.node.handle_timer(t)
            self.members.m.handle_timer(t)
            self.messaging.handle_timer(t)
            self.invites.expire(t)
            if self.trust.poll() != self._trust_generation:  # trust.json edited
                self._trust_generation = self.trust.generation
                await self._recheck_trust()
            self.blobs.handle_timer(t)
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

        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
