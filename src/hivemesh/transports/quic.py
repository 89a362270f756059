"""Secure channels over UDP: QUIC (aioquic) carrying the Noise XX channel.

Theory of operation
-------------------
A node owns one UDP socket, a :class:`QuicEndpoint`: it accepts QUIC
connections on it *and* dials from it, so the address a peer observes for
our socket is the one a punched NAT mapping leads to (docs/nat.md). Each
QUIC connection carries one bidirectional stream, and on it runs the TCP
transport's very secure channel (:mod:`hivemesh.transports.streams`); QUIC's
TLS uses a throwaway certificate and proves nothing (Noise does). QUIC
brings what UDP lacks: retransmission, ordering, congestion and flow
control, and a connection the NAT keeps open.

Which connection a datagram is for, and whether a new one may open, is
:class:`~hivemesh.transports.quic_routes.QuicRoutes`'s; non-QUIC datagrams
go to :attr:`QuicEndpoint.on_other_datagram` (STUN). A connection without a
channel after ``2 * handshake_timeout_s`` is closed
(``quic_handshake_timeout``). :meth:`QuicEndpoint.prime` sends low-TTL
non-QUIC datagrams (:data:`PRIME`) that open our NAT's mapping towards a
peer (hole punching). The stream's unsent bytes above 1 MiB pause the
channel's writer, as a full socket buffer does on TCP. Closing a channel
sends its CLOSE, ends the stream, and closes the connection once the peer
ended its side or after the close grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionIdIssued,
    ConnectionIdRetired,
    ConnectionTerminated,
    HandshakeCompleted,
    StreamDataReceived,
    StreamReset,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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
from hivemesh.transports.quic_routes import QuicRoutes
from hivemesh.transports.session import ChannelOptions
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.streams import PROCESS_BOOT_ID, TaskSet, secure_accept, secure_dial

__all__ = ["ALPN", "PRIME", "RELAY_ALPN", "QuicEndpoint"]

_log = logging.getLogger(__name__)

#: The ALPN of a node's channel (its frames go to the node).
ALPN = "hivemesh/1"
#: The ALPN of a relay channel (its frames are relay messages,
#: :mod:`hivemesh.transports.relay_wire`).
RELAY_ALPN = "hivemesh-relay/1"
#: A priming datagram (not QUIC: its first byte has the fixed bit clear).
PRIME = b"\x00hivemesh-prime"
_STREAM_WINDOW = 8 << 20


def _certificate() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A throwaway self-signed certificate for QUIC's TLS (identity is Noise's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hivemesh")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    return key, cert


@dataclass(eq=False)
class _Conn:
    """One QUIC connection and the stream that carries its secure channel."""

    quic: QuicConnection
    addr: tuple[str, int]
    inbound: bool
    stream_id: int | None = None
    pipe: PipeTransport | None = None
    timer: asyncio.TimerHandle | None = None
    flush_due: bool = False
    ready: asyncio.Future[None] | None = None
    alpn: str | None = None
    channel: SecureChannel | None = None
    ended_local: bool = False
    ended_remote: bool = False
    done: bool = False


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
        #: Sources of expected hole punches: their inbound channels are "punched".
        self.punch_sources: set[tuple[str, int]] = set()
        #: Takes a non-QUIC datagram ``(data, addr)``; ``True``: handled.
        self.on_other_datagram: Callable[[bytes, tuple[str, int]], bool] | None = None
        self._opts = options or ChannelOptions()
        self._random_bytes = random_bytes
        self._boot_id = PROCESS_BOOT_ID if boot_id is None else boot_id
        self._creds = StaticCredentials.generate(identity, random_bytes, boot_id=self._boot_id)
        self._routes: QuicRoutes[_Conn] = QuicRoutes(
            max_pending=max_pending_handshakes, max_channels=max_channels
        )
        key, cert = _certificate()
        self._server_cfg = self._config(is_client=False, idle_timeout_s=idle_timeout_s)
        self._server_cfg.private_key, self._server_cfg.certificate = key, cert
        self._client_cfg = self._config(is_client=True, idle_timeout_s=idle_timeout_s)
        self._relay_cfg = self._config(is_client=True, idle_timeout_s=idle_timeout_s)
        self._relay_cfg.alpn_protocols = [RELAY_ALPN]
        self._server_cfg.alpn_protocols = [ALPN, RELAY_ALPN]
        self._tasks = TaskSet(self.counters, "quic_task")
        self._transport: asyncio.DatagramTransport | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False

    @staticmethod
    def _config(*, is_client: bool, idle_timeout_s: float) -> QuicConfiguration:
        cfg = QuicConfiguration(
            is_client=is_client,
            alpn_protocols=[ALPN],
            idle_timeout=idle_timeout_s,
            max_data=_STREAM_WINDOW * 2,
            max_stream_data=_STREAM_WINDOW,
        )
        if is_client:
            cfg.verify_mode = ssl.CERT_NONE  # identity is proven by Noise inside
            cfg.server_name = "hivemesh"
        return cfg

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
        conn.quic.receive_datagram(data, addr, self._loop.time())
        self._process(conn)

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

    def _accept(self, dcid: bytes, addr: tuple[str, int]) -> _Conn:
        self.counters.incr("connections_accepted")
        quic = QuicConnection(
            configuration=self._server_cfg, original_destination_connection_id=dcid
        )
        conn = _Conn(quic, addr, inbound=True)
        self._routes.add(conn, dcid, inbound=True)
        self._routes.add(conn, quic.host_cid)
        self._arm_handshake_deadline(conn)
        return conn

    def _arm_handshake_deadline(self, conn: _Conn) -> None:
        def expire() -> None:
            if conn.channel is None and not conn.done:
                self.counters.incr("quic_handshake_timeout")
                self._terminate(conn, DeadlineExceeded("QUIC connection without a channel"))

        self._loop.call_later(2 * self._opts.handshake_timeout_s, expire)

    def _process(self, conn: _Conn) -> None:
        """Handle ``conn``'s events, then send what it has and re-arm its timer."""
        quic = conn.quic
        while (event := quic.next_event()) is not None:
            if isinstance(event, ConnectionIdIssued):
                self._routes.add(conn, event.connection_id)
            elif isinstance(event, ConnectionIdRetired):
                self._routes.retire(conn, event.connection_id)
            elif isinstance(event, HandshakeCompleted):
                conn.alpn = event.alpn_protocol
                if conn.ready is not None and not conn.ready.done():
                    conn.ready.set_result(None)
            elif isinstance(event, StreamDataReceived):
                self._stream_data(conn, event)
            elif isinstance(event, StreamReset):
                if conn.pipe is not None and event.stream_id == conn.stream_id:
                    conn.pipe.lost(ConnectionClosed("the peer reset the QUIC stream"))
            elif isinstance(event, ConnectionTerminated):
                reason = f"QUIC connection ended: {event.reason_phrase or event.error_code}"
                self._ended(conn, ConnectionClosed(reason))
                return
        self._flush(conn)

    def _stream_data(self, conn: _Conn, event: StreamDataReceived) -> None:
        if conn.stream_id is None and conn.inbound and event.stream_id == 0:
            conn.stream_id = 0
            reader, writer = open_pipe(self._open_pipe(conn))
            self._tasks.spawn(self._accept_channel(conn, reader, writer))
        if event.stream_id != conn.stream_id or conn.pipe is None:
            self.counters.incr("quic_stray_stream")
            return
        conn.pipe.feed(event.data)
        if event.end_stream:
            conn.ended_remote = True
            conn.pipe.feed_eof()
            if conn.ended_local:
                self._terminate(conn)

    def _flush(self, conn: _Conn) -> None:
        conn.flush_due = False
        if conn.done or self._transport is None:
            return
        now = self._loop.time()
        for data, addr in conn.quic.datagrams_to_send(now):
            self._transport.sendto(data, addr)
        if conn.pipe is not None:
            conn.pipe.check_writable()
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        when = conn.quic.get_timer()
        if when is not None:
            conn.timer = self._loop.call_at(when, self._on_timer, conn)

    def _on_timer(self, conn: _Conn) -> None:
        conn.timer = None
        if conn.done:
            return
        conn.quic.handle_timer(self._loop.time())
        self._process(conn)

    def _schedule_flush(self, conn: _Conn) -> None:
        if not conn.flush_due:
            conn.flush_due = True
            self._loop.call_soon(self._flush, conn)

    def _open_pipe(self, conn: _Conn) -> PipeTransport:
        sid = conn.stream_id
        assert sid is not None

        def send(data: bytes) -> None:
            if not conn.done and not conn.ended_local:
                conn.quic.send_stream_data(sid, data)
                self._schedule_flush(conn)

        def buffered() -> int:
            # Bytes written but not yet sent (aioquic keeps them, and the sent
            # ones until acknowledged, in the stream's sender): like a socket's
            # send buffer, so an idle stream counts 0 and the channel writes at once.
            stream = conn.quic._streams.get(sid)
            if stream is None:
                return 0
            sender = stream.sender
            return int(sender._buffer_stop - sender.next_offset)

        def on_close() -> None:
            if conn.done or conn.ended_local:
                return
            conn.ended_local = True
            conn.quic.send_stream_data(sid, b"", end_stream=True)
            self._schedule_flush(conn)
            if conn.ended_remote:
                self._terminate(conn)
            else:
                self._loop.call_later(CLOSE_GRACE_S, self._terminate, conn)

        def rtt_ms() -> float | None:
            loss = conn.quic._loss  # aioquic's RTT estimator (smoothed, RFC 9002)
            return loss._rtt_smoothed * 1000 if loss._rtt_initialized else None

        conn.pipe = PipeTransport(
            send, buffered, on_close, extra={"peername": conn.addr, "path": "udp", "rtt_ms": rtt_ms}
        )
        return conn.pipe

    def _terminate(self, conn: _Conn, reason: HivemeshError | None = None) -> None:
        """Close ``conn``'s QUIC connection (``reason``: why, if not cleanly)."""
        reason = reason or ConnectionClosed("closed")
        if conn.done:
            return
        conn.quic.close(reason_phrase=reason.code)
        self._flush(conn)
        self._ended(conn, reason)

    def _ended(self, conn: _Conn, reason: HivemeshError) -> None:
        if conn.done:
            return
        conn.done = True
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
        relay = conn.alpn == RELAY_ALPN
        handler = self.on_relay_channel if relay else self._on_channel
        if handler is None:
            self.counters.incr("refused_relay_disabled")
            self._terminate(conn, ConnectionClosed("this node is no relay"))
            return
        path = "udp"
        if not relay and conn.addr in self.punch_sources:
            path = "punched"
        try:
            channel = await secure_accept(
                reader,
                writer,
                self._creds,
                authorize=self._authorize,
                path="relay-control" if relay else path,
                random_bytes=self._random_bytes,
                options=self._opts,
                counters=self.counters,
            )
        except HivemeshError as exc:
            # The stream was closed gracefully: a refusal (CLOSE unknown_peer)
            # still reaches the dialler before the connection ends.
            _log.debug("QUIC handshake from %s failed: %r", conn.addr, exc)
            return
        conn.channel = channel
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
        conn = _Conn(quic, addr, inbound=False, stream_id=0)
        conn.ready = self._loop.create_future()
        self._routes.add(conn, quic.host_cid)
        self.counters.incr("quic_dials")
        try:
            async with asyncio.timeout(timeout_s):
                quic.connect(addr, now=self._loop.time())
                self._flush(conn)
                await conn.ready
                conn.stream_id = quic.get_next_available_stream_id()
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
