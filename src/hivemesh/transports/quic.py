"""Secure channels over UDP: QUIC (aioquic) carrying the Noise XX channel.

Theory of operation
-------------------
A node owns one UDP socket, a :class:`QuicEndpoint`: it accepts QUIC
connections on it *and* dials from it, so the address a peer observes for
our socket is the one a punched NAT mapping leads to (docs/nat.md). Each
QUIC connection carries one bidirectional stream, and on it runs the TCP
transport's very secure channel (:mod:`hivemesh.transports.streams`). QUIC
brings what UDP lacks: retransmission, ordering, congestion and flow
control, and a connection the NAT keeps open.

Which connection a datagram is for, and whether a new one may open, is
:class:`~hivemesh.transports.quic_routes.QuicRoutes`'s; what happens on a
connection (its stream, its ends and deadlines, its configuration) is
:class:`~hivemesh.transports.quic_link.QuicLink`'s. This module pumps
datagrams, one timer per connection and the stream's bytes between them
and a :class:`~hivemesh.transports.pipe.PipeTransport`. Non-QUIC datagrams
go to :attr:`QuicEndpoint.on_other_datagram` (STUN).
:meth:`QuicEndpoint.prime` sends low-TTL non-QUIC datagrams (:data:`PRIME`)
that open our NAT's mapping towards a peer (hole punching). The stream's
unsent bytes above 1 MiB pause the channel's writer, as a full socket
buffer does on TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass
from typing import cast

from aioquic.quic.connection import QuicConnection

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    HivemeshError,
    PeerBusy,
    PeerUnreachable,
)
from hivemesh.transports.channel import CLOSE_GRACE_S, Authorize, SecureChannel
from hivemesh.transports.noise import RandomBytes, StaticCredentials
from hivemesh.transports.pipe import PipeTransport, open_pipe
from hivemesh.transports.quic_link import (
    ALPN,
    RELAY_ALPN,
    Link,
    LinkEvent,
    QuicLink,
    configurations,
)
from hivemesh.transports.quic_routes import QuicRoutes
from hivemesh.transports.session import ChannelOptions
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.streams import PROCESS_BOOT_ID, TaskSet, secure_accept, secure_dial

__all__ = ["ALPN", "PRIME", "RELAY_ALPN", "QuicEndpoint"]

_log = logging.getLogger(__name__)

#: A priming datagram (not QUIC: its first byte has the fixed bit clear).
PRIME = b"\x00hivemesh-prime"


@dataclass(eq=False)
class _Conn:
    """One QUIC connection's link, and what the driver holds for it."""

    link: QuicLink
    pipe: PipeTransport | None = None
    timer: asyncio.TimerHandle | None = None
    flush_due: bool = False
    ready: asyncio.Future[None] | None = None
    channel: SecureChannel | None = None


class QuicEndpoint(asyncio.DatagramProtocol):
    """One UDP socket serving and dialling QUIC secure channels (see module docs)."""

    def __init__(
        self,
        identity: Identity,
        *,
        authorize: Authorize,
        on_channel: Callable[[SecureChannel], Awaitable[None]],
        options: ChannelOptions | None = None,
        counters: TransportCounters | None = None,
        random_bytes: RandomBytes = secrets.token_bytes,
        boot_id: bytes | None = None,
        max_pending_handshakes: int = 128,
        max_channels: int = 1024,
        idle_timeout_s: float = 30.0,
        on_relay_channel: Callable[[SecureChannel], Awaitable[None]] | None = None,
    ) -> None:
        self.identity = identity
        #: Counters for this endpoint (``hivemesh status`` shows them).
        self.counters = counters if counters is not None else TransportCounters()
        self._authorize = authorize
        self._on_channel = on_channel
        #: Where relay channels (ALPN :data:`RELAY_ALPN`) go; ``None``: refused.
        self.on_relay_channel = on_relay_channel
        #: Sources of expected hole punches (:class:`~.punch.PunchSources`): "punched".
        self.punch_sources: Container[tuple[str, int]] = frozenset()
        #: Takes a non-QUIC datagram ``(data, addr)``; ``True``: handled.
        self.on_other_datagram: Callable[[bytes, tuple[str, int]], bool] | None = None
        self._opts = options or ChannelOptions()
        self._random_bytes = random_bytes
        self._boot_id = PROCESS_BOOT_ID if boot_id is None else boot_id
        self._creds = StaticCredentials.generate(identity, random_bytes, boot_id=self._boot_id)
        self._routes: QuicRoutes[_Conn] = QuicRoutes(
            max_pending=max_pending_handshakes, max_channels=max_channels
        )
        self._server_cfg, self._client_cfg, self._relay_cfg = configurations(idle_timeout_s)
        self._tasks = TaskSet(self.counters, "quic_task")
        self._transport: asyncio.DatagramTransport | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False

    @classmethod
    async def open(cls, host: str, port: int, identity: Identity, **kwargs: object) -> QuicEndpoint:
        """Bind ``host:port`` (port 0 picks one) and return the endpoint.
        Keyword arguments are :class:`QuicEndpoint`'s."""
        loop = asyncio.get_running_loop()
        _, endpoint = await loop.create_datagram_endpoint(
            lambda: cls(identity, **kwargs),  # type: ignore[arg-type]
            local_addr=(host, port),
        )
        return endpoint

    # -- asyncio.DatagramProtocol -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def error_received(self, exc: Exception) -> None:
        self.counters.incr("udp_errors")  # ICMP unreachable and the like: QUIC recovers

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        route = self._routes.route(data)
        other = self.on_other_datagram
        if route.other and other is not None and other(data, addr):
            return
        if route.drop is not None:
            self.counters.incr(route.drop)
            return
        conn = route.conn
        if conn is None:
            if self._closed or route.open_cid is None:
                return
            conn = self._accept(route.open_cid, addr)
        self._process(conn, conn.link.receive_datagram(data, addr, self._loop.time()))

    # -- connections ----------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound UDP port."""
        assert self._transport is not None
        return int(self._transport.get_extra_info("sockname")[1])

    def channels(self) -> list[SecureChannel]:
        """Open channels on this endpoint, both directions."""
        conns = self._routes.connections()
        return [c.channel for c in conns if c.channel is not None and not c.channel.is_closed]

    def _link(self, quic: QuicConnection, addr: tuple[str, int], *, inbound: bool) -> _Conn:
        conn = _Conn(
            QuicLink(
                quic,
                addr,
                self._loop.time(),
                inbound=inbound,
                counters=self.counters,
                handshake_timeout_s=2 * self._opts.handshake_timeout_s,
                close_grace_s=CLOSE_GRACE_S,
            )
        )
        self._routes.add(conn, quic.host_cid)
        return conn

    def _accept(self, dcid: bytes, addr: tuple[str, int]) -> _Conn:
        self.counters.incr("connections_accepted")
        quic = QuicConnection(
            configuration=self._server_cfg, original_destination_connection_id=dcid
        )
        conn = self._link(quic, addr, inbound=True)
        self._routes.add(conn, dcid, inbound=True)
        return conn

    def _process(self, conn: _Conn, events: list[LinkEvent]) -> None:
        """Carry out ``conn``'s events, then send what it has and re-arm its timer."""
        ended: HivemeshError | None = None
        for event in events:
            what = event.what
            if what == Link.CID_ISSUED:
                self._routes.add(conn, event.cid)
            elif what == Link.CID_RETIRED:
                self._routes.retire(conn, event.cid)
            elif what == Link.READY and conn.ready is not None and not conn.ready.done():
                conn.ready.set_result(None)
            elif what == Link.ACCEPT:
                reader, writer = open_pipe(self._open_pipe(conn))
                self._tasks.spawn(self._accept_channel(conn, reader, writer))
            elif conn.pipe is not None and what == Link.DATA:
                conn.pipe.feed(event.data)
            elif conn.pipe is not None and what == Link.EOF:
                conn.pipe.feed_eof()
            elif conn.pipe is not None and what == Link.RESET:
                conn.pipe.lost(ConnectionClosed("the peer reset the QUIC stream"))
            elif what == Link.ENDED:
                ended = event.reason
        self._flush(conn)
        if ended is not None:
            self._ended(conn, ended)

    def _flush(self, conn: _Conn) -> None:
        conn.flush_due = False
        if self._transport is None:
            return
        for data, addr in conn.link.datagrams_to_send(self._loop.time()):
            self._transport.sendto(data, addr)
        if conn.pipe is not None:
            conn.pipe.check_writable()
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        when = conn.link.get_timer()
        if when is not None:
            conn.timer = self._loop.call_at(when, self._on_timer, conn)

    def _on_timer(self, conn: _Conn) -> None:
        conn.timer = None
        self._process(conn, conn.link.handle_timer(self._loop.time()))

    def _schedule_flush(self, conn: _Conn) -> None:
        if not conn.flush_due:
            conn.flush_due = True
            self._loop.call_soon(self._flush, conn)

    def _open_pipe(self, conn: _Conn) -> PipeTransport:
        link = conn.link

        def send(data: bytes) -> None:
            link.send(data)
            self._schedule_flush(conn)

        def on_close() -> None:
            self._process(conn, link.end_stream(self._loop.time()))

        extra = {"peername": link.addr, "path": "udp", "rtt_ms": link.rtt_ms}
        conn.pipe = PipeTransport(send, link.buffered, on_close, extra=extra)
        return conn.pipe

    def _terminate(self, conn: _Conn, reason: HivemeshError | None = None) -> None:
        """Close ``conn``'s QUIC connection (``reason``: why, if not cleanly)."""
        self._process(conn, conn.link.terminate(reason or ConnectionClosed("closed")))

    def _ended(self, conn: _Conn, reason: HivemeshError) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        self._routes.remove(conn)
        if conn.ready is not None and not conn.ready.done():
            conn.ready.set_exception(PeerUnreachable(str(reason)))
        if conn.pipe is not None:
            conn.pipe.lost(reason if not isinstance(reason, ConnectionClosed) else None)

    async def _accept_channel(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        path = conn.link.path(self.punch_sources)
        handler = self.on_relay_channel if path == "relay-control" else self._on_channel
        if handler is None:
            self.counters.incr("refused_relay_disabled")
            self._terminate(conn, ConnectionClosed("this node is no relay"))
            return
        try:
            channel = await secure_accept(
                reader,
                writer,
                self._creds,
                authorize=self._authorize,
                path=path,
                random_bytes=self._random_bytes,
                options=self._opts,
                counters=self.counters,
            )
        except HivemeshError as exc:
            # The stream was closed gracefully: a refusal (CLOSE unknown_peer)
            # still reaches the dialler before the connection ends.
            _log.debug("QUIC handshake from %s failed: %r", conn.link.addr, exc)
            return
        conn.channel = channel
        conn.link.established()
        self._routes.established(conn)
        try:
            await handler(channel)
        except Exception:
            self.counters.incr("errors.on_channel")
            _log.exception("on_channel failed for %r", channel)
            channel.close()

    async def dial(
        self,
        host: str,
        port: int,
        *,
        expect_address: str | None = None,
        timeout_s: float = 5.0,
        path: str = "udp",
        relay: bool = False,
    ) -> SecureChannel:
        """Open a QUIC connection to ``host:port`` from this socket and run the
        secure handshake on it under one deadline (``timeout_s``). Raises as
        :func:`hivemesh.transports.connect` does; the channel's ``path`` is
        ``path`` (``"punched"`` after a hole punch). ``relay``: open a relay
        channel (ALPN :data:`RELAY_ALPN`) instead of a node channel."""
        if self._closed or self._transport is None:
            raise PeerUnreachable("the QUIC endpoint is closed")
        if self._routes.full:
            raise PeerBusy("this endpoint holds its maximum of QUIC connections")
        try:  # the name lookup must not block the event loop
            infos = await self._loop.getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
            )
        except OSError as exc:
            raise PeerUnreachable(f"cannot resolve {host}: {exc}") from None
        addr = (str(infos[0][4][0]), port)
        quic = QuicConnection(configuration=self._relay_cfg if relay else self._client_cfg)
        conn = self._link(quic, addr, inbound=False)
        conn.ready = self._loop.create_future()
        self.counters.incr("quic_dials")
        try:
            async with asyncio.timeout(timeout_s):
                conn.link.connect(self._loop.time())
                self._flush(conn)
                await conn.ready
                conn.link.open_stream()
                reader, writer = open_pipe(self._open_pipe(conn))
                channel = await secure_dial(
                    reader,
                    writer,
                    self.identity,
                    authorize=self._authorize,
                    path="relay-control" if relay else path,
                    expect_address=expect_address,
                    timeout_s=timeout_s,
                    random_bytes=self._random_bytes,
                    options=self._opts,
                    counters=self.counters,
                    boot_id=self._boot_id,
                )
        except TimeoutError:
            err = DeadlineExceeded(f"QUIC dial of {host}:{port} over {timeout_s}s")
            self.counters.record_error(err)
            self._terminate(conn, err)
            raise err from None
        except HivemeshError as exc:
            if isinstance(exc, PeerUnreachable):
                self.counters.record_error(exc)
            if conn.pipe is None:  # else the stream closes gracefully
                self._terminate(conn, exc)
            raise
        except BaseException:
            self._terminate(conn, ConnectionClosed("dial cancelled"))
            raise
        conn.channel = channel
        return channel

    def send_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        """Send one raw (non-QUIC) datagram from the endpoint's socket."""
        if self._transport is None or self._closed:
            return
        self._transport.sendto(data, addr)

    def prime(self, host: str, port: int, *, ttl: int = 2, count: int = 3) -> None:
        """Send ``count`` priming datagrams with IP TTL ``ttl`` to ``host:port``
        (opens our NAT's mapping towards it; see the module docs)."""
        if self._transport is None or self._closed:
            return
        tsock = self._transport.get_extra_info("socket")
        assert tsock is not None
        # A duplicate descriptor of the same socket: same port, same NAT mapping.
        with socket.socket(fileno=os.dup(tsock.fileno())) as sock:
            old = sock.getsockopt(socket.IPPROTO_IP, socket.IP_TTL)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            try:
                for _ in range(count):
                    with contextlib.suppress(OSError):  # unreachable: a primer may fail
                        sock.sendto(PRIME, (host, port))
            finally:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, old)
        self.counters.incr("primes_sent", count)

    def close(self) -> None:
        """Close every connection and the socket."""
        if self._closed:
            return
        self._closed = True
        for conn in self._routes.connections():
            if conn.channel is not None:
                conn.channel.close()
            self._terminate(conn, ConnectionClosed("endpoint closed"))
        self._tasks.cancel()
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        """Wait for the handshake tasks to end."""
        await self._tasks.wait()
