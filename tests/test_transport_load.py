"""Inbound handshakes under load: admission, eviction, ``busy`` and dialling oneself.

The admission rules are checked on the sans-IO object; the rest runs over
real sockets on 127.0.0.1 (silent raw connections stand in for a flood, a
byte-holding proxy for a dialler caught mid-handshake).
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from aiotest import eventually, read_to_eof, run
from hivemesh.core.identity import Identity
from hivemesh.errors import InvalidArgument, PeerBusy, SelfConnection
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.transports import SecureChannel, connect, serve
from hivemesh.transports.admission import HandshakeAdmission
from hivemesh.transports.noise import MESSAGE_BYTES

HOST = "127.0.0.1"
A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
BUSY = b"\x00\x00\x04busy"  # written out here, not imported: the wire format under test


def trust_all(address: str) -> bool:
    return True


async def hold(channel: SecureChannel) -> None:
    return None


# -- the admission rule (sans-IO) ----------------------------------------------


def test_admission_evicts_the_least_recently_progressed_handshake() -> None:
    adm = HandshakeAdmission(3)
    assert [adm.admit(k, "10.0.0.9", t) for k, t in (("a", 0.0), ("b", 1.0), ("c", 2.0))] == [
        None,
        None,
        None,
    ]
    adm.progress("a", 3.0)  # a answered: b is now the one waiting longest
    assert adm.admit("d", "10.0.0.9", 4.0) == "b"
    assert len(adm) == 3 and "b" not in adm and adm.evicted == 1
    adm.finish("c")
    adm.finish("c")  # idempotent
    assert adm.admit("e", "10.0.0.9", 5.0) is None  # a slot was free


def test_a_handshake_past_its_last_message_cannot_be_evicted() -> None:
    adm = HandshakeAdmission(2)
    adm.admit("a", "h", 0.0)
    adm.admit("b", "h", 1.0)
    adm.received("a", 1, 2.0)  # progress: b now waits longest
    adm.received("b", 2, 3.0)  # b's last message: no longer pending
    assert "b" not in adm and len(adm) == 1
    assert adm.admit("c", "h", 4.0) is None  # room: nobody evicted
    assert adm.admit("d", "h", 5.0) == "a"


def test_admission_evicts_from_the_source_holding_the_most() -> None:
    adm = HandshakeAdmission(4)
    adm.admit("peer", "10.0.0.1", 0.0)  # the oldest of all, but alone on its host
    for i, t in enumerate((1.0, 2.0, 3.0)):
        adm.admit(f"flood{i}", "10.0.0.66", t)
    # a newcomer from a third host pushes out the flood, not the lone peer
    assert adm.admit("other", "10.0.0.2", 4.0) == "flood0"
    # the flood's own newcomer evicts the flood's oldest, not the others
    assert adm.admit("flood3", "10.0.0.66", 5.0) == "flood1"
    assert "peer" in adm and "other" in adm


def test_admission_rejects_bad_use() -> None:
    with pytest.raises(InvalidArgument):
        HandshakeAdmission(0)
    adm = HandshakeAdmission(2)
    adm.admit("a", "h", 0.0)
    with pytest.raises(InvalidArgument):
        adm.admit("a", "h", 1.0)


# -- a listener under a flood --------------------------------------------------


def test_silent_connections_beyond_the_cap_are_evicted_and_told_busy() -> None:
    """10 connections that say nothing against a cap of 4, then a real
    dialler: it gets in at once, without waiting for any handshake deadline,
    and the 7 connections that waited longest are closed with the busy
    refusal."""

    async def main() -> None:
        listener = await serve(
            HOST, 0, B, authorize=trust_all, on_channel=hold, max_pending_handshakes=4
        )
        async with listener:
            flood = []
            for _ in range(10):
                flood.append(await asyncio.open_connection(HOST, listener.port))
                await asyncio.sleep(0.01)  # accepted one by one: a clear order of age
            await eventually(
                lambda: listener.counters.get("connections_accepted") == 10, "accepted"
            )
            t0 = time.monotonic()
            ch = await connect(HOST, listener.port, A, authorize=trust_all, timeout_s=3.0)
            assert time.monotonic() - t0 < 2.5  # the handshake deadline is 5 s
            ch.close()
            # the 7 that waited longest were told why (6 for the flood, 1 for the dialler)
            replies = [await read_to_eof(r) for r, _ in flood[:7]]
            assert replies == [BUSY] * 7
            assert listener.counters.get("handshakes_evicted") == 7
            assert listener.counters.get("refused_busy") == 7
            for _, w in flood:
                w.close()

    run(main())


async def _holding_proxy(
    upstream_port: int, release: asyncio.Event, saw_message_2: asyncio.Event
) -> asyncio.Server:
    """Forward to ``upstream_port``; the dialler's bytes after message 1 wait for ``release``."""

    async def pipe_down(up: asyncio.StreamReader, down: asyncio.StreamWriter) -> None:
        seen = 0
        while data := await up.read(65536):
            seen += len(data)
            if seen >= 2 + MESSAGE_BYTES[1]:
                saw_message_2.set()
            down.write(data)
        down.close()

    async def client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(HOST, upstream_port)
        down = asyncio.create_task(pipe_down(ur, w))
        uw.write(await r.readexactly(2 + MESSAGE_BYTES[0]))
        rest = await r.read(65536)
        await release.wait()
        if not uw.is_closing():
            uw.write(rest)
        await down
        uw.close()

    return await asyncio.start_server(client, HOST, 0)


def test_a_dialler_evicted_mid_handshake_raises_peer_busy() -> None:
    """The dialler has its message 2 and sent message 3, which is held up on
    the way; meanwhile newer connections push its handshake out. It must
    report PeerBusy ("busy"), not a closed connection."""

    async def main() -> None:
        listener = await serve(
            HOST, 0, B, authorize=trust_all, on_channel=hold, max_pending_handshakes=2
        )
        release, saw_m2 = asyncio.Event(), asyncio.Event()
        proxy = await _holding_proxy(listener.port, release, saw_m2)
        async with listener, proxy:
            port = proxy.sockets[0].getsockname()[1]
            dial = asyncio.create_task(connect(HOST, port, A, authorize=trust_all, timeout_s=5))
            await asyncio.wait_for(saw_m2.wait(), 5)
            flood = [await asyncio.open_connection(HOST, listener.port) for _ in range(2)]
            # admitting the second one decides the eviction (same loop step)
            await eventually(lambda: listener.counters.get("connections_accepted") == 3, "accepted")
            release.set()
            with pytest.raises(PeerBusy, match="busy"):
                await dial
            for _, w in flood:
                w.close()

    run(main())


def test_a_dialler_refused_as_busy_says_so_and_backs_off() -> None:
    """The connection manager's dialler keeps the reason and backs off."""

    async def main() -> None:
        listener = await serve(HOST, 0, B, authorize=trust_all, on_channel=hold, max_channels=1)
        async with listener:
            first = await connect(
                HOST, listener.port, Identity.from_seed(b"c" * 32), authorize=trust_all
            )

            async def on_frames(peer: str, frames: list[bytes]) -> None:
                return None

            async def on_peer(peer: str, up: bool) -> None:
                return None

            mgr = ConnectionManager(
                A,
                authorize=trust_all,
                on_frames=on_frames,
                on_peer=on_peer,
                dial_timeout_s=2.0,
                reconnect_min_s=0.1,
                reconnect_max_s=0.4,
                slow_peer_timeout_s=5.0,
                rng=random.Random(1),
            )
            mgr.want(HOST, listener.port, B.address)
            await eventually(lambda: mgr.counters["dials"] >= 1, "dialled")
            await asyncio.sleep(1.5)
            target = mgr.dial_targets()[0]
            assert "PeerBusy" in target["last_error"] and "busy" in target["last_error"]
            assert mgr.counters["dial_failed_peer_busy"] == mgr.counters["dials"]
            # backed off: 0.1 s doubling to 0.4 s (jittered x0.5..1.5) allows
            # at most ~9 dials in 1.5 s; an immediate redial would make hundreds
            assert 2 <= mgr.counters["dials"] <= 10
            first.close()
            await eventually(lambda: B.address in mgr.links, "in once a slot is free", 5.0)
            await mgr.close()

    run(main())


def test_dialling_oneself_fails_before_revealing_who_we_are() -> None:
    async def main() -> None:
        async with await serve(HOST, 0, A, authorize=trust_all, on_channel=hold) as listener:
            with pytest.raises(SelfConnection):
                await connect(HOST, listener.port, A, authorize=trust_all, timeout_s=3)
            # the listener never saw message 3: no channel, one failed handshake
            await eventually(
                lambda: listener.counters.get("errors.handshake_failed") == 1, "counted"
            )
            assert listener.counters.get("handshakes_ok") == 0

    run(main())
