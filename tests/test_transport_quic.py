"""Secure channels over QUIC on 127.0.0.1: the TCP transport's handshake,
trust rules, counters and frame limits, carried by one UDP socket per node."""

from __future__ import annotations

import asyncio
import socket

import pytest

from aiotest import eventually, run
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    FrameTooLarge,
    InvalidArgument,
    PeerIdentityMismatch,
    PeerUnreachable,
    UnknownPeer,
)
from hivemesh.transports import ChannelOptions, SecureChannel

quic = pytest.importorskip("hivemesh.transports.quic", reason="aioquic is not installed")

HOST = "127.0.0.1"
A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
C = Identity.from_seed(b"c" * 32)


def trust_all(address: str) -> bool:
    return True


async def echo(channel: SecureChannel) -> None:
    try:
        while True:
            await channel.send((await channel.recv())[::-1])
    except ConnectionClosed:
        pass


async def endpoint(identity: Identity, **kw: object) -> quic.QuicEndpoint:
    kw.setdefault("authorize", trust_all)
    kw.setdefault("on_channel", echo)
    return await quic.QuicEndpoint.open(HOST, 0, identity, **kw)


def test_frames_round_trip_over_quic_with_the_noise_identity() -> None:
    async def main() -> None:
        a, b = await endpoint(A), await endpoint(B)
        try:
            ch = await a.dial(HOST, b.port, expect_address=B.address)
            assert ch.peer_address == B.address and ch.path == "udp"
            await ch.send(b"hello")
            assert await ch.recv() == b"olleh"
            big = bytes(range(256)) * 4096  # 1 MiB: spans records and QUIC packets
            for _ in range(8):
                await ch.send(big)
            for _ in range(8):
                assert await ch.recv() == big[::-1]
            assert ch.rtt_ms is not None and ch.rtt_ms > 0  # QUIC's smoothed RTT
            (inbound,) = b.channels()
            assert inbound.peer_address == A.address
            assert inbound.handshake_hash == ch.handshake_hash
            assert a.counters.get("handshakes_ok") == 1 == b.counters.get("handshakes_ok")
            await ch.aclose()
            await eventually(lambda: not b.channels(), "the peer saw the close")
        finally:
            a.close()
            b.close()

    run(main())


def test_both_dial_at_once_from_their_listening_sockets() -> None:
    """Simultaneous connect (hole punching): both directions on the same sockets."""

    async def main() -> None:
        a, b = await endpoint(A), await endpoint(B)
        try:
            ab, ba = await asyncio.gather(a.dial(HOST, b.port), b.dial(HOST, a.port))
            await ab.send(b"x")
            await ba.send(b"y")
            assert await ab.recv() == b"x"  # echoed by b's inbound channel
            assert await ba.recv() == b"y"
            assert len(a.channels()) == 2 == len(b.channels())
        finally:
            a.close()
            b.close()

    run(main())


def test_wrong_identity_and_untrusted_peers_are_refused_and_counted() -> None:
    async def main() -> None:
        b = await endpoint(B, authorize=lambda addr: addr != C.address)
        a, c = await endpoint(A), await endpoint(C)
        try:
            with pytest.raises(PeerIdentityMismatch):
                await a.dial(HOST, b.port, expect_address=C.address)
            assert a.counters.get("errors.identity_mismatch") == 1
            with pytest.raises(UnknownPeer):
                await c.dial(HOST, b.port)
            await eventually(lambda: b.counters.get("errors.unknown_peer") == 1, "b counted c")
            assert not b.channels()
        finally:
            for e in (a, b, c):
                e.close()

    run(main())


def test_frame_limits_hold_over_quic() -> None:
    async def main() -> None:
        small = ChannelOptions(max_frame_bytes=1024)
        got: list[SecureChannel] = []

        async def keep(ch: SecureChannel) -> None:
            got.append(ch)

        b = await endpoint(B, options=small, on_channel=keep)
        a = await endpoint(A)  # a's own limit is the default (16 MiB)
        try:
            ch = await a.dial(HOST, b.port)
            await eventually(lambda: bool(got), "b accepted")
            with pytest.raises(InvalidArgument):
                got[0].send_nowait(b"x" * 2048)  # over b's limit: refused locally
            await ch.send(b"y" * 2048)  # over b's limit: b ends the channel
            await eventually(lambda: got[0].is_closed, "b refused the oversize frame")
            assert b.counters.get("errors.oversize") == 1
            assert isinstance(got[0].close_reason, FrameTooLarge)
        finally:
            a.close()
            b.close()

    run(main())


def test_garbage_datagrams_and_silence_are_counted_not_fatal() -> None:
    async def main() -> None:
        b = await endpoint(B)
        a = await endpoint(A)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(quic.PRIME, (HOST, b.port))
                s.sendto(b"\x40" + b"\xff" * 50, (HOST, b.port))  # short header, no connection
                s.sendto(b"\xc0" + b"\x00" * 30, (HOST, b.port))  # a broken long header
            await eventually(
                lambda: (
                    b.counters.get("udp_non_quic") == 1
                    and b.counters.get("udp_unknown_connection") + b.counters.get("udp_malformed")
                    == 2
                ),
                "b counted the garbage",
            )
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
                silent.bind((HOST, 0))
                port = silent.getsockname()[1]
                with pytest.raises(DeadlineExceeded):
                    await a.dial(HOST, port, timeout_s=0.5)
            ch = await a.dial(HOST, b.port)  # still serving
            await ch.send(b"ok")
            assert await ch.recv() == b"ko"
        finally:
            a.close()
            b.close()

    run(main())


def test_a_name_that_does_not_resolve_is_unreachable_and_opens_no_connection() -> None:
    async def main() -> None:
        a = await endpoint(A)
        try:
            with pytest.raises(PeerUnreachable, match="cannot resolve"):
                await a.dial("no-such-host.invalid", 4242, timeout_s=5.0)
            assert not a.channels() and not a.counters.get("quic_dials")
        finally:
            a.close()

    run(main())
