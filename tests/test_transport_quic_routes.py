"""Which QUIC connection a datagram is for, and inbound admission, without
sockets or an event loop (aioquic's connection is sans-IO too)."""

from __future__ import annotations

import ssl

import pytest

pytest.importorskip("aioquic", reason="aioquic is not installed")
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from hivemesh.transports.quic_routes import QuicRoutes, Route

ADDR = ("192.0.2.1", 4433)


def initial() -> tuple[bytes, bytes]:
    """A client's first datagram (an Initial, padded to 1,200 bytes) and its
    destination connection id."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["x"])
    cfg.verify_mode = ssl.CERT_NONE
    client = QuicConnection(configuration=cfg)
    client.connect(ADDR, now=0.0)
    (data, _), *_ = client.datagrams_to_send(now=0.0)
    return data, client._peer_cid.cid


def test_datagrams_are_sorted_by_what_they_are() -> None:
    routes: QuicRoutes[str] = QuicRoutes(max_pending=1, max_channels=2)
    assert routes.route(b"") == Route(drop="udp_non_quic")
    assert routes.route(b"\x00hivemesh-prime") == Route(other=True, drop="udp_non_quic")
    assert routes.route(b"\x40") == Route(drop="udp_malformed")
    data, dcid = initial()
    assert len(data) >= 1200 and routes.route(data) == Route(open_cid=dcid)
    assert routes.route(data[:1000]) == Route(drop="udp_unknown_connection")  # too short
    routes.add("in", dcid, inbound=True)
    assert routes.route(data) == Route("in")
    routes.retire("in", dcid)
    assert routes.route(data) == Route(drop="refused_busy")  # "in" still has no channel
    routes.established("in")
    assert routes.route(data) == Route(open_cid=dcid)
    routes.add("out", b"12345678")
    assert routes.full and routes.route(data) == Route(drop="refused_busy")
    routes.remove("out")
    assert not routes.full and routes.connections() == ["in"] and len(routes) == 1
    routes.add("in", dcid)
    routes.remove("in")
    assert routes.route(data) == Route(open_cid=dcid) and len(routes) == 0
