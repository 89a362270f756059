"""One QUIC connection's decisions, sans-IO (hivemesh.transports.quic_link):
two links pushed through a list as the network, time passed in."""

from __future__ import annotations

import pytest

from hivemesh.errors import ConnectionClosed, DeadlineExceeded
from hivemesh.transports.stats import TransportCounters

pytest.importorskip("aioquic", reason="aioquic is not installed")

from aioquic.quic.connection import QuicConnection

from hivemesh.transports.quic_link import (
    ALPN,
    RELAY_ALPN,
    Link,
    LinkEvent,
    QuicLink,
    configurations,
)

CLIENT, SERVER = ("10.0.0.1", 1000), ("10.0.0.2", 2000)
SERVER_CFG, CLIENT_CFG, RELAY_CFG = configurations(30.0)


class Pair:
    """A dialler and its accepted link, and the datagrams between them."""

    def __init__(self, *, relay: bool = False) -> None:
        self.now = 0.0
        self.counters = TransportCounters()
        cfg = RELAY_CFG if relay else CLIENT_CFG
        self.client = self._link(QuicConnection(configuration=cfg), SERVER, inbound=False)
        self.client.connect(self.now)
        self.server: QuicLink | None = None
        self.events: dict[str, list[LinkEvent]] = {"client": [], "server": []}

    def _link(self, quic: QuicConnection, addr: tuple[str, int], *, inbound: bool) -> QuicLink:
        return QuicLink(
            quic,
            addr,
            self.now,
            inbound=inbound,
            counters=self.counters,
            handshake_timeout_s=10.0,
            close_grace_s=2.0,
        )

    def pump(self, rounds: int = 10) -> None:
        for _ in range(rounds):
            self.now += 0.01  # past the pacer (time stands still otherwise)
            moved = False
            for data, _ in self.client.datagrams_to_send(self.now):
                moved = True
                if self.server is None:
                    quic = QuicConnection(
                        configuration=SERVER_CFG,
                        original_destination_connection_id=data[6 : 6 + data[5]],
                    )
                    self.server = self._link(quic, CLIENT, inbound=True)
                self.events["server"] += self.server.receive_datagram(data, CLIENT, self.now)
            if self.server is not None:
                for data, _ in self.server.datagrams_to_send(self.now):
                    moved = True
                    self.events["client"] += self.client.receive_datagram(data, SERVER, self.now)
            if not moved:
                return

    def kinds(self, side: str) -> list[Link]:
        out = [e.what for e in self.events[side] if e.what not in (Link.CID_ISSUED,)]
        self.events[side].clear()
        return out


def connected(relay: bool = False) -> tuple[Pair, QuicLink]:
    pair = Pair(relay=relay)
    pair.pump()
    assert Link.READY in pair.kinds("client")
    assert pair.server is not None and Link.READY in pair.kinds("server")
    return pair, pair.server


def test_the_dialers_stream_opens_an_accept_and_carries_bytes_both_ways() -> None:
    pair, server = connected()
    assert pair.client.alpn == ALPN and server.path(set()) == "udp"
    assert server.path({CLIENT}) == "punched"
    assert pair.client.open_stream() == 0
    pair.client.send(b"hello")
    assert pair.client.buffered() == 5
    pair.pump()
    assert pair.client.buffered() == 0
    events = pair.events["server"]
    assert [e.what for e in events] == [Link.ACCEPT, Link.DATA]
    assert events[1].data == b"hello"
    pair.events["server"].clear()
    server.send(b"back")
    pair.pump()
    assert [e.data for e in pair.events["client"] if e.what == Link.DATA] == [b"back"]


def test_both_ends_of_the_stream_close_the_connection() -> None:
    pair, server = connected()
    pair.client.open_stream()
    pair.client.send(b"x")
    pair.pump()
    pair.kinds("server")
    assert pair.client.end_stream(pair.now) == []  # the peer has not ended yet
    timer = pair.client.get_timer()
    assert timer is not None and timer <= pair.now + 2.0
    pair.pump()
    assert pair.kinds("server") == [Link.DATA, Link.EOF]
    ended = server.end_stream(pair.now)  # the peer ended first: close now
    assert [e.what for e in ended] == [Link.ENDED] and server.done
    assert server.get_timer() is None
    last = server.datagrams_to_send(pair.now)  # its CONNECTION_CLOSE, once
    assert last and server.datagrams_to_send(pair.now) == []
    events = pair.events["client"]
    for data, _ in last:
        events += pair.client.receive_datagram(data, SERVER, pair.now)
    pair.pump()
    assert not pair.client.done  # draining (RFC 9000, 10.2) until its timer
    when = pair.client.get_timer()
    assert when is not None
    ended = pair.client.handle_timer(when)
    assert [e.what for e in ended] == [Link.ENDED] and pair.client.done


def test_our_end_closes_after_the_grace_if_the_peer_never_ends() -> None:
    pair, _ = connected()
    pair.client.open_stream()
    pair.client.send(b"x")
    pair.pump()
    t = pair.now
    pair.client.end_stream(t)
    assert pair.client.end_stream(t) == []  # once
    pair.client.handle_timer(t + 1.9)
    assert not pair.client.done
    (ended,) = pair.client.handle_timer(t + 2.0)
    assert ended.what == Link.ENDED and isinstance(ended.reason, ConnectionClosed)
    assert pair.client.handle_timer(t + 3.0) == []
    pair.client.send(b"late")  # nothing once ended
    assert pair.client.buffered() == 0


def test_an_inbound_connection_without_a_channel_times_out() -> None:
    pair, server = connected()
    born = 0.01  # the first round of pump() made it
    timer = server.get_timer()
    assert timer is not None and timer <= born + 10.0
    assert all(e.what != Link.ENDED for e in server.handle_timer(born + 9.9))
    (ended,) = server.handle_timer(born + 10.0)
    assert isinstance(ended.reason, DeadlineExceeded)
    assert pair.counters.get("quic_handshake_timeout") == 1


def test_an_established_channel_has_no_handshake_deadline() -> None:
    _, server = connected()
    server.established()
    assert all(e.what != Link.ENDED for e in server.handle_timer(10.01))
    assert not server.done


def test_bytes_of_another_stream_are_stray() -> None:
    pair, _ = connected()
    pair.client.open_stream()
    pair.client.quic.send_stream_data(4, b"other")  # the client's second stream
    pair.pump()
    assert pair.kinds("server") == []
    assert pair.counters.get("quic_stray_stream") == 1


def test_a_relay_channel_has_its_own_alpn_and_path() -> None:
    _, server = connected(relay=True)
    assert server.alpn == RELAY_ALPN and server.path({CLIENT}) == "relay-control"
