"""One QUIC connection carrying one secure channel's stream, sans-IO.

Theory of operation
-------------------
aioquic's :class:`~aioquic.quic.connection.QuicConnection` is already sans-IO.
:class:`QuicLink` wraps one with what a node decides about it, so that the
asyncio endpoint (:mod:`hivemesh.transports.quic`) only pumps datagrams,
one timer and the stream's bytes:

* **Inputs**: :meth:`~QuicLink.receive_datagram`, :meth:`~QuicLink.handle_timer`,
  :meth:`~QuicLink.send` (stream bytes), :meth:`~QuicLink.end_stream` (our
  side of the channel closed), :meth:`~QuicLink.terminate`; each with ``now``.
* **Outputs**: :class:`LinkEvent` lists, :meth:`~QuicLink.datagrams_to_send`
  and one timer, :meth:`~QuicLink.get_timer` (QUIC's own, or one of ours).
* **The stream.** One bidirectional stream carries the channel: the
  dialler's first (:meth:`~QuicLink.open_stream`), or on an inbound
  connection stream 0, whose first bytes say ACCEPT (run the responder's
  handshake). Bytes of any other stream are counted ``quic_stray_stream``.
* **Ends.** Once both sides ended the stream the connection closes; after
  our end, it closes anyway after ``close_grace_s``. An inbound connection
  without a channel (:meth:`~QuicLink.established`) after
  ``handshake_timeout_s`` closes (``quic_handshake_timeout``). Every end is
  one :data:`Link.ENDED` event with its reason.
* **Configuration**: :func:`configurations` (QUIC's TLS uses a throwaway
  certificate and proves nothing; identity is Noise's, inside), and which
  ``path`` an accepted channel has (:meth:`~QuicLink.path`).
"""

from __future__ import annotations

import datetime
import enum
import ssl
from collections.abc import Container
from dataclasses import dataclass

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

from hivemesh.errors import ConnectionClosed, DeadlineExceeded, HivemeshError
from hivemesh.transports.stats import TransportCounters

__all__ = ["ALPN", "RELAY_ALPN", "Link", "LinkEvent", "QuicLink", "configurations"]

#: The ALPN of a node's channel (its frames go to the node).
ALPN = "hivemesh/1"
#: The ALPN of a relay channel (its frames are relay messages,
#: :mod:`hivemesh.transports.relay_wire`).
RELAY_ALPN = "hivemesh-relay/1"
_STREAM_WINDOW = 8 << 20
HostPort = tuple[str, int]


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


def configurations(idle_timeout_s: float) -> tuple[QuicConfiguration, ...]:
    """``(server, client, relay client)`` configurations of one endpoint: the
    server takes both ALPNs, a client offers :data:`ALPN` or :data:`RELAY_ALPN`."""
    configs = []
    for is_client, alpn in ((False, [ALPN, RELAY_ALPN]), (True, [ALPN]), (True, [RELAY_ALPN])):
        cfg = QuicConfiguration(
            is_client=is_client,
            alpn_protocols=alpn,
            idle_timeout=idle_timeout_s,
            max_data=_STREAM_WINDOW * 2,
            max_stream_data=_STREAM_WINDOW,
        )
        if is_client:
            cfg.verify_mode = ssl.CERT_NONE  # identity is proven by Noise inside
            cfg.server_name = "hivemesh"
        else:
            cfg.private_key, cfg.certificate = _certificate()
        configs.append(cfg)
    return tuple(configs)


class Link(enum.Enum):
    """What happened on a :class:`QuicLink` (a :class:`LinkEvent`)."""

    CID_ISSUED = "cid_issued"  # it answers to ``cid`` now
    CID_RETIRED = "cid_retired"  # it no longer answers to ``cid``
    READY = "ready"  # the QUIC handshake is done (a dialler may open its stream)
    ACCEPT = "accept"  # an inbound stream opened: run the responder's handshake
    DATA = "data"  # ``data`` arrived on the stream
    EOF = "eof"  # the peer ended the stream
    RESET = "reset"  # the peer reset the stream
    ENDED = "ended"  # the connection ended (``reason``)


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One :class:`Link` happening, with its ``cid``, ``data`` or ``reason``."""

    what: Link
    cid: bytes = b""
    data: bytes = b""
    reason: HivemeshError | None = None


class QuicLink:
    """One QUIC connection and its channel's stream (see the module docs)."""

    def __init__(
        self,
        quic: QuicConnection,
        addr: HostPort,
        now: float,
        *,
        inbound: bool,
        counters: TransportCounters,
        handshake_timeout_s: float,
        close_grace_s: float,
    ) -> None:
        self.quic = quic
        #: Where the peer is.
        self.addr = addr
        self.inbound = inbound
        #: The stream carrying the channel, once open.
        self.stream_id: int | None = None
        #: The ALPN the QUIC handshake agreed on.
        self.alpn: str | None = None
        #: True once the connection ended (:data:`Link.ENDED` was emitted).
        self.done = False
        self._counters = counters
        self._grace_s = close_grace_s
        self._ended_local = self._ended_remote = False
        self._handshake_by = now + handshake_timeout_s if inbound else None
        self._grace_by: float | None = None
        self._sent_last = False

    # -- inputs ---------------------------------------------------------------

    def receive_datagram(self, data: bytes, addr: HostPort, now: float) -> list[LinkEvent]:
        """A datagram for this connection."""
        self.quic.receive_datagram(data, addr, now)
        return self._events()

    def handle_timer(self, now: float) -> list[LinkEvent]:
        """The timer of :meth:`get_timer` fired."""
        if self.done:
            return []
        if self._handshake_by is not None and now >= self._handshake_by:
            self._counters.incr("quic_handshake_timeout")
            return self.terminate(DeadlineExceeded("QUIC connection without a channel"))
        if self._grace_by is not None and now >= self._grace_by:
            return self.terminate(ConnectionClosed("closed"))
        self.quic.handle_timer(now)
        return self._events()

    def connect(self, now: float) -> None:
        """Start the QUIC handshake (a dialler)."""
        self.quic.connect(self.addr, now=now)

    def open_stream(self) -> int:
        """Open the stream of a dialler's channel (after :data:`Link.READY`)."""
        self.stream_id = self.quic.get_next_available_stream_id()
        return self.stream_id

    def established(self) -> None:
        """The channel is up: no handshake deadline any more."""
        self._handshake_by = None

    def send(self, data: bytes) -> None:
        """Bytes of the channel towards the peer (dropped once our side ended)."""
        if not self.done and not self._ended_local and self.stream_id is not None:
            self.quic.send_stream_data(self.stream_id, data)

    def end_stream(self, now: float) -> list[LinkEvent]:
        """Our side of the channel closed: end the stream (module docs)."""
        if self.done or self._ended_local or self.stream_id is None:
            return []
        self._ended_local = True
        self.quic.send_stream_data(self.stream_id, b"", end_stream=True)
        if self._ended_remote:
            return self.terminate(ConnectionClosed("closed"))
        self._grace_by = now + self._grace_s
        return []

    def terminate(self, reason: HivemeshError) -> list[LinkEvent]:
        """Close the connection now (``reason``: why); its last datagrams stay
        in :meth:`datagrams_to_send`."""
        if self.done:
            return []
        self.quic.close(reason_phrase=reason.code)
        self.done = True
        return [LinkEvent(Link.ENDED, reason=reason)]

    # -- outputs --------------------------------------------------------------

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, HostPort]]:
        """What to send now; once the connection ended, its last datagrams
        (a CONNECTION_CLOSE) once, then nothing."""
        if self._sent_last:
            return []
        self._sent_last = self.done
        return self.quic.datagrams_to_send(now)

    def get_timer(self) -> float | None:
        """When to call :meth:`handle_timer` (``None``: no need)."""
        if self.done:
            return None
        times = [
            t for t in (self.quic.get_timer(), self._handshake_by, self._grace_by) if t is not None
        ]
        return min(times, default=None)

    def buffered(self) -> int:
        """Stream bytes written but not sent yet (a socket's send buffer: an
        idle stream counts 0, and the channel writes at once)."""
        stream = self.quic._streams.get(self.stream_id) if self.stream_id is not None else None
        if stream is None:
            return 0
        return int(stream.sender._buffer_stop - stream.sender.next_offset)

    def rtt_ms(self) -> float | None:
        """QUIC's smoothed RTT estimate (RFC 9002), once it has one."""
        loss = self.quic._loss
        return loss._rtt_smoothed * 1000 if loss._rtt_initialized else None

    def path(self, punch_sources: Container[HostPort]) -> str:
        """The ``path`` of this inbound connection's channel: ``"relay-control"``
        (a relay channel), ``"punched"`` (from an expected hole punch) or ``"udp"``."""
        if self.alpn == RELAY_ALPN:
            return "relay-control"
        return "punched" if self.addr in punch_sources else "udp"

    def _events(self) -> list[LinkEvent]:
        out: list[LinkEvent] = []
        while not self.done and (event := self.quic.next_event()) is not None:
            if isinstance(event, ConnectionIdIssued):
                out.append(LinkEvent(Link.CID_ISSUED, event.connection_id))
            elif isinstance(event, ConnectionIdRetired):
                out.append(LinkEvent(Link.CID_RETIRED, event.connection_id))
            elif isinstance(event, HandshakeCompleted):
                self.alpn = event.alpn_protocol
                out.append(LinkEvent(Link.READY))
            elif isinstance(event, StreamDataReceived):
                out += self._stream_data(event)
            elif isinstance(event, StreamReset) and event.stream_id == self.stream_id:
                out.append(LinkEvent(Link.RESET))
            elif isinstance(event, ConnectionTerminated):
                self.done = True
                reason = f"QUIC connection ended: {event.reason_phrase or event.error_code}"
                out.append(LinkEvent(Link.ENDED, reason=ConnectionClosed(reason)))
        return out

    def _stream_data(self, event: StreamDataReceived) -> list[LinkEvent]:
        out = []
        if self.stream_id is None and self.inbound and event.stream_id == 0:
            self.stream_id = 0
            out.append(LinkEvent(Link.ACCEPT))
        if event.stream_id != self.stream_id:
            self._counters.incr("quic_stray_stream")
            return out
        out.append(LinkEvent(Link.DATA, data=event.data))
        if event.end_stream:
            self._ended_remote = True
            out.append(LinkEvent(Link.EOF))
            if self._ended_local:
                out += self.terminate(ConnectionClosed("closed"))
        return out
