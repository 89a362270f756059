"""The node daemon: an asyncio pump around the sans-IO core.

Theory of operation
-------------------
A :class:`Daemon` owns one node's parts -- identity, SQLite store, the core
:class:`~hivemesh.core.node.Node` with its views, the connection manager and
the control socket -- and moves bytes and time between them. It holds no
protocol logic of its own; that lives in the core (as aioquic's asyncio
package wraps its sans-IO connection):

* **Input.** Frames from the channels go to
  ``node.receive(peer, frame, now_ms)`` -- from the read callback itself
  when nothing is waiting, else through the link's reader task; local writes
  call ``node.append``.
* **Output.** After every input, :meth:`Daemon.flush` drains
  ``node.outbox()`` into the per-peer bounded send queues (waiting when one
  is full: backpressure reaches the readers that caused the traffic) and
  ``node.events()`` into subscribers' bounded queues.
* **Time.** One timer task sleeps until the earliest deadline of the core,
  membership, direct messages, blob fetches and invite probation, then calls
  each ``handle_timer(now_ms)``. Time is
  wall-clock milliseconds; randomness is a ``random.Random`` seeded from
  :mod:`secrets`.

The pump itself (input, output, timers, group commit) is the
:class:`~hivemesh.runtime.pump.Pump` mixin.

**Start.** Make the data dir private (0700, every file 0600; loose modes
found there are fixed and logged as a warning), open (or create) the key
file, the own feed's mark and the store, open the control socket, verify and
replay every stored feed into the views in causal order, from the view
checkpoint when there is a usable one (rehydration,
:mod:`hivemesh.runtime.rehydration`: ``status`` answers meanwhile, other
control operations wait until the start is complete), listen, dial bootstrap endpoints and every
endpoint learnt from the journal. The appends of a
new life (release the previous life's claims, a ``node.hello`` if our
endpoint changed, the configured name) wait until the own feed takes
writes: at once, unless the store is behind the feed's mark
(:mod:`hivemesh.runtime.ownfeed`).

**Stop.** Close the control socket, announce ``left`` to the members, send
what is queued (briefly), close channels, write a view checkpoint, close the
store. Every append was
already durable when it returned (in the store's append log until the next
group commit), so a ``kill -9`` loses nothing that was acknowledged either.

**Parts wired in.** SWIM membership (:mod:`hivemesh.runtime.members`),
direct messages with a durable inbox, request/reply and ping
(:mod:`hivemesh.runtime.messaging`), blobs (:mod:`hivemesh.runtime.blobs`),
trust (``trust.json`` plus the journal's swarm-scoped web of trust:
``authorize`` at the handshake, for membership and relayed messages,
``author_trusted`` at the journal gate, ``shares`` for whose feeds a peer
sees; :mod:`hivemesh.runtime.trustview`, :mod:`hivemesh.runtime.invites`), the
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
from hivemesh.core.identity import Identity, address_of, public_key_of, short
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.views.context import ContextView
from hivemesh.core.views.names import NamesView
from hivemesh.errors import ConfigError, HivemeshError
from hivemesh.runtime.blobs import Blobs
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.daemon_api import DaemonAPI
from hivemesh.runtime.endpoints import KIND_HELLO, EndpointsView, hello_body
from hivemesh.runtime.hostutil import lock_data_dir, primary_ipv4, raise_open_files_limit
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.members import MemberDriver
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.ownfeed import OwnFeedWatch
from hivemesh.runtime.pump import Pump
from hivemesh.runtime.rehydration import Rehydration
from hivemesh.runtime.status import Subscription
from hivemesh.runtime.trustview import KIND_TRUST_ADD, KIND_TRUST_REVOKE, TrustView, TrustWeb
from hivemesh.stores.feedmark import FileMarkStore, open_mark
from hivemesh.transports import ChannelOptions
from hivemesh.transports.noise import BOOT_ID_BYTES
from hivemesh.trust import TrustStore

__all__ = ["Daemon", "Subscription", "now_ms"]

log = logging.getLogger("hivemesh.runtime")


class Daemon(Pump, DaemonAPI):
    """One running node (see module docs; the client API is in
    :mod:`hivemesh.runtime.daemon_api`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.counters: Counter[str] = Counter()
        self.started_ms = 0
        self.rehydrated = 0
        self.rehydration = Rehydration(self)
        self.listen_port = 0
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._flush_lock = asyncio.Lock()
        self._unsent: deque[tuple[str, bytes]] = deque()  # output send_fast could not take (pump)
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
        self.own_feed: OwnFeedWatch
        self._marks: FileMarkStore
        self._mdns: Any = None
        self._lock_fd: int | None = None
        self._trust_generation = 0
        self._web: tuple[tuple[int, int], TrustWeb] | None = None
        self._addresses: dict[bytes, str] = {}
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
        if hasattr(self, "_marks"):
            self._marks.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _start(self) -> None:
        from hivemesh.stores.keyfile import load_or_create_identity
        from hivemesh.stores.private import made_private, secure_data_dir
        from hivemesh.stores.sqlite import SQLiteStore

        cfg = self.config
        loose = secure_data_dir(cfg.data_dir)
        if loose:
            log.warning("%s", made_private(cfg.data_dir, loose))
        self._lock_fd = lock_data_dir(cfg.data_dir)
        raise_open_files_limit()
        self.identity = load_or_create_identity(cfg.data_dir)
        self.trust = TrustStore(cfg.data_dir)
        self.trust.min_refresh_s = 1.0  # the timer loop's poll() catches edits
        self._trust_generation = self.trust.generation
        store = self._store = SQLiteStore(cfg.store_path)
        # Received batches and our own (logged) join one commit per commit_delay_ms.
        store.write_behind = store.append_log = cfg.commit_delay_ms > 0
        power = store.durability == "power"
        self._marks = open_mark(cfg.data_dir, self.identity.public, store, fsync=power)
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
            shares=self.shares if cfg.trust_mode == "invite" else None,
            marks=self._marks,
        )
        self.context_view = ContextView(self.identity.public)
        self.context_view.before_write = self.node.feed_gate.check  # refused while recovering
        self.names = NamesView()
        self.endpoints = EndpointsView()
        self.trust_view = TrustView()
        for view in (self.context_view, self.names, self.endpoints, self.trust_view):
            self.node.add_view(view)
        self.invites.attach(self.node)
        from hivemesh.runtime.leases import attach as attach_leases

        self.leases, self.claims = attach_leases(self)  # quorum voter/proposer, claims view
        self.blobs = Blobs(self, random.Random(secrets.randbits(128)))
        from hivemesh.runtime.control import ControlServer

        self._control = ControlServer(self, cfg.control_path, timeout_s=cfg.control_timeout_s)
        await self._control.start()  # answers status while the views are rebuilt
        self.rehydrated = await self.rehydration.run(store)
        self.own_feed = OwnFeedWatch(
            self,
            self._first_writes,
            log_torn_bytes=store.log_torn_bytes,
            log_orphaned=store.log_orphaned,
        )
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
            on_refused=self.invites.on_refused,
            boot_id=secrets.token_bytes(BOOT_ID_BYTES),  # one per node start (a life)
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
            admit=self.authorize,
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
        self.own_feed.start(t)
        for address, eps in self.endpoints.known().items():
            self.learn(address, eps)
        for addr, h, p in bootstrap_targets(cfg.bootstrap):
            self.conns.want(h, p, addr)
        from hivemesh.runtime.telemetry import DaemonTelemetry  # -- telemetry --

        self.telemetry = DaemonTelemetry(self)
        await self.telemetry.start()  # -- end telemetry --
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._timer_loop()))
        self._started = True
        self.rehydration.complete()  # control operations waiting for the views go on
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
        failed = self.node.settle()  # store what was verified; a bad run is dropped
        if not failed:  # else the views may hold a run the store refused
            with contextlib.suppress(HivemeshError):  # no checkpoint then; counted by the store
                self.node.journal.store.sync()
                self.rehydration.save()
        self.node.journal.store.close()
        self._marks.close()
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
        from hivemesh.runtime.rehydration import replay_events

        return replay_events(store)  # causal order: loro imports nothing pending

    def _announce(self, host: str) -> str:
        if self.config.advertise:
            return self.config.advertise
        if host in ("0.0.0.0", "", "::"):
            host = primary_ipv4()
        return f"{host}:{self.listen_port}"

    def _first_writes(self, t: int) -> None:
        """The appends of a new life, once the own feed takes writes: release
        the previous life's claims (see :mod:`hivemesh.core.claims`), announce
        our endpoint if it changed, claim the configured name."""
        self.claims.abandon_previous_life(t)
        if self.endpoints.endpoints(self.address) != [self.advertised]:
            self.node.append(KIND_HELLO, hello_body([self.advertised]), t)
        name = self.config.name
        if name and self.names.resolve(name) != self.address:
            self.node.append(*NamesView.claim(name), t)

    # -- trust -------------------------------------------------------------------

    def authorize(self, address: str) -> bool:
        """May ``address`` connect (and be a member)? Revoked never may.

        ``open`` mode: anyone not revoked here. ``invite`` mode: the web of
        trust grown from ``trust.json`` through the journal's vouches
        (:mod:`hivemesh.runtime.trustview`). Either way, the inviter of a
        join in progress (:mod:`hivemesh.runtime.invites`).
        """
        if address in self.invites.joins or address == self.address:
            return True  # (our own records, e.g. telemetry to ourselves as collector)
        if self.trust.is_revoked(address):
            return False
        if self.config.trust_mode == "open" or self.trust.is_trusted(address):
            return True
        return address in self.web().admitted

    def web(self) -> TrustWeb:
        """Our swarms' web of trust now (:mod:`hivemesh.runtime.trustview`)."""
        key = (self.trust.generation, self.trust_view.version)
        if self._web is None or self._web[0] != key:
            t = self.trust
            web = self.trust_view.evaluate(
                t.trusted(), t.revoked(), self.address, t.swarms(), self.config.trust_vouches
            )
            self._web = (key, web)
        return self._web[1]

    def author_trusted(self, author: bytes) -> bool:
        """The journal gate: may events authored by ``author`` be stored?"""
        return self.authorize(self._address_of(author))

    def shares(self, peer: str, author: bytes) -> bool:
        """May ``peer`` see ``author``'s feed? Its own and ours, and those of
        the members of a swarm it shares with us (``invite`` mode's core policy)."""
        a = self._address_of(author)
        return a == peer or a == self.address or self.web().shares(peer, a)

    def _address_of(self, author: bytes) -> str:
        address = self._addresses.get(author)
        if address is None:
            if len(self._addresses) >= 65_536:  # bounded: a cache, not a registry
                self._addresses.clear()
            address = self._addresses[author] = address_of(author)
        return address

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
        """Trust ``address`` (invite mode), lift any revocation, and bring it
        into our home swarm (as an invite would)."""
        public_key_of(address)
        t = now_ms() // 1000
        self.trust.add(address, t)
        self.vouch(address, self.trust.home_swarm(t))
        self.learn(address, self.endpoints.endpoints(address))

    def vouch(self, address: str, swarm: str) -> None:
        """Publish that we bring ``address`` into ``swarm`` (its other members
        may admit it; nobody outside that swarm follows it)."""
        self.node.append(KIND_TRUST_ADD, {"address": address, "swarm": swarm}, now_ms())
        self._schedule_flush()

    async def _recheck_trust(self) -> None:
        """After trust changed: drop peers no longer admitted, dial new ones."""
        for peer in sorted(self.conns.links):
            if peer in self.invites.probation:
                if self.authorize(peer):  # vouched for meanwhile: a peer like any other
                    del self.invites.probation[peer]
                    await self._on_peer(peer, True)
                continue
            if not self.authorize(peer):
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
        self.node.append_later([(kind, body)], t)  # kept while the feed takes no writes

    def _relays(self, destination: str) -> list[str]:
        peers = set(self.node.peers)
        return [a for a in sorted(self.conns.links) if a in peers and a != destination]

    # -- membership and peers (the pump is in hivemesh.runtime.pump) --------------

    async def _on_peer(self, peer: str, up: bool) -> None:
        await self._ready.wait()
        if up and peer in self.invites.probation:
            return  # not a member until it presents a valid join proof
        if up:
            self.invites.send_proof(peer)
            if peer not in self.invites.awaiting:  # else: once it admits us
                self.member_up(peer)
        else:
            self.invites.probation.pop(peer, None)
            self.node.remove_peer(peer)
            self.learn(peer, self.endpoints.endpoints(peer))
        await self.flush()

    def member_up(self, peer: str) -> None:
        """A channel to ``peer`` is up and both sides admit each other:
        replicate with it, and join membership through it if it is new."""
        eps = self.endpoints.endpoints(peer)
        link = self.conns.links.get(peer)
        if link is not None and link.endpoint is not None and not eps:
            eps = [f"{link.endpoint[0]}:{link.endpoint[1]}"]
        self.members.channel_up(peer, eps, now_ms())
        self.messaging.direct.link_up(peer, now_ms())  # e.g. the peer restarted

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
