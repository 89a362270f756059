"""Broker mode's hooks into the daemon: links and the journal's log over a broker.

``hivemesh up --mesh nats://127.0.0.1:4222?swarm=team`` (or ``mesh = ...`` in
``config.toml``) runs the same Peer with a broker in place of peer links
(:mod:`hivemesh.mesh`): the daemon calls :func:`open_links` for its
connection manager and :func:`start_feedlog` once it runs; everything above
(context, planner, names, leases, telemetry, faces) is unchanged.
docs/broker.md has the whole picture.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hivemesh.core.codec import unpack
from hivemesh.core.event import Event
from hivemesh.errors import HivemeshError, RemoteProtocolError
from hivemesh.leases import LeaseClient, open_backend
from hivemesh.mesh import BrokerLinks, FeedLog, MeshOptions, open_engine, parse_mesh_url
from hivemesh.mesh.envelope import TELEMETRY, open_envelope, seal_envelope
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.supervise import RESTART
from hivemesh.transports.noise import BOOT_ID_BYTES

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "lease_client",
    "lease_url",
    "open_links",
    "publish_telemetry",
    "start_feedlog",
    "start_telemetry_consumer",
    "stop_broker",
]


#: How long the daemon's start waits, once the broker is connected, for the
#: log reader to ask for its first entries (:func:`open_links`).
_READ_START_S = 0.25


def open_links(d: Daemon) -> BrokerLinks:
    """The daemon's ``conns`` in broker mode (connected by ``listen``), with
    a boot id of its own for this life of the node. The journal's log reader
    (:attr:`Daemon.feedlog`) starts as soon as the broker is connected, and
    ``listen`` returns once it has asked for the log's first entries (the
    engine's ``requested``, at most :data:`_READ_START_S`): the broker reads
    and sends them while the daemon finishes starting, so a late joiner's
    first entries are waiting when the node is ready for them (its
    ``_on_frames`` waits for that). Before, the reader ran only at the
    start's first wait, after all of it (inbox, telemetry spool, the GC
    freeze: 0.1-0.2 s under load), and the broker started sending only then.
    The Peer knows from the start that the log brings the backlog (no
    anti-entropy pulls of it over the links)."""
    assert d.config.mesh is not None
    engine = open_engine(parse_mesh_url(d.config.mesh))
    feedlog = d.feedlog = _feedlog(d, engine)

    def spawn(name: str, factory: Any) -> None:
        d.supervisor.spawn(name, factory, RESTART)

    async def connected() -> None:
        spawn("mesh_read", feedlog.read_loop)
        with contextlib.suppress(TimeoutError):  # a slow broker: the reader goes on alone
            async with asyncio.timeout(_READ_START_S):
                await engine.requested.wait()

    return BrokerLinks(
        d.identity,
        engine,
        authorize=d.invites.admit_channel,
        on_frames=d._on_frames,
        on_peer=d._on_peer,
        boot_id=secrets.token_bytes(BOOT_ID_BYTES),
        spawn_loop=spawn,
        now_ms=now_ms,
        send_queue_frames=d.config.send_queue_frames,
        on_connected=connected,
    )


class _OwnEvents:
    """A subscriber of the daemon's delivered events that wakes the publisher
    when our own feed's head moved (looked at once per delivered batch, not
    per event; its ``dropped`` is always 0: it keeps nothing)."""

    kinds = None
    dropped = 0

    def __init__(self, me: bytes, feedlog: FeedLog) -> None:
        self._me, self._feedlog, self._seen = me, feedlog, 0

    def offer_many(self, events: tuple[Event, ...]) -> None:
        head = self._feedlog.node.journal.head(self._me).seq
        if head != self._seen:
            self._seen = head
            self._feedlog.grew()


def _feedlog(d: Daemon, engine: Any) -> FeedLog:
    store, journal = d._store, d.node.journal

    def commit() -> bool:
        """Commit what was handed over (the cursor may pass it only then)."""
        if journal.unsettled:
            return False
        try:
            store.sync()
        except HivemeshError:
            return False
        return not store.pending

    return FeedLog(
        d.node, engine, d.config.data_dir, on_frames=d._on_frames, committed=commit, now_ms=now_ms
    )


def start_feedlog(d: Daemon) -> FeedLog:
    """Publish our feed to the broker's log (supervised loops); the reader
    runs since the broker connected (:func:`open_links`)."""
    feedlog: FeedLog = d.feedlog
    d._subs.append(_OwnEvents(d.identity.public, feedlog))  # type: ignore[arg-type]
    sup = d.supervisor
    sup.spawn("mesh_publish", feedlog.publish_loop, RESTART)
    sup.spawn("mesh_cursor", feedlog.cursor_loop, RESTART)
    return feedlog


def lease_url(o: MeshOptions) -> str:
    """The lease backend of a mesh: the JetStream KV bucket ``hm_<swarm>_leases``
    on the same NATS, or keys ``hm:<swarm>:lease:*`` on the same Redis."""
    auth = f"{o.username}:{o.password or ''}@" if o.username else ""
    if o.engine == "redis":
        scheme = "rediss" if o.tls else "redis"
        return f"{scheme}://{auth}{o.host}:{o.port}/{o.db}?prefix=hm:{o.swarm}:lease:"
    scheme = "tls" if o.tls else "nats"
    return f"{scheme}://{auth}{o.host}:{o.port}/hm_{o.swarm}_leases"


def lease_client(d: Daemon) -> LeaseClient:
    """In broker mode the node's leases live on the broker's own lease engine
    (:func:`lease_url`), not on the embedded quorum; holder id = our address
    (the daemon keeps it and closes it at stop)."""
    assert d.config.mesh is not None
    return LeaseClient(open_backend(lease_url(parse_mesh_url(d.config.mesh))), d.address)


async def stop_broker(d: Daemon) -> None:
    """At stop, after the links closed: save the log position."""
    if d.feedlog is not None:
        d.feedlog.close()


# -- telemetry through the collectors' shared queue ----------------------------------
#
# In broker mode a sender's spooled batches go into a durable queue that every
# collector reads through one shared consumer group (JetStream durable consumer
# "collectors" / Redis consumer group "collectors"): each batch reaches one
# collector and leaves the queue only when that collector acknowledged it stored.
# The sender drops a batch from its spool once the *queue* holds it durably.
# Gaps: a sender's seqs are split between the collectors, so one collector's
# holes (``metrics gaps``) are what the others stored; a gap is a seq no
# collector holds once the queue is drained (docs/broker.md).

_FOREVER_MS = 10**15  # queued telemetry may wait long: no time window (envelope docs)


async def publish_telemetry(d: Daemon, payload: bytes) -> Mapping[str, Any]:
    """Deliver one spooled batch into the collectors' queue (signed by us);
    the ack the sender expects, once the queue holds it durably."""
    conns: Any = d.conns
    env = seal_envelope(d.identity, conns.swarm, TELEMETRY, conns.boot_id, "", now_ms(), [payload])
    digest = hashlib.blake2b(payload, digest_size=16).hexdigest()
    await conns.engine.publish_telemetry(d.address, f"{d.address}:{digest}", env)
    head = unpack(payload)
    hi = head.get("hi") if isinstance(head, dict) else None
    if type(hi) is not int:
        return {"ok": False, "error": "malformed", "detail": "batch without its spool head"}
    # the whole batch is in the queue: the sender acks up to its last seq (<= hi)
    return {"ok": True, "acked_through": hi}


def start_telemetry_consumer(d: Daemon, collector: Any) -> None:
    """On a collector node: take batches from the shared queue (a supervised loop)."""
    conns: Any = d.conns
    engine, swarm = conns.engine, conns.swarm
    counters = conns.counters

    async def on_record(data: bytes) -> bool:
        try:
            env = open_envelope(data, swarm, d.address, now_ms(), window_ms=_FOREVER_MS)
        except RemoteProtocolError as exc:
            counters[f"mesh_telemetry_{exc.code}"] += 1
            return True  # never valid: drop it from the queue
        if env.kind != TELEMETRY or len(env.frames) != 1:
            counters["mesh_telemetry_malformed"] += 1
            return True
        ack = await collector.handle_message(env.sender, env.frames[0])
        if ack.get("ok"):
            counters["mesh_telemetry_batches"] += 1
            return True
        if ack.get("error") in ("busy", "store_error", "store_corrupt", "internal_error"):
            counters["mesh_telemetry_retry"] += 1
            return False  # delivered again (to us or another collector)
        counters["mesh_telemetry_refused"] += 1
        return True

    d.supervisor.spawn(
        "mesh_telemetry", lambda: engine.consume_telemetry(d.address, on_record), RESTART
    )
