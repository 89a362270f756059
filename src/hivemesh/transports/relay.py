"""The relay over QUIC: a relay service, and a client's circuits through it.

Theory of operation
-------------------
A node with the relay role runs a :class:`RelayService` on its QUIC
endpoint (relay channels: ALPN ``hivemesh-relay/1``): it feeds each relay
channel's frames to :class:`~hivemesh.transports.relay_policy.RelayTable`
and sends what the table answers. Forwarding awaits the outgoing channel's
send queue, so a slow end slows its sender down.

A node behind a NAT runs a :class:`RelayClient` per relay it uses: it keeps
a reservation (RESERVE) so that others can reach it, opens circuits
(:meth:`RelayClient.open`) and accepts them (INCOMING). On a circuit runs
the *same* secure channel as on TCP (:mod:`hivemesh.transports.streams`),
end to end between the two nodes: the relay forwards Noise records it can
neither read nor forge, and both ends check each other's identity and trust
exactly as on a direct link. A relayed channel's ``path`` is
``"relay:<relay address>"``.

The relay also carries PUNCH messages: :meth:`RelayClient.punch` offers our
candidates for a circuit's other end; the relay forwards them with our
observed address first, and answers with the other end's observed address,
so both ends learn where to punch (:mod:`hivemesh.transports.punch`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    ConnectionClosed,
    DecodeError,
    HivemeshError,
    PeerUnreachable,
    WouldBlock,
)
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.noise import StaticCredentials
from hivemesh.transports.pipe import PipeTransport, open_pipe
from hivemesh.transports.quic import QuicEndpoint
from hivemesh.transports.relay_policy import Forward, RelayTable
from hivemesh.transports.relay_wire import (
    Kind,
    Message,
    Punch,
    data_frames,
    decode,
    encode,
    parse_hostport,
)
from hivemesh.transports.session import ChannelOptions
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.streams import PROCESS_BOOT_ID, TaskSet, secure_accept, secure_dial

__all__ = ["RelayClient", "RelayService"]

_log = logging.getLogger(__name__)
HostPort = tuple[str, int]


class RelayService:
    """The relay role on one node (see the module docs)."""

    def __init__(
        self,
        table: RelayTable | None = None,
        *,
        send_timeout_s: float = 10.0,
        tap: Callable[[bytes], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table if table is not None else RelayTable()
        #: Optional observer of every forwarded DATA payload (tests check
        #: that it is ciphertext).
        self.tap = tap
        self._send_timeout_s = send_timeout_s
        self._clock = clock
        self._peers: dict[str, SecureChannel] = {}

    @property
    def counters(self) -> dict[str, int]:
        """The relay's counters (``relay_bytes``, ``relay_refused_<code>``, ...)."""
        return dict(sorted(self.table.counters.items()))

    async def _send(self, forward: Forward) -> None:
        for peer, msg in forward.sends:
            channel = self._peers.get(peer)
            if channel is None:
                self.table.counters["relay_dropped_no_channel"] += 1
                continue
            if self.tap is not None and msg.kind == Kind.DATA:
                self.tap(msg.data)
            try:
                await channel.send(encode(msg), timeout_s=self._send_timeout_s)
            except HivemeshError:
                self.table.counters["relay_send_failed"] += 1
                channel.close()

    async def handle(self, channel: SecureChannel) -> None:
        """Serve one relay channel until it ends (the QUIC endpoint's ``on_relay_channel``)."""
        peer, table = channel.peer_address, self.table
        old = self._peers.get(peer)
        if old is not None:
            old.close()
        self._peers[peer] = channel
        await self._send(table.link_up(peer, channel.remote_endpoint))
        try:
            while True:
                for frame in await channel.recv_batch():
                    forward = table.receive(peer, frame, self._clock())
                    if forward.delay_s:
                        await asyncio.sleep(forward.delay_s)
                    await self._send(forward)
        except ConnectionClosed:
            pass
        finally:
            if self._peers.get(peer) is channel:
                del self._peers[peer]
                await self._send(table.link_down(peer))


@dataclass(eq=False)
class _Circuit:
    cid: int
    peer: str
    pipe: PipeTransport | None = None
    outq: list[bytes] = field(default_factory=list)
    queued: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Future[None] | None = None
    writer: asyncio.Task[None] | None = None
    closed: bool = False
    close_pending: bool = False


class RelayClient:
    """A node's relay channel to one relay, and its circuits (see module docs)."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        identity: Identity,
        relay_address: str,
        relay_endpoint: HostPort,
        *,
        authorize: Authorize,
        on_channel: Callable[[SecureChannel], Awaitable[None]],
        on_punch: Callable[[RelayClient, str, int, tuple[HostPort, ...]], None] | None = None,
        on_observed: Callable[[str, HostPort], None] | None = None,
        options: ChannelOptions | None = None,
        counters: TransportCounters | None = None,
        boot_id: bytes | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.identity = identity
        self.relay_address = relay_address
        self.relay_endpoint = relay_endpoint
        self.counters = counters if counters is not None else TransportCounters()
        self.channel: SecureChannel | None = None
        self.reserved = False
        #: Seconds between reservation renewals (see :meth:`_keepalive`).
        self.keepalive_s = 5.0
        self._authorize = authorize
        self._on_channel = on_channel
        self._on_punch = on_punch
        self._on_observed = on_observed
        self._opts = options or ChannelOptions()
        self._boot_id = boot_id
        self._creds = StaticCredentials.generate(
            identity, secrets.token_bytes, boot_id=PROCESS_BOOT_ID if boot_id is None else boot_id
        )
        self._circuits: dict[int, _Circuit] = {}
        self._ids = itertools.count(1)
        self._tasks = TaskSet(self.counters, "relay_task")
        self._reserved = asyncio.Event()

    @property
    def path(self) -> str:
        """The ``path`` of channels through this relay."""
        return f"relay:{self.relay_address}"

    async def start(self, *, reserve: bool = True, timeout_s: float = 5.0) -> None:
        """Open the relay channel (and reserve: others may reach us through it).
        Called again once the channel ended (the relay restarted), it opens a
        new one and reserves afresh."""
        host, port = self.relay_endpoint
        self.reserved = False
        self._reserved = asyncio.Event()
        self.channel = await self.endpoint.dial(
            host, port, expect_address=self.relay_address, timeout_s=timeout_s, relay=True
        )
        self._tasks.spawn(self._reader(self.channel))
        if reserve:
            await self.channel.send(encode(Message(Kind.RESERVE)))
            async with asyncio.timeout(timeout_s):
                await self._reserved.wait()
            if not self.reserved:
                raise PeerUnreachable(f"the relay {self.relay_address[:12]} refused a reservation")
            self._tasks.spawn(self._keepalive(self.channel))

    async def _keepalive(self, channel: SecureChannel) -> None:
        """Renew the reservation every ``keepalive_s``: it also keeps our NAT's
        mapping to the relay open, or re-opens it after the NAT forgot it
        (a mapping the relay cannot refresh from outside)."""
        while not channel.is_closed:
            await asyncio.sleep(self.keepalive_s)
            try:
                channel.send_nowait(encode(Message(Kind.RESERVE)))
            except HivemeshError:
                return

    @property
    def is_up(self) -> bool:
        """Whether the relay channel is open."""
        return self.channel is not None and not self.channel.is_closed

    async def _reader(self, channel: SecureChannel) -> None:
        try:
            while True:
                for frame in await channel.recv_batch():
                    self._on_frame(frame)
        except ConnectionClosed:
            pass
        finally:
            for circuit in list(self._circuits.values()):
                self._end(circuit, ConnectionClosed("the relay channel ended"))
            self._reserved.set()

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = decode(frame)
        except DecodeError:
            self.counters.incr("relay_malformed")
            return
        circuit = self._circuits.get(msg.circuit)
        if msg.kind == Kind.DATA:
            if circuit is not None and circuit.pipe is not None:
                circuit.pipe.feed(msg.data)
            else:
                self.counters.incr("relay_data_unknown_circuit")
        elif msg.kind == Kind.OBSERVED:
            if self._on_observed is not None:
                try:
                    self._on_observed(self.relay_address, parse_hostport(msg.text))
                except DecodeError:
                    self.counters.incr("relay_malformed")
        elif msg.kind in (Kind.RESERVED, Kind.REFUSED) and msg.circuit == 0:
            self.reserved = msg.kind == Kind.RESERVED
            if not self.reserved:
                self.counters.incr(f"relay_refused_{msg.text}")
            self._reserved.set()
        elif msg.kind == Kind.CONNECTED and circuit is not None:
            if circuit.ready is not None and not circuit.ready.done():
                circuit.ready.set_result(None)
        elif msg.kind == Kind.REFUSED and circuit is not None:
            self.counters.incr(f"relay_refused_{msg.text}")
            if circuit.ready is not None and not circuit.ready.done():
                circuit.ready.set_exception(PeerUnreachable(f"relay refused: {msg.text}"))
            # else: a refused PUNCH; the circuit itself ends only by CLOSE
        elif msg.kind == Kind.INCOMING:
            self._incoming(msg.circuit, msg.text)
        elif msg.kind == Kind.CLOSE and circuit is not None:
            self._end(
                circuit, ConnectionClosed(f"relayed circuit closed: {msg.text}"), notify=False
            )
        elif msg.kind == Kind.PUNCH and circuit is not None and msg.punch is not None:
            if msg.punch.claimed != circuit.peer:
                self.counters.incr("punch_refused_spoofed")
                return
            if self._on_punch is not None:
                self._on_punch(self, circuit.peer, msg.circuit, msg.punch.candidates)
        else:
            self.counters.incr("relay_unexpected")

    def _pipe(self, circuit: _Circuit) -> PipeTransport:
        def send(data: bytes) -> None:
            frames = data_frames(circuit.cid, data)
            channel = self.channel
            if not circuit.queued and channel is not None and not circuit.closed:
                try:  # nothing queued or in flight: send now, in order, while there is room
                    while frames:
                        channel.send_nowait(frames[0])
                        del frames[0]
                except WouldBlock:
                    pass
                except HivemeshError as exc:
                    self._end(circuit, ConnectionClosed(f"relay channel: {exc}"))
                    return
            if frames:
                circuit.outq += frames
                circuit.queued += sum(map(len, frames))
                circuit.wake.set()

        def on_close() -> None:
            self._end(circuit, None)

        circuit.pipe = PipeTransport(
            send, lambda: circuit.queued, on_close, extra={"peername": None, "path": self.path}
        )
        circuit.writer = self._tasks.spawn(self._write(circuit))
        return circuit.pipe

    async def _write(self, circuit: _Circuit) -> None:
        while True:
            await circuit.wake.wait()
            circuit.wake.clear()
            while circuit.outq and self.channel is not None:
                frame = circuit.outq[0]  # stays queued while in flight: send() keeps order
                try:
                    await self.channel.send(frame)
                except HivemeshError as exc:
                    self._end(circuit, ConnectionClosed(f"relay channel: {exc}"))
                    return
                del circuit.outq[0]
                circuit.queued -= len(frame)
                if circuit.pipe is not None:
                    circuit.pipe.check_writable()
            if circuit.closed:
                if circuit.close_pending:  # our end closed: what it wrote went first
                    await self._send_close(circuit.cid)
                return

    async def _send_close(self, cid: int) -> None:
        if self.channel is None or self.channel.is_closed:
            return
        try:
            await self.channel.send(encode(Message(Kind.CLOSE, cid, text="normal")), timeout_s=5.0)
        except HivemeshError:
            self.counters.incr("relay_close_unsent")

    def _end(self, circuit: _Circuit, reason: HivemeshError | None, *, notify: bool = True) -> None:
        if circuit.closed:
            return
        circuit.closed = True
        self._circuits.pop(circuit.cid, None)
        if notify:
            writer = circuit.writer
            if circuit.outq and writer is not None and not writer.done():
                circuit.close_pending = True  # the writer sends the queued bytes, then CLOSE
            else:
                self._tasks.spawn(self._send_close(circuit.cid))
        circuit.wake.set()
        if circuit.pipe is not None:
            circuit.pipe.lost(reason)

    def _incoming(self, cid: int, source: str) -> None:
        circuit = _Circuit(cid, source)
        self._circuits[cid] = circuit
        reader, writer = open_pipe(self._pipe(circuit))

        async def accept() -> None:
            try:
                channel = await secure_accept(
                    reader,
                    writer,
                    self._creds,
                    authorize=self._authorize,
                    path=self.path,
                    options=self._opts,
                    counters=self.counters,
                )
            except HivemeshError:
                return
            if channel.peer_address != source:  # the relay named someone else
                self.counters.incr("relay_source_mismatch")
                channel.close()
                return
            await self._on_channel(channel)

        self._tasks.spawn(accept())

    async def open(self, target: str, *, timeout_s: float = 5.0) -> tuple[SecureChannel, int]:
        """A secure channel to ``target`` through the relay, and its circuit id."""
        if self.channel is None or self.channel.is_closed:
            raise PeerUnreachable("no relay channel")
        cid = next(self._ids)
        circuit = _Circuit(cid, target, ready=asyncio.get_running_loop().create_future())
        self._circuits[cid] = circuit
        try:
            async with asyncio.timeout(timeout_s):
                await self.channel.send(encode(Message(Kind.CONNECT, cid, text=target)))
                assert circuit.ready is not None
                await circuit.ready
                reader, writer = open_pipe(self._pipe(circuit))
                channel = await secure_dial(
                    reader,
                    writer,
                    self.identity,
                    authorize=self._authorize,
                    path=self.path,
                    expect_address=target,
                    timeout_s=timeout_s,
                    options=self._opts,
                    counters=self.counters,
                    boot_id=self._boot_id,
                )
        except TimeoutError:
            self._end(circuit, None)
            raise PeerUnreachable(f"no relayed channel to {target[:12]} in {timeout_s}s") from None
        except BaseException:
            self._end(circuit, None)
            raise
        return channel, cid

    def circuit_of(self, peer: str) -> int | None:
        """The id of an open circuit with ``peer``, if any."""
        for cid, c in sorted(self._circuits.items()):
            if c.peer == peer and not c.closed:
                return cid
        return None

    async def punch(self, cid: int, candidates: tuple[HostPort, ...]) -> None:
        """Offer our ``candidates`` to the other end of circuit ``cid``."""
        if self.channel is None:
            return
        punch = Punch(self.identity.address, candidates)
        await self.channel.send(encode(Message(Kind.PUNCH, cid, punch=punch)))

    async def send_raw(self, frame: bytes) -> None:
        """Send a raw relay frame (tests: malformed and hostile input)."""
        assert self.channel is not None
        await self.channel.send(frame)

    def close(self) -> None:
        """Close the relay channel and every circuit."""
        if self.channel is not None:
            self.channel.close()
        self._tasks.cancel()
