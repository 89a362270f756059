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
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    ConnectionClosed,
    HivemeshError,
    PeerUnreachable,
    WouldBlock,
)
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.noise import StaticCredentials
from hivemesh.transports.pipe import PipeTransport, open_pipe
from hivemesh.transports.quic import QuicEndpoint
from hivemesh.transports.relay_circuits import ClientCircuits, Event, Happened
from hivemesh.transports.relay_policy import Forward, RelayTable
from hivemesh.transports.relay_wire import Kind, encode
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
        if (old := self._peers.get(peer)) is not None:
            old.close()  # replaced: the table ends its circuits (link_up)
        self._peers[peer] = channel
        await self._send(table.link_up(peer, channel.remote_endpoint))
        try:
            while True:
                for frame in await channel.recv_batch():
                    if self._peers.get(peer) is not channel:
                        return  # replaced meanwhile: the rest is not the new channel's
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


class RelayClient:
    """A node's relay channel to one relay, and its circuits (see module docs).

    What a relay frame means, and what to send in which order, is its
    :class:`~hivemesh.transports.relay_circuits.ClientCircuits`'s; this
    class feeds it, and carries frames, pipes and handshakes."""

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
        self.circuits = ClientCircuits(identity.address, self.counters)
        self.channel: SecureChannel | None = None
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
        self._pipes: dict[int, PipeTransport] = {}
        self._ready: dict[int, asyncio.Future[None]] = {}
        self._writing: SecureChannel | None = None  # a task waits for room on it
        self._tasks = TaskSet(self.counters, "relay_task")
        self._reserved = asyncio.Event()

    @property
    def path(self) -> str:
        """The ``path`` of channels through this relay."""
        return f"relay:{self.relay_address}"

    @property
    def reserved(self) -> bool:
        """Whether the relay holds our reservation."""
        return self.circuits.reserved

    async def start(self, *, reserve: bool = True, timeout_s: float = 5.0) -> None:
        """Open the relay channel (and reserve: others may reach us through it).
        Called again once the channel ended (the relay restarted), it opens a
        new one and reserves afresh."""
        host, port = self.relay_endpoint
        if self.channel is not None:  # it ended: its circuits end now
            self._lost(self.channel)
        self._reserved = asyncio.Event()
        self.channel = await self.endpoint.dial(
            host, port, expect_address=self.relay_address, timeout_s=timeout_s, relay=True
        )
        self._tasks.spawn(self._reader(self.channel))
        if reserve:
            self._command(self.circuits.reserve)
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
            if channel is self.channel:
                self._command(self.circuits.reserve)

    @property
    def is_up(self) -> bool:
        """Whether the relay channel is open."""
        return self.channel is not None and not self.channel.is_closed

    def _command(self, command: Callable[[], object]) -> None:
        command()
        self._flush()

    def _flush(self) -> None:
        """Send what the circuits queued while the channel takes it at once;
        a task waits for room for the rest (frames stay in order)."""
        channel = self.channel
        if channel is None or self._writing is channel:
            return
        while (item := self.circuits.take()) is not None:
            try:
                channel.send_nowait(item[1])
            except WouldBlock:
                self._writing = channel
                self._tasks.spawn(self._write(channel, item))
                return
            except HivemeshError:
                return  # the channel ended: the reader ends its circuits
            self._sent(item[0])

    async def _write(self, channel: SecureChannel, item: tuple[int, bytes] | None) -> None:
        try:
            while item is not None:
                await channel.send(item[1])
                self._sent(item[0])
                item = self.circuits.take()
        except HivemeshError:
            pass  # the channel ended: the reader ends its circuits
        finally:
            if self._writing is channel:
                self._writing = None

    def _sent(self, cid: int) -> None:
        pipe = self._pipes.get(cid)
        if pipe is not None:
            pipe.check_writable()

    async def _reader(self, channel: SecureChannel) -> None:
        try:
            while True:
                for frame in await channel.recv_batch():
                    if (event := self.circuits.receive(frame)) is not None:
                        self._on_event(event)
        except ConnectionClosed:
            pass
        finally:
            self._lost(channel)

    def _lost(self, channel: SecureChannel) -> None:
        """``channel`` ended: if it is still ours, every circuit with it."""
        if channel is not self.channel:
            return
        channel.close()
        self.channel = None
        for cid in self.circuits.channel_ended():
            self._end(cid, ConnectionClosed("the relay channel ended"))
        self._reserved.set()

    def _on_event(self, event: Event) -> None:
        what, cid = event.what, event.cid
        ready = self._ready.get(cid)
        if what == Happened.DATA:
            self._pipes[cid].feed(event.data)  # a connected circuit has its pipe
        elif what == Happened.OBSERVED and self._on_observed is not None:
            assert event.addr is not None
            self._on_observed(self.relay_address, event.addr)
        elif what == Happened.RESERVED:
            self._reserved.set()
        elif what == Happened.CONNECTED and ready is not None and not ready.done():
            ready.set_result(None)
        elif what == Happened.REFUSED and ready is not None and not ready.done():
            ready.set_exception(PeerUnreachable(f"relay refused: {event.text}"))
        elif what == Happened.INCOMING:
            self._incoming(cid)
        elif what == Happened.ENDED:
            self._end(cid, ConnectionClosed(f"relayed circuit closed: {event.text}"))
        elif what == Happened.PUNCH and self._on_punch is not None:
            self._on_punch(self, event.text, cid, event.candidates)

    def _pipe(self, cid: int) -> PipeTransport:
        def send(data: bytes) -> None:
            self.circuits.send(cid, data)
            self._flush()

        def on_close() -> None:
            if self.circuits.close(cid):
                self._flush()
            self._end(cid, None)

        pipe = self._pipes[cid] = PipeTransport(
            send,
            lambda: self.circuits.buffered(cid),
            on_close,
            extra={"peername": None, "path": self.path},
        )
        return pipe

    def _end(self, cid: int, reason: HivemeshError | None) -> None:
        """Circuit ``cid`` ended (the circuits already forgot it): its pipe with it."""
        self._ready.pop(cid, None)
        pipe = self._pipes.pop(cid, None)
        if pipe is not None:
            pipe.lost(reason)

    def _incoming(self, cid: int) -> None:
        reader, writer = open_pipe(self._pipe(cid))

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
            if not self.circuits.accepted(cid, channel.peer_address):
                channel.close()
                return
            await self._on_channel(channel)

        self._tasks.spawn(accept())

    async def open(self, target: str, *, timeout_s: float = 5.0) -> tuple[SecureChannel, int]:
        """A secure channel to ``target`` through the relay, and its circuit id."""
        if self.channel is None or self.channel.is_closed:
            raise PeerUnreachable("no relay channel")
        cid = self.circuits.open(target)
        ready = self._ready[cid] = asyncio.get_running_loop().create_future()
        reader, writer = open_pipe(self._pipe(cid))
        self._flush()
        try:
            async with asyncio.timeout(timeout_s):
                await ready
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
        except BaseException as exc:
            if self.circuits.close(cid):
                self._flush()
            self._end(cid, None)
            if isinstance(exc, TimeoutError):
                raise PeerUnreachable(
                    f"no relayed channel to {target[:12]} in {timeout_s}s"
                ) from None
            raise
        return channel, cid

    def circuit_of(self, peer: str) -> int | None:
        """The id of an open circuit with ``peer``, if any."""
        return self.circuits.circuit_of(peer)

    async def punch(self, cid: int, candidates: tuple[HostPort, ...]) -> None:
        """Offer our ``candidates`` to the other end of circuit ``cid``."""
        self._command(lambda: self.circuits.punch(cid, candidates))

    async def send_raw(self, frame: bytes) -> None:
        """Send a raw relay frame (tests: malformed and hostile input)."""
        assert self.channel is not None
        await self.channel.send(frame)

    def close(self) -> None:
        """Close the relay channel and every circuit."""
        if self.channel is not None:
            self.channel.close()
        self._tasks.cancel()
