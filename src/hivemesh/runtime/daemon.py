"""The node daemon: an asyncio pump around the sans-IO core.

Theory of operation
-------------------
A :class:`Daemon` owns one node's I/O -- identity, SQLite store, the trust
file, the connection manager and the control socket -- around the sans-IO
:class:`~hivemesh.core.peer.Peer`, which decides everything (membership,
claims, settlement, trust, endpoints, blobs, direct messages: see its module
docs). The daemon moves bytes, time and files between them, as aioquic's
asyncio package wraps its sans-IO connection:

* **Input.** Frames from the channels go to ``peer.receive`` -- from the
  read callback itself when nothing is waiting, else through the link's
  reader task; links going up or down to ``peer.link_up`` /
  ``peer.link_down``; an edited ``trust.json`` to ``peer.trust_changed``.
* **Output.** After every input, :meth:`Daemon.flush` carries out
  ``peer.effects()``: frames into the per-peer bounded send queues (waiting
  when one is full: backpressure reaches the readers that caused the
  traffic), dials, closes, replies, events into subscribers' bounded queues.
* **Time.** One timer task sleeps until ``peer.next_deadline()``, then
  calls ``peer.handle_timer(now_ms)``. Time is the monotonic clock in
  milliseconds, anchored at wall-clock time (:mod:`hivemesh.runtime.clock`);
  randomness is a ``random.Random`` seeded from
  :mod:`secrets`.

The pump itself (input, output, timers, group commit) is the
:class:`~hivemesh.runtime.pump.Pump` mixin.

**Start.** Make the data dir private (0700, every file 0600; loose modes
found there are fixed and logged as a warning), open (or create) the key
file, the own feed's mark and the store, open the control socket, verify and
replay every stored feed into the Peer's views in causal order, from the view
checkpoint when there is a usable one (rehydration,
:mod:`hivemesh.runtime.rehydration`: ``status`` answers meanwhile, other
control operations wait until the start is complete), listen, start the Peer
(its appends of a new life wait until the own feed takes writes), dial
bootstrap endpoints and every endpoint learnt from the journal.

**Supervision.** Every task runs under the daemon's
:class:`~hivemesh.runtime.supervise.Supervisor`; a failure is logged with its
traceback and counted (``task_failed_<name>``; ``status`` lists the loops
under ``tasks``), then handled per task:

==========================  ================================================
task                        on failure
==========================  ================================================
``timer`` (timers, SWIM,    restarted with backoff (50 ms doubling to 2 s);
anti-entropy, trust.json    a 6th failure within 60 s ends the node: it
poll, own-feed watch)       stops and ``hivemesh up`` exits non-zero; a
                            round that takes over 30 s is reported as a
                            stall (``task_stalled_timer``)
``group_commit``            a store error (I/O, full disk) is counted
                            (``group_commit_failed``) and retried at the next
                            commit, writes meanwhile fail with ``StoreError``;
                            any other exception ends the node at once
``flush``, ``disconnect``,  logged and counted; the next flush or trust
``trust_recheck``           change runs them again
``reader`` (per link),      a frame handler that raises drops that one link
``dialler``, ``on_peer``    (``reader_crashed``), which is redialled; a bug
                            while dialling is counted (``dial_crashed``) and
                            the dialler backs off and dials again
``telemetry_heartbeat``     restarted like ``timer``
``telemetry_sender``,       logged and counted (both already retry every
``telemetry_health``        delivery failure with backoff themselves)
==========================  ================================================

A ``trust.json`` that no longer parses is not a task failure: it is logged
and counted once per bad version (``trust_file_invalid``) and the trust last
read stays in force until the file parses again.

**Stop.** Close the control socket, announce ``left`` to the members, send
what is queued (briefly), close channels, write a view checkpoint, close the
store. Every append was
already durable when it returned (in the store's append log until the next
group commit), so a ``kill -9`` loses nothing that was acknowledged either.

**Parts wired in.** The Peer; direct messages' durable inbox, request/reply
and ping (:mod:`hivemesh.runtime.messaging`), blob puts and waits
(:mod:`hivemesh.runtime.blobs`), invites (:mod:`hivemesh.runtime.invites`),
leases (:mod:`hivemesh.runtime.leases`), and any application view added with
:meth:`Daemon.add_view` (verified replay first). Only one daemon runs per
data dir (``daemon.lock``).
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

from hivemesh.commands.peer import Leave, Vouch
from hivemesh.commands.trust import TrustRevoke
from hivemesh.config import UDP_PREFIX, Config, bootstrap_targets, parse_endpoint
from hivemesh.core.direct import DirectConfig
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity, public_key_of, short
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.peer import Peer, PeerConfig, TrustFile
from hivemesh.core.pex import MembershipConfig
from hivemesh.core.trace import Trace
from hivemesh.core.views.context import ContextView
from hivemesh.core.views.endpoints import EndpointsView
from hivemesh.core.views.names import NamesView
from hivemesh.core.views.trust import TrustView, TrustWeb
from hivemesh.errors import ConfigError, HivemeshError
from hivemesh.leases import LeaseClient
from hivemesh.runtime.blobs import Blobs
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.daemon_api import DaemonAPI
from hivemesh.runtime.hostutil import lock_data_dir, primary_ipv4, raise_open_files_limit
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.leases import MeshClaims, VoterDisk, lease_client
from hivemesh.runtime.majority import serve_heads
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.pump import Pump
from hivemesh.runtime.rehydration import Rehydration
from hivemesh.runtime.status import Subscription
from hivemesh.runtime.supervise import RESTART_WATCHED, Supervisor, TaskFailed
from hivemesh.stores.feedmark import FileMarkStore, open_mark
from hivemesh.transports import ChannelOptions
from hivemesh.transports.noise import BOOT_ID_BYTES
from hivemesh.trust import TrustStore

__all__ = ["Daemon", "Subscription", "membership_config", "now_ms"]

log = logging.getLogger("hivemesh.runtime")


def membership_config(
    probe_interval_ms: int, probe_timeout_ms: int, suspicion_mult: int
) -> MembershipConfig:
    """Scale memberlist's LAN shape to the configured probe interval."""
    return MembershipConfig(
        probe_interval_ms=probe_interval_ms,
        probe_timeout_ms=probe_timeout_ms,
        suspicion_mult=suspicion_mult,
        gossip_interval_ms=max(1, probe_interval_ms // 5),
        push_pull_interval_ms=probe_interval_ms * 30,
        join_timeout_ms=probe_interval_ms * 30,
    )


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
        #: every task of the node runs under it (:mod:`hivemesh.runtime.supervise`)
        self.supervisor = Supervisor(self.counters, self._on_fatal)
        self._flush_lock = asyncio.Lock()
        self._unsent: deque[tuple[str, bytes]] = deque()  # output send_fast could not take (pump)
        self._wake = asyncio.Event()
        self._armed_ms = 0
        self._flush_scheduled = False
        self._commit_timer: asyncio.TimerHandle | None = None  # the group commit's
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._control: Any = None
        self._started = False
        self.identity: Identity
        self.peer: Peer
        self.node: Node
        self.context_view: ContextView
        self.names: NamesView
        self.endpoints: EndpointsView
        self.conns: ConnectionManager
        self.trust: TrustStore
        self.messaging: Messaging
        self.blobs: Blobs
        self.trust_view: TrustView
        self.invites = Invites(self)
        self._marks: FileMarkStore
        self._mdns: Any = None
        self._lock_fd: int | None = None
        self._trust_generation = 0
        self._calls: dict[int, asyncio.Future[Any]] = {}  # command rid -> its caller
        self._lives: dict[str, bytes] = {}  # linked peer -> the boot id given to the Peer
        #: the Peer's recorded inputs and effects (``trace_peer`` only)
        self.trace: Trace | None = None
        self.advertised = ""
        #: the lease voter's files (:mod:`hivemesh.runtime.leases`)
        self.voter_disk: VoterDisk | None = None
        self._lease_client: LeaseClient | None = None
        self.claims: MeshClaims
        #: broker mode's journal log (:mod:`hivemesh.mesh.feedlog`), else None
        self.feedlog: Any = None
        #: QUIC, relays and hole punching (runtime.paths), when configured
        self.paths: Any = None

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
        await self.supervisor.close()
        with contextlib.suppress(Exception):
            if self._control is not None:
                await self._control.close()
        with contextlib.suppress(Exception):
            if self._mdns is not None:
                await self._mdns.close()
        if self.paths is not None:
            with contextlib.suppress(Exception):
                self.paths.close()
        if hasattr(self, "conns"):
            with contextlib.suppress(Exception):
                await self.conns.close()
        if hasattr(self, "messaging"):
            with contextlib.suppress(Exception):
                self.messaging.close()
        if self.voter_disk is not None:
            with contextlib.suppress(Exception):
                self.voter_disk.close()
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
        self.trust.on_load_error = self._trust_unreadable  # keeps the last good trust
        self._trust_generation = self.trust.generation
        store = self._store = SQLiteStore(cfg.store_path)
        # Received batches and our own (logged) join one commit per commit_delay_ms.
        store.write_behind = store.append_log = cfg.commit_delay_ms > 0
        power = store.durability == "power"
        self._marks = open_mark(cfg.data_dir, self.identity.public, store, fsync=power)
        self.started_ms = now_ms()
        seed = secrets.randbits(128)
        self.voter_disk = VoterDisk(cfg.data_dir)
        lease_setup = self.voter_disk.open()
        self.voter_disk.synced = self._lease_synced
        self.trace = Trace(seed) if cfg.trace_peer else None
        self.peer = Peer(
            self.identity,
            store,
            random.Random(seed),
            now_ms=self.started_ms,
            config=PeerConfig(
                node=NodeConfig(
                    sync_interval_ms=cfg.sync_interval_ms,
                    # Batches straight from their author (our channels authenticate
                    # it) are verified per run at the group commit (core.journal).
                    # (in broker mode every batch is verified before it is
                    # applied: the broker is not trusted; its log is the push half)
                    defer_direct_verify=cfg.commit_delay_ms > 0 and cfg.mesh is None,
                    settle_delay_ms=None,
                    push=cfg.mesh is None,
                ),
                membership=membership_config(
                    cfg.probe_interval_ms, cfg.probe_timeout_ms, cfg.suspicion_mult
                ),
                direct=DirectConfig(
                    inbox_capacity=min(cfg.inbox_max, 10_000), ack_when_stored=True
                ),
                trust_mode=cfg.trust_mode,
                trust_vouches=cfg.trust_vouches,
                name=cfg.name,
                lease_voters=tuple(cfg.lease_voters),
            ),
            trust=self._trust_file(),
            marks=self._marks,
            leases=lease_setup,
            trace=self.trace,
        )
        peer = self.peer
        self.node = peer.node
        self.context_view = peer.context
        self.names = peer.names
        self.endpoints = peer.endpoints
        self.trust_view = peer.trust_view
        self.claims = MeshClaims(self)  # over the Peer's claims view
        self.blobs = Blobs(self)
        from hivemesh.runtime.control import ControlServer

        self._control = ControlServer(self, cfg.control_path, timeout_s=cfg.control_timeout_s)
        await self._control.start()  # answers status while the views are rebuilt
        self.rehydrated = await self.rehydration.run(store)  # into the Peer, in slices
        if store.log_torn_bytes or store.log_orphaned:  # a damaged append log: never only a counter
            log.warning(
                "node %s: the store's append log was damaged (%d bytes torn off, %d "
                "records set aside); own feed %s at #%d, mark #%s",
                short(self.address),
                store.log_torn_bytes,
                store.log_orphaned,
                self.node.feed_gate.state.value,
                self.node.feed_gate.held.seq,
                self.node.feed_gate.status()["mark"],
            )
        self.conns = ConnectionManager(
            self.identity,
            authorize=self.invites.admit_channel,
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
            on_refused=self.invites.refused,
            boot_id=secrets.token_bytes(BOOT_ID_BYTES),  # one per node start (a life)
            spawn=self.supervisor.watch,  # readers, diallers: a failure is logged and counted
        )
        if cfg.mesh is not None:  # broker mode: links over the broker (runtime.broker)
            from hivemesh.runtime.broker import open_links

            self.conns = open_links(self)  # type: ignore[assignment]
        host, port = cfg.listen_endpoint()
        self.listen_port = await self.conns.listen(host, port)
        if cfg.udp or cfg.relays or cfg.relay_role:
            from hivemesh.runtime.paths import NodePaths

            self.paths = NodePaths(self)
            await self.paths.start(host, self.listen_port)
        endpoint = self.advertised = self._announce(host)
        t = now_ms()
        self.messaging = Messaging(self, cfg.data_dir / "inbox.db", inbox_max=cfg.inbox_max)
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
        endpoints = [endpoint]
        if self.paths is not None and cfg.udp:  # QUIC on the same port over UDP
            endpoints.append(f"{UDP_PREFIX}{endpoint}")
        peer.start(endpoints, t)  # the appends of a new life (errors: no start)
        for address, eps in self.endpoints.known().items():
            self.learn(address, eps)
        for addr, h, p in bootstrap_targets(cfg.bootstrap):
            self.conns.want(h, p, addr)
        from hivemesh.runtime.telemetry import DaemonTelemetry  # -- telemetry --

        self.telemetry = DaemonTelemetry(self)
        await self.telemetry.start()  # -- end telemetry --
        serve_heads(self)  # majority barriers (sync.majority) ask every voter
        self.supervisor.install(asyncio.get_running_loop())
        self._started = True
        self.supervisor.spawn("timer", self._timer_loop, RESTART_WATCHED)  # beats each round
        if cfg.mesh is not None:  # the journal's push half on the broker's log
            from hivemesh.runtime.broker import start_feedlog

            self.feedlog = start_feedlog(self)
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
        self.supervisor.closing()
        await self.telemetry.stop()  # -- telemetry: send what is spooled, briefly --
        self._started = False
        self._stopping.set()
        if self._control is not None:
            await self._control.close()
        await self.supervisor.stop_loops()
        await self.supervisor.drain()  # the flushes, disconnects and trust re-checks under way
        if self.voter_disk is not None:
            self.voter_disk.close()  # replies waiting for a sync are never sent
        if self._commit_timer is not None:
            self._commit_timer.cancel()
        self.commit_nowait()
        self.peer.command(Leave(), now_ms())
        await self.flush()
        if self._mdns is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._mdns.close(), 3.0)
        if self.paths is not None:
            self.paths.close()
        await self.conns.close()
        if self.config.mesh is not None:
            from hivemesh.runtime.broker import stop_broker

            await stop_broker(self)
        self.messaging.close()
        try:
            failed = self.node.settle()  # store what was verified; a bad run is dropped
            if not failed:  # else the views may hold a run the store refused
                with contextlib.suppress(HivemeshError):  # no checkpoint then; counted by the store
                    self.node.journal.store.sync()
                    self.rehydration.save()
            self.node.journal.store.close()
        except Exception:
            if self.supervisor.failure is None:
                raise
            log.exception("closing the store after %s", self.supervisor.failure)
        self._marks.close()
        await self.supervisor.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the data dir lock
            self._lock_fd = None
        log.info("node %s stopped", short(self.address))

    @property
    def running(self) -> bool:
        """Started and not stopping."""
        return self._started

    @property
    def leases(self) -> LeaseClient:
        """A :class:`~hivemesh.leases.LeaseClient` over the swarm's quorum
        (holder id: this node's address; :mod:`hivemesh.runtime.leases`)."""
        if self._lease_client is None:
            self._lease_client = lease_client(self)
        return self._lease_client

    def _lease_synced(self, upto: int, error: str | None) -> None:
        """The voter log synced (or failed): the held votes may leave."""
        if not self._started:
            return
        self.peer.lease_synced(upto, error, now_ms())
        if self._flush_lock.locked():
            self._schedule_flush()
        else:
            self._flush_now(deadlines=True)

    def request_stop(self) -> None:
        """Ask :meth:`run_until_stopped` to return (signal handlers, ``stop`` op)."""
        self._stopping.set()

    async def run_until_stopped(self) -> None:
        """Wait until :meth:`request_stop`; then :meth:`stop`.

        Raises :class:`~hivemesh.runtime.supervise.TaskFailed` after stopping
        if a supervised task failed fatally (the process then exits non-zero).
        """
        await self._stopping.wait()
        await self.stop()
        if self.supervisor.failure is not None:
            raise self.supervisor.failure

    def _on_fatal(self, failure: TaskFailed) -> None:
        """A supervised task failed for good: stop; :meth:`run_until_stopped`
        then raises ``failure`` (a half-alive node is never left running)."""
        self.request_stop()

    def _trust_unreadable(self, exc: Exception) -> None:
        """``trust.json`` no longer parses (a hand edit gone wrong): the trust
        store keeps what it last read; say so, once per bad version."""
        self.counters["trust_file_invalid"] += 1
        log.error("%s; keeping the trust last read until it is fixed", exc)

    def _replay(self, store: Any) -> Iterable[Event]:
        from hivemesh.runtime.rehydration import replay_events

        return replay_events(store)  # causal order: loro imports nothing pending

    def _announce(self, host: str) -> str:
        if self.config.advertise:
            return self.config.advertise
        if host in ("0.0.0.0", "", "::"):
            host = primary_ipv4()
        return f"{host}:{self.listen_port}"

    # -- trust -------------------------------------------------------------------

    def _trust_file(self) -> TrustFile:
        """What the Peer needs of ``trust.json`` now."""
        t = self.trust
        return TrustFile(frozenset(t.trusted()), frozenset(t.revoked()), tuple(t.swarms()))

    def sync_trust(self) -> bool:
        """Give the Peer ``trust.json`` if it changed (edited by hand, or by
        our own invites and revocations); True if it had. A file that no
        longer parses is reported by :meth:`_trust_unreadable` and the trust
        last read stays in force (the generation does not move)."""
        generation = self.trust.poll()
        if generation == self._trust_generation:
            return False
        self._trust_generation = generation
        self.peer.trust_changed(self._trust_file(), now_ms())
        return True

    def authorize(self, address: str) -> bool:
        """May ``address`` connect (and be a member)? (the Peer decides:
        :meth:`hivemesh.core.peer.Peer.authorize`)."""
        return self.peer.authorize(address)

    def web(self) -> TrustWeb:
        """Our swarms' web of trust now (:mod:`hivemesh.core.views.trust`)."""
        self.sync_trust()
        return self.peer.web()

    async def revoke(self, address: str) -> None:
        """Revoke ``address``: drop its channel, forget it, refuse its new events."""
        public_key_of(address)
        self.trust.revoke(address, now_ms() // 1000)
        self.sync_trust()
        self.peer.command(TrustRevoke(address), now_ms())
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
        self.sync_trust()
        self.peer.command(Vouch(address, swarm), now_ms())
        self._schedule_flush()

    # -- membership and peers (the pump is in hivemesh.runtime.pump) --------------

    async def _on_peer(self, peer: str, up: bool) -> None:
        await self._ready.wait()
        if up:  # on probation, or an inviter not admitting us yet: the Peer holds it
            self.member_up(peer)
        else:
            self.peer.link_down(peer, self._lives.pop(peer, b""), now_ms())
        await self.flush()

    def member_up(self, peer: str) -> None:
        """A channel to ``peer`` is up and both sides admit each other: the
        Peer replicates with it (and joins membership through it if new)."""
        self.sync_trust()  # an invite redeemed just now admits it
        link = self.conns.links.get(peer)
        boot_id = link.boot_id if link is not None else b""
        endpoint = None
        if link is not None and link.endpoint is not None:
            endpoint = f"{link.endpoint[0]}:{link.endpoint[1]}"
        self._lives[peer] = boot_id
        self.peer.link_up(peer, boot_id, now_ms(), endpoint)

    def learn(self, address: str, endpoints: list[str]) -> None:
        """Keep dialling ``address`` at ``endpoints`` (if it may connect)."""
        if address == self.address or not self.authorize(address):
            return
        for ep in endpoints:
            if ep.startswith(UDP_PREFIX):  # a QUIC endpoint: runtime.paths dials it
                if self.paths is not None:
                    self.paths.learn_udp(address, ep[len(UDP_PREFIX) :])
                continue
            try:
                h, p = parse_endpoint(ep)
            except ConfigError:
                self.counters["bad_endpoint"] += 1
                continue
            self.conns.want(h, p, address)
