"""The node daemon: an asyncio pump around the sans-IO core.

Theory of operation
-------------------
One class, no mixins: the wiring and lifecycle, the client API (what the
control socket's handlers and :class:`hivemesh.Node` ask of a running node:
views and subscriptions, context writes, appends, names, direct messages,
status) and the pump below.

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

* **Inline input.** Frames reach :meth:`Daemon._on_frames_now` straight
  from a channel's read callback while that link's reader is idle and nothing
  waits in the pump (no task woken per read); otherwise the link's reader
  task hands them to :meth:`Daemon._on_frames`, in order behind what is
  queued (see :mod:`hivemesh.runtime.connections`). The inline path never
  waits: a frame the connection manager cannot take at once (a full send
  queue, no link yet, a handover) goes to ``_unsent``, and a flush task
  sends it (and everything after it, in order) through
  :meth:`ConnectionManager.send`, waiting for room -- the backpressure
  reaches the readers, since inline input is declined while anything is
  unsent.
* **Group commit.** Batches received from peers, our own logged appends and
  attested runs' signature checks are committed together at most
  ``commit_delay_ms`` after the first of them (``peer.settle``, whose
  ``Fsync`` effect syncs the store).

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

**Parts wired in.** The Peer; direct messages' durable inbox and handlers
(:mod:`hivemesh.runtime.messaging`), invites (:mod:`hivemesh.runtime.invites`),
leases (:mod:`hivemesh.runtime.leases`), and any application view added with
:meth:`Daemon.add_view` (verified replay first). Only one daemon runs per
data dir (``daemon.lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import os
import random
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hivemesh import commands as c
from hivemesh.commands.names import NameClaim, NameClaimReply
from hivemesh.commands.peer import (
    CommitContext,
    FetchBlob,
    Learn,
    Leave,
    Request,
    Resolve,
    Vouch,
)
from hivemesh.commands.trust import TrustRevoke
from hivemesh.config import Config, bootstrap_targets
from hivemesh.core.answers import export_pending
from hivemesh.core.dialer import UDP_PREFIX
from hivemesh.core.dialer import routes as dial_routes
from hivemesh.core.direct import DirectConfig
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
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity, public_key_of, short
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.peer import Peer, PeerConfig, TrustFile
from hivemesh.core.pex import MembershipConfig
from hivemesh.core.restarts import RESTART_WATCHED, Streak
from hivemesh.core.trace import Trace
from hivemesh.core.views.blobs import BlobIndex, blob_digest
from hivemesh.core.views.context import Context, ContextView
from hivemesh.core.views.endpoints import EndpointsView
from hivemesh.core.views.names import NamesView
from hivemesh.core.views.trust import TrustView, TrustWeb
from hivemesh.error_codes import error_class
from hivemesh.errors import (
    HivemeshError,
    InvalidAddress,
    InvalidArgument,
    LocalProtocolError,
    UnknownCommand,
)
from hivemesh.leases import LeaseClient
from hivemesh.runtime.apps import APPS, App, load
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.runtime.hostutil import lock_data_dir, primary_ipv4, raise_open_files_limit
from hivemesh.runtime.invites import Invites
from hivemesh.runtime.leases import MeshClaims, VoterDisk, lease_client
from hivemesh.runtime.messaging import Messaging
from hivemesh.runtime.rehydration import Rehydration
from hivemesh.runtime.status import Subscription, peers_of, status_of
from hivemesh.runtime.supervise import Supervisor, TaskFailed
from hivemesh.stores.feedmark import FileMarkStore, open_mark
from hivemesh.transports import ChannelOptions
from hivemesh.transports.noise import BOOT_ID_BYTES
from hivemesh.trust import TrustStore

__all__ = ["Daemon", "Subscription", "membership_config", "now_ms"]

log = logging.getLogger("hivemesh.runtime")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


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


A = TypeVar("A")


class Daemon:
    """One running node (see module docs)."""

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
        self.trust_view: TrustView
        self.invites = Invites(self)
        self._marks: FileMarkStore
        self._mdns: Any = None
        self._lock_fd: int | None = None
        self._trust_generation = 0
        self._calls: dict[int, asyncio.Future[Any]] = {}  # command rid -> its caller
        #: group commits failed in a row (a full disk, I/O errors): which are logged
        self._commit_streak = Streak()
        #: the Peer's recorded inputs and effects (``trace_peer`` only)
        self.trace: Trace | None = None
        self.advertised = ""
        #: the lease voter's files (:mod:`hivemesh.runtime.leases`)
        self.voter_disk = VoterDisk(config.data_dir, synced=self._lease_synced)
        #: what a start opened so far, with its closer (undone if the start fails)
        self._opened: list[tuple[str, Callable[[], object]]] = []
        self._lease_client: LeaseClient | None = None
        self.claims: MeshClaims
        #: broker mode's journal log (:mod:`hivemesh.mesh.feedlog`), else None
        self.feedlog: Any = None
        #: QUIC, relays and hole punching (runtime.paths), when configured
        self.paths: Any = None
        #: the applications running in it (:mod:`hivemesh.runtime.apps`), in start order
        self.apps: list[App] = []

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
        """Close what :meth:`_start` opened, the newest first (each part
        registered its closer in ``_opened`` as it opened); a closer that
        fails is logged, and the rest still run."""
        await self.supervisor.close()
        while self._opened:
            what, close = self._opened.pop()
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("closing the %s after a failed start", what)
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
        self.trust = TrustStore(
            cfg.data_dir,
            min_refresh_s=1.0,  # the timer loop's poll() catches edits
            on_load_error=self._trust_unreadable,  # keeps the last good trust
        )
        self._trust_generation = self.trust.generation
        # Received batches and our own (logged) join one commit per commit_delay_ms.
        store = self._store = SQLiteStore(cfg.store_path, group_commit=cfg.commit_delay_ms > 0)
        self._opened.append(("store", store.close))
        power = store.durability == "power"
        self._marks = open_mark(cfg.data_dir, self.identity.public, store, fsync=power)
        self._opened.append(("own feed's mark", self._marks.close))
        self.started_ms = now_ms()
        seed = secrets.randbits(128)
        lease_setup = self.voter_disk.open()
        self._opened.append(("lease voter log", self.voter_disk.close))
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
        self._opened.append(("verified runs", self.node.settle))  # stored before the store closes
        self.context_view = peer.context
        self.names = peer.names
        self.endpoints = peer.endpoints
        self.trust_view = peer.trust_view
        self.claims = MeshClaims(self)  # over the Peer's claims view
        from hivemesh.runtime.control import ControlServer

        self._control = ControlServer(self, cfg.control_path, timeout_s=cfg.control_timeout_s)
        await self._control.start()  # answers status while the views are rebuilt
        self._opened.append(("control socket", self._control.close))
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
        self._opened.append(("connections", self.conns.close))
        self.listen_port = await self.conns.listen(host, port)
        if cfg.udp or cfg.relays or cfg.relay_role or cfg.stun:
            from hivemesh.runtime.paths import NodePaths

            self.paths = NodePaths(self)
            self._opened.append(("paths", self.paths.close))
            await self.paths.start(host, self.listen_port)
        endpoint = self.advertised = self._announce(host)
        t = now_ms()
        self.messaging = Messaging(self, cfg.data_dir / "inbox.db", inbox_max=cfg.inbox_max)
        self._opened.append(("inbox", self.messaging.close))
        self._ready.set()
        if cfg.mdns:
            from hivemesh.discovery.mdns import LanDiscovery

            self._mdns = LanDiscovery(
                self.address,
                self.listen_port,
                interfaces=cfg.mdns_interfaces,
                on_found=lambda found: self.learn(found.address, list(found.endpoints)),
                spawn=self.supervisor.watch,  # resolvers: a failure is logged and counted
            )
            await self._mdns.start()
            self._opened.append(("mDNS discovery", self._mdns.close))
        endpoints = [endpoint]
        if self.paths is not None and cfg.udp:  # QUIC on the same port over UDP
            endpoints.append(f"{UDP_PREFIX}{endpoint}")
        peer.start(endpoints, t)  # the appends of a new life (errors: no start)
        for address, eps in self.endpoints.known().items():
            peer.command(Learn(address, tuple(eps)), t)  # dialled by the flush below
        for addr, h, p in bootstrap_targets(cfg.bootstrap):
            self.conns.want(h, p, addr)
        for spec in APPS:  # applications (runtime.apps)
            app = load(spec)(self)
            await app.start()
            self.apps.append(app)
            self._opened.append((app.name, app.stop))
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
        # collection (~100 ms loop stalls under load). Collect first so no
        # garbage is frozen: fully if views were restored or replayed, else
        # the young generations only (a full pass: 25-75 ms, found 0-5 objects).
        gc.collect(2 if self.rehydration.total else 1)
        gc.freeze()
        log.info(
            "node %s listening on %s:%d (%d events replayed)",
            short(self.address),
            host,
            self.listen_port,
            self.rehydrated,
        )
        self._opened.clear()  # started: stop() closes everything from now on

    async def stop(self) -> None:
        """Shut down cleanly: stop serving, close channels, close the store."""
        if not self._started:
            return
        self.supervisor.closing()
        for app in reversed(self.apps):  # telemetry sends what is spooled, briefly
            await app.stop()
        self._started = False
        self._stopping.set()
        if self._control is not None:
            await self._control.close()
        await self.supervisor.stop_loops()
        await self.supervisor.drain()  # the flushes, disconnects and trust re-checks under way
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
        if self._lease_client is not None:
            await self._lease_client.aclose()
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
        (holder id: this node's address; :mod:`hivemesh.runtime.leases`), or in
        broker mode over the broker's lease engine (:mod:`hivemesh.runtime.broker`)."""
        if self._lease_client is None:
            if self.config.mesh is not None:  # broker mode: the broker's KV
                from hivemesh.runtime.broker import lease_client as broker_leases

                self._lease_client = broker_leases(self)
            else:
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

    # -- the client API: what the control socket and hivemesh.Node ask ----------------

    @property
    def address(self) -> str:
        """This node's address."""
        return self.node.address

    def add_view(self, view: Any) -> int:
        """Register an application view (a reducer with ``kinds`` and
        ``apply(event)``); it first gets every stored event of its kinds
        (verified replay), then every new one. Returns the replayed count."""
        kinds = frozenset(view.kinds)
        n = 0
        self.node.settle()  # every applied event is in the store, so none is missed
        for ev in self._replay(self.node.journal.store):
            if "*" in kinds or ev.kind in kinds:
                view.apply(ev)
                n += 1
        self.node.add_view(view)
        return n

    def subscribe(self, kinds: Iterable[str] | None = None) -> Subscription:
        """A bounded queue receiving new events (of ``kinds``, or all)."""
        sub = Subscription(frozenset(kinds) if kinds is not None else None)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop feeding ``sub``; its drops are added to the counters."""
        if sub in self._subs:
            self._subs.remove(sub)
            self.counters["subscriber_dropped"] += sub.dropped

    def context(self, name: str = "default") -> Context:
        """A handle on a shared context; call :meth:`commit` after writing."""
        return self.context_view.context(name)

    async def commit(self) -> int:
        """Append pending local context writes to our feed and send them."""
        n = self.commit_nowait()
        await self.flush()
        return n

    def commit_nowait(self) -> int:
        """Append pending local context writes (sent by the next flush).

        If the append fails (a full disk, a feed that takes no writes yet),
        the writes it did not store stay pending in the context and go out
        with the next commit that succeeds; the error propagates
        (:func:`hivemesh.core.answers.commit_items`)."""
        items = export_pending(self.context_view)
        n: int = self.call_now(CommitContext(items)) if items else 0
        return n

    async def append(self, kind: str, body: Any) -> Event:
        """Append one event of our own and send it."""
        ev: Event = await self.call(c.Append(kind, body))
        return ev

    async def claim_name(self, name: str) -> str:
        """Claim ``name`` for this node; returns the current owner."""
        reply: NameClaimReply = await self.call(NameClaim(name))
        return reply.owner

    def resolve(self, target: str) -> str:
        """An address for ``target`` (an address or a claimed name; the Peer's
        :meth:`~hivemesh.core.peer.Peer.resolve`)."""
        return self.peer.resolve(target)

    async def wait_resolved(self, target: str, *, timeout_s: float) -> str:
        """:meth:`resolve` ``target``, waiting up to ``timeout_s`` for a name
        that is not known yet; raises :class:`DeadlineExceeded` then."""
        address: str = await self.call(Resolve(target, timeout_s))
        return address

    def status(self) -> dict[str, Any]:
        """Everything ``hivemesh status`` shows (see :mod:`hivemesh.runtime.status`),
        with every feed's head under ``journal.heads``
        (:func:`hivemesh.core.answers.journal_heads`)."""
        st = status_of(self)
        if not self.rehydration.is_complete:  # starting: the parts below do not exist yet
            return st
        for app in self.apps:
            st[app.name] = app.status()
        return st

    def peers(self) -> list[dict[str, Any]]:
        """Known members with their channel figures."""
        return peers_of(self)

    async def send_direct(self, to: str, data: Any, *, timeout_s: float) -> dict[str, Any]:
        """Send an acknowledged direct message to an address or a name.

        Returns when the receiver acknowledged (it is in its inbox); raises
        :class:`DeadlineExceeded` if no ack came within ``timeout_s``. To a
        name an application takes (``metrics-collector``: telemetry, returned
        once the collector stored it), that application's reply.
        """
        for app in self.apps:
            if to in app.addressees:
                return await app.deliver(to, data, timeout_s=timeout_s)
        address = self.resolve(to)
        t0 = time.perf_counter()
        result: dict[str, Any] = await self.call(c.Send(address, data, timeout_s))
        result["rtt_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return result

    def app(self, kind: type[A]) -> A:
        """The running application of class ``kind`` (:mod:`hivemesh.runtime.apps`)."""
        for app in self.apps:
            if isinstance(app, kind):
                return app
        raise LocalProtocolError(f"no {kind.__name__} runs in this daemon")

    async def app_command(self, req: c.Command) -> c.Reply:
        """Run ``req`` by the application that answers it."""
        for app in self.apps:
            handler = app.commands().get(type(req))
            if handler is not None:
                return await handler(req)
        raise UnknownCommand(f"no application of this daemon answers {req.op!r}")

    def inbox(self, limit: int = 100, *, remove: bool = False) -> list[dict[str, Any]]:
        """Direct messages received, oldest first (removed if ``remove``)."""
        return self.messaging.inbox.list(limit, remove=remove)

    async def request(self, to: str, kind: str, body: Any, *, timeout_s: float) -> Any:
        """Send a request to a handler of ``kind`` on ``to``; return its reply
        (:mod:`hivemesh.core.mailbox`)."""
        return await self.call(Request(self.resolve(to), kind, body, timeout_s))

    async def ping(self, target: str, *, timeout_s: float) -> dict[str, Any]:
        """Round-trip time to a connected peer (by address or name; the Peer
        refuses one it has no link to: UnknownPeer)."""
        address = self.resolve(target)
        t0 = time.perf_counter()
        await self.call(c.Ping(address, timeout_s))
        return {"address": address, "rtt_ms": round((time.perf_counter() - t0) * 1000, 3)}

    async def put_blob(self, data: bytes, mime: str, name: str | None) -> bytes:
        """Store ``data`` and announce it (only the announcement is gossiped;
        :mod:`hivemesh.core.views.blobs`); returns its digest."""
        kind, body = BlobIndex.encode_put(data, mime, name)
        digest = blob_digest(data)
        self.node.journal.store.put_blob(digest, data)
        await self.append(kind, body)
        return digest

    async def get_blob(self, ref: str, *, timeout_s: float) -> bytes:
        """The bytes of blob ``ref`` (hex digest or name): local, or fetched
        from its holders by the Peer (``FetchBlob``) and verified."""
        data: bytes = await self.call(FetchBlob(self.peer.blob_index.resolve(ref), timeout_s))
        return data

    def invite(self, ttl_s: int = 3600, swarm: str | None = None) -> dict[str, Any]:
        """A single-use invite token for a new node into ``swarm`` (default:
        our home swarm): ``{token, inviter, expires_s, swarm}``."""
        return self.invites.issue(ttl_s, now_ms(), swarm)

    async def join(self, token: str, *, timeout_s: float) -> dict[str, Any]:
        """Join the swarm of the node that issued ``token``.

        Returns ``{inviter, endpoints, seconds}`` once the inviter admitted
        this node; raises the cause of a refusal (:class:`InviteUsed`,
        :class:`InviteExpired`, :class:`InviteUnknown`, :class:`InviteRevoked`,
        :class:`UnknownPeer`, :class:`PeerIdentityMismatch`, a bad token's
        :class:`InviteError`) or :class:`DeadlineExceeded` after ``timeout_s``
        (see :mod:`hivemesh.runtime.invites`).
        """
        if not 0 < timeout_s <= 3600:
            raise InvalidArgument("timeout_s must be in (0, 3600]")
        d = self
        result: dict[str, Any] = await d.invites.join(token, now_ms(), timeout_s=timeout_s)
        return result

    def check_address(self, address: str) -> str:
        """Validate an address argument (raises :class:`InvalidArgument`)."""
        try:
            public_key_of(address)
        except InvalidAddress as exc:
            raise InvalidArgument(str(exc)) from None
        return address

    # -- the pump: frames in, effects out, timers, group commit ---------------------

    async def _on_frames(self, peer: str, frames: list[bytes]) -> None:
        """A batch of frames read from ``peer`` at once: handle them all, then
        flush once (outputs wait at most one batch, 64 frames)."""
        await self._ready.wait()
        await self.flush(deadlines=self.peer.receive_many(peer, frames, now_ms()))

    def _on_frames_now(self, peer: str, frames: list[bytes]) -> bool:
        """:meth:`_on_frames` inline from the channel's read callback, when
        nothing could make it wait (else False: the reader task takes them)."""
        if self._flush_lock.locked() or self._unsent or not self._ready.is_set():
            return False
        self._flush_now(deadlines=self.peer.receive_many(peer, frames, now_ms()))
        return True

    def disconnect_later(self, peer: str, reason: str, error: HivemeshError | None = None) -> None:
        """Close the channel to ``peer`` from synchronous code (the peer's CLOSE
        carries ``error``'s code)."""
        self.supervisor.spawn_once("disconnect", self.conns.disconnect(peer, reason, error=error))

    async def flush(self, *, deadlines: bool = True) -> None:
        """Drain the core's outbox and events (see module docs).

        ``deadlines=False`` (the Peer said its deadline did not move:
        :meth:`~hivemesh.core.peer.Peer.receive_many`) skips looking for a
        new earlier timer unless the flush sent something.
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
        if isinstance(e, Deliver):  # the whole batch: one call per subscriber, not per event
            for sub in self._subs:
                sub.offer_many(e.events)
        elif isinstance(e, Count):
            self.counters[e.name] += e.n
        elif isinstance(e, Dial):
            self._dial(e)
        elif isinstance(e, Close):
            if e.forget:
                self.conns.forget(e.peer)
            error = None if e.code is None else error_class(e.code)(e.reason)
            self.disconnect_later(e.peer, e.reason, error)  # the peer's CLOSE carries the code
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
        except HivemeshError as exc:  # disk full, I/O error: retried at the next commit
            self._commit_failed(exc)
            return
        if ended := self._commit_streak.ok():
            log.warning("group commit works again after %d failures", ended)

    def _commit_failed(self, exc: HivemeshError) -> None:
        """Count a failed commit; log the ones core.restarts.Streak says to."""
        self.counters["group_commit_failed"] += 1
        if self._commit_streak.failed():
            n = self._commit_streak.failing
            log.warning("group commit failed (%s, %d in a row, retried): %s", exc.code, n, exc)

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
        except HivemeshError as exc:  # disk full, I/O error: retried at the next commit
            self._commit_failed(exc)
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

    # -- membership and peers ---------------------------------------------------------

    async def _on_peer(self, peer: str, up: bool) -> None:
        await self._ready.wait()
        if up:  # on probation, or an inviter not admitting us yet: the Peer holds it
            self.member_up(peer)
        else:
            # the life the Peer linked (none if it held the peer on probation)
            self.peer.link_down(peer, self.peer.links.get(peer, b""), now_ms())
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
        self.peer.link_up(peer, boot_id, now_ms(), endpoint)

    def _dial(self, e: Dial) -> None:
        """Dial what the Peer decided to, by transport (:func:`~hivemesh.core.dialer.routes`)."""
        routes = dial_routes(e.endpoints)
        if routes.bad:
            self.counters["bad_endpoint"] += routes.bad
        for host, port in routes.tcp:
            self.conns.want(host, port, e.address)
        for endpoint in routes.udp if self.paths is not None else ():
            self.paths.learn_udp(e.address, endpoint)  # QUIC: runtime.paths dials it

    def learn(self, address: str, endpoints: list[str]) -> None:
        """``address`` is found at ``endpoints``: the Peer decides whether to dial it."""
        self.peer.command(Learn(address, tuple(endpoints)), now_ms())
        self._carry_out()
