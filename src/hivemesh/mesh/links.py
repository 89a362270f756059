"""Broker links: the connection manager's interface over a broker's node messages.

Theory of operation
-------------------
The daemon talks to its peers through a connection manager
(:class:`hivemesh.runtime.connections.ConnectionManager`: ``send_fast``,
``send``, ``links``, ``want``, ``on_peer(peer, up)``, ...). In broker mode
:class:`BrokerLinks` stands in its place, so the Peer above runs unchanged:
its SWIM probes, direct messages and acknowledgements, anti-entropy HAVE/WANT,
blob fetches and lease votes travel as node messages of the broker
(:mod:`hivemesh.mesh.engine`), each batch of frames for one peer in one
signed envelope (:mod:`hivemesh.mesh.envelope`). The sender is the
envelope's signer, not the subject it came on.

**A link** to a peer exists while both sides are connected to the broker and
know each other's life (boot id):

* a node that connects (or reconnects) broadcasts ``HELLO`` on the swarm's
  presence channel, and again every ``hello_interval_s`` (lost presence
  messages are repaired so);
* a verified ``HELLO`` or ``FRAMES`` from an admitted peer (``authorize``)
  that is not linked links it (``on_peer(peer, True)``), and a node answers
  a ``HELLO`` from a peer it had not linked with a directed ``HELLO``, so
  both ends link within one round trip;
* a new boot id from a linked peer is a restart: down, then up;
* ``BYE`` (the peer stops), our broker connection dropping (every link goes
  down; they come back with the presence exchange on reconnect),
  or :meth:`disconnect` (also when the Peer closes a link: SWIM declared
  the member down and nothing came from it lately) end a link. SWIM, run by the Peer
  over these links, stays the only failure detector: a link is not ended
  for silence alone.

Frames from a peer that is not admitted are dropped and counted
(``mesh_unauthorized``); envelopes that fail to open are counted by error
code (``mesh_bad_signature``, ``mesh_broker_misrouted``,
``mesh_stale_envelope``, ``mesh_malformed``).

**Sending.** ``send_fast(peer, frame)`` appends to the peer's bounded
queue (``send_queue_frames``) and schedules one flush per loop iteration,
which seals everything queued for that peer into envelopes of at most
``_MAX_ENVELOPE_BYTES`` and hands them to the engine (core NATS and Redis
pub/sub buffer them while reconnecting). A full queue makes ``send_fast``
return False; ``send`` then waits for the flush. Node messages are
at-most-once, like datagrams on a lossy link: the protocols above
retransmit (direct messages until acknowledged, SWIM probes, anti-entropy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.identity import Identity, short
from hivemesh.errors import HivemeshError, RemoteProtocolError, TransportError, WouldBlock
from hivemesh.mesh.engine import BrokerEngine
from hivemesh.mesh.envelope import BYE, FRAMES, HELLO, open_envelope, seal_envelope

__all__ = ["BrokerLink", "BrokerLinks"]

log = logging.getLogger("hivemesh.mesh")

_MAX_ENVELOPE_BYTES = 512 * 1024  # under the 1 MiB default max_payload of nats-server
_INBOX_BATCHES = 1024
_OUTBOX_ENVELOPES = 8192

FramesCallback = Callable[[str, list[bytes]], Awaitable[None]]
FramesNowCallback = Callable[[str, list[bytes]], bool]
PeerCallback = Callable[[str, bool], Awaitable[None]]
SpawnLoop = Callable[[str, Callable[[], Any]], Any]


class _Counters:
    """What ``status`` reads as ``transport``: the links' traffic."""

    def __init__(self) -> None:
        self.values: Counter[str] = Counter()

    def snapshot(self) -> dict[str, int]:
        return dict(self.values)


@dataclass(eq=False)
class _Channel:
    """What the daemon's parts use of a link's channel: ``send_now``."""

    links: BrokerLinks
    address: str
    is_sending: bool = True

    def send_now(self, frame: bytes) -> None:
        """Queue ``frame`` for the next flush (raises WouldBlock when full)."""
        if not self.links.send_fast(self.address, frame):
            raise WouldBlock(f"broker queue for {self.address[:12]} is full")


@dataclass(eq=False)
class BrokerLink:
    """A linked peer (the fields the daemon reads of a link)."""

    address: str
    boot_id: bytes
    channel: _Channel
    since_s: float
    endpoint: tuple[str, int] | None = None
    frames_in: int = 0
    frames_out: int = 0
    queue: list[bytes] = field(default_factory=list)
    queued_bytes: int = 0


class BrokerLinks:
    """Links over a broker (module docs); the daemon's ``conns`` in broker mode."""

    def __init__(
        self,
        identity: Identity,
        engine: BrokerEngine,
        *,
        authorize: Callable[[str], bool],
        on_frames: FramesCallback,
        on_peer: PeerCallback,
        boot_id: bytes,
        spawn_loop: SpawnLoop,
        now_ms: Callable[[], int],
        send_queue_frames: int = 4096,
        hello_interval_s: float = 10.0,
        on_connected: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.identity = identity
        self.address = identity.address
        self.engine = engine
        self.swarm = engine.options.swarm
        self.boot_id = boot_id
        self._authorize = authorize
        self._on_frames = on_frames
        self._on_peer = on_peer
        self._spawn_loop = spawn_loop
        self._now_ms = now_ms
        self._queue_max = send_queue_frames
        self._hello_interval_s = hello_interval_s
        self._on_connected = on_connected
        #: the linked peers
        self.links: dict[str, BrokerLink] = {}
        self.counters: Counter[str] = Counter()
        self.transport_counters = _Counters()
        self.connected = False
        self._dirty: set[str] = set()
        self._flush_handle: asyncio.Handle | None = None
        self._flushed = asyncio.Event()
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(_INBOX_BATCHES)
        self._outbox: asyncio.Queue[tuple[str, bytes, int]] = asyncio.Queue(_OUTBOX_ENVELOPES)
        self._notes: deque[tuple[str, bool]] = deque()  # on_peer reports, in order
        self._noted = asyncio.Event()
        self._notify_lock = asyncio.Lock()
        self._closing = False
        self.listen_port: int | None = 0

    # -- lifecycle -----------------------------------------------------------

    async def listen(self, host: str, port: int) -> int:
        """Connect to the broker (``host``/``port`` are unused in broker mode),
        then await ``on_connected`` (broker mode starts reading the log there)."""
        await self.engine.start(self.address, self._on_node, self._on_node, self._on_state)
        self.connected = True
        if self._on_connected is not None:
            await self._on_connected()
        self._spawn_loop("mesh_engine", self.engine.run)
        self._spawn_loop("mesh_inbox", self._inbox_loop)
        self._spawn_loop("mesh_outbox", self._outbox_loop)
        self._spawn_loop("mesh_notify", self._notify_loop)
        self._spawn_loop("mesh_hello", self._hello_loop)
        return 0

    async def close(self) -> None:
        """Say BYE, send what is queued (briefly), disconnect."""
        self._closing = True
        with contextlib.suppress(HivemeshError, OSError, TimeoutError):
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()  # what the last flush queued (our "left" announcement)
            async with asyncio.timeout(1.0):  # the outbox loop is stopped by now
                while not self._outbox.empty():
                    to, data, n = self._outbox.get_nowait()
                    await self._send(to, data, n)
                await self.engine.send_presence(self._seal(BYE, "", []))
        for addr in sorted(self.links):
            self._down(addr, notify=False)
        await self.engine.close()

    def dial_targets(self) -> list[dict[str, Any]]:
        """No endpoints are dialled in broker mode."""
        return []

    def want(self, host: str, port: int, address: str | None = None) -> None:
        """Keep a link to ``address``: say HELLO to it if not linked (endpoints unused)."""
        if address and address != self.address and address not in self.links:
            self._spawn_send(address, HELLO)

    def forget(self, address: str) -> None:
        """Nothing to forget: no endpoints are kept."""

    # -- receiving -----------------------------------------------------------

    def _on_state(self, up: bool) -> None:
        self.connected = up
        self.counters["mesh_reconnected" if up else "mesh_disconnected"] += 1
        if up:
            self._spawn_send("", HELLO)
        else:
            for addr in sorted(self.links):
                self._down(addr)

    async def _on_node(self, data: bytes) -> None:
        """An envelope for us or the whole swarm: verify, then queue it (in order)."""
        try:
            env = open_envelope(data, self.swarm, self.address, self._now_ms())
        except RemoteProtocolError as exc:
            self.counters[f"mesh_{exc.code}"] += 1
            return
        if env.sender == self.address:
            return  # our own broadcast
        self.transport_counters.values["envelopes_in"] += 1
        await self._inbox.put((env.sender, env))

    async def _inbox_loop(self) -> None:
        while True:
            sender, env = await self._inbox.get()
            await self._handle(sender, env)

    async def _notify_loop(self) -> None:
        while True:
            await self._noted.wait()
            self._noted.clear()
            await self._drain_notes()

    async def _drain_notes(self) -> None:
        """Run the queued ``on_peer`` reports, one at a time, in order."""
        async with self._notify_lock:
            while self._notes:
                peer, up = self._notes.popleft()
                await self._on_peer(peer, up)

    async def _handle(self, sender: str, env: Any) -> None:
        if env.kind not in (HELLO, FRAMES, BYE):  # e.g. a telemetry envelope replayed here
            self.counters["mesh_wrong_kind"] += 1
            return
        if env.kind == BYE:
            link = self.links.get(sender)
            if link is not None and link.boot_id == env.boot_id:
                self._down(sender)
            return
        if not self._authorize(sender):
            self.counters["mesh_unauthorized"] += 1
            return
        link = self.links.get(sender)
        if link is not None and link.boot_id != env.boot_id:
            self.counters["peer_restarted"] += 1
            self._down(sender)
            link = None
        if link is None:
            link = self._up(sender, env.boot_id)
            if env.kind == HELLO:
                self._spawn_send(sender, HELLO)  # so it links us too
        if env.kind == FRAMES and env.frames:
            link.frames_in += len(env.frames)
            await self._drain_notes()  # the Peer learns of the link before its frames
            await self._on_frames(sender, env.frames)

    def _up(self, address: str, boot_id: bytes) -> BrokerLink:
        link = BrokerLink(address, boot_id, _Channel(self, address), time.time())
        self.links[address] = link
        self._note(address, True)
        return link

    def _note(self, address: str, up: bool) -> None:
        self.counters["peer_up_reports" if up else "peer_down_reports"] += 1
        self._notes.append((address, up))
        self._noted.set()

    def _down(self, address: str, *, notify: bool = True) -> None:
        link = self.links.pop(address, None)
        if link is None:
            return
        link.channel.is_sending = False
        if link.queue:
            self.counters["dropped_on_close"] += len(link.queue)
        self._dirty.discard(address)
        if notify:
            self._note(address, False)

    async def disconnect(
        self,
        address: str,
        reason: str,
        *,
        revoked: bool = False,
        error: HivemeshError | None = None,
    ) -> None:
        """End the link to ``address`` (it links again on its next message if admitted)."""
        if address in self.links:
            log.info("unlinking %s: %s", short(address), reason)
            self._down(address)

    # -- sending -------------------------------------------------------------

    def send_fast(self, peer: str, frame: bytes) -> bool:
        """Queue ``frame`` for ``peer``'s next envelope; False if not linked or full."""
        link = self.links.get(peer)
        if link is None or len(link.queue) >= self._queue_max:
            return False
        link.queue.append(frame)
        link.queued_bytes += len(frame)
        link.frames_out += 1
        self._dirty.add(peer)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)
        return True

    async def send(self, peer: str, frame: bytes) -> bool:
        """Queue ``frame``, waiting for a flush while the queue is full."""
        for _ in range(100):
            if peer not in self.links:
                self.counters["dropped_no_channel"] += 1
                return False
            if self.send_fast(peer, frame):
                return True
            self._flushed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._flushed.wait()
        self.counters["dropped_slow_peer"] += 1
        return False

    def _seal(self, kind: int, to: str, frames: list[bytes]) -> bytes:
        return seal_envelope(
            self.identity, self.swarm, kind, self.boot_id, to, self._now_ms(), frames
        )

    def _flush(self) -> None:
        """Seal what is queued per peer into envelopes and hand them to the engine."""
        self._flush_handle = None
        dirty, self._dirty = self._dirty, set()
        for peer in sorted(dirty):
            link = self.links.get(peer)
            if link is None or not link.queue:
                continue
            frames, link.queue, link.queued_bytes = link.queue, [], 0
            batch: list[bytes] = []
            size = 0
            for f in frames:
                if batch and size + len(f) > _MAX_ENVELOPE_BYTES:
                    self._publish(peer, batch)
                    batch, size = [], 0
                batch.append(f)
                size += len(f)
            if batch:
                self._publish(peer, batch)
        self._flushed.set()

    def _publish(self, peer: str, frames: list[bytes]) -> None:
        self._enqueue(peer, self._seal(FRAMES, peer, frames), len(frames))

    def _enqueue(self, to: str, data: bytes, n: int) -> None:
        try:
            self._outbox.put_nowait((to, data, n))
            self.transport_counters.values["envelopes_out"] += 1
        except asyncio.QueueFull:  # the broker does not keep up: like a full socket
            self.counters["mesh_outbox_full"] += 1
            self.transport_counters.values["frames_dropped"] += n

    async def _outbox_loop(self) -> None:
        while True:
            to, data, n = await self._outbox.get()
            await self._send(to, data, n)

    async def _send(self, to: str, data: bytes, n: int = 0) -> None:
        try:
            if to:
                await self.engine.send_node(to, data)
            else:
                await self.engine.send_presence(data)
        except TransportError:
            self.counters["mesh_send_failed"] += 1
            self.transport_counters.values["frames_dropped"] += n

    def _spawn_send(self, to: str, kind: int) -> None:
        if not self._closing:
            self._enqueue(to, self._seal(kind, to, []), 0)

    async def _hello_loop(self) -> None:
        """Announce ourselves now and every ``hello_interval_s`` (module docs)."""
        while True:
            if self.connected:
                await self._send("", self._seal(HELLO, "", []))
            await asyncio.sleep(self._hello_interval_s)

    def statistics(self) -> dict[str, Any]:
        """Per-peer figures for ``status``."""
        return {
            addr: {
                "direction": "broker",
                "endpoint": None,
                "since_s": round(link.since_s, 3),
                "boot_id": link.boot_id.hex(),
                "frames_in": link.frames_in,
                "frames_out": link.frames_out,
                "send_queue_frames": len(link.queue),
            }
            for addr, link in sorted(self.links.items())
        }
