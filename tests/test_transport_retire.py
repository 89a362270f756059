"""Retiring a secure channel (graceful half-close) over real sockets on 127.0.0.1.

A retired channel stops sending, tells the peer CLOSE(``channel_superseded``)
and keeps reading until the peer closes: frames in flight either way are
delivered, and frames queued but never written are handed back
(:meth:`SecureChannel.take_unsent`), on both ends. Nothing is lost or counted
as dropped.
"""

from __future__ import annotations

import asyncio

import pytest

from aiotest import eventually, run
from hivemesh.core.identity import Identity
from hivemesh.errors import ChannelSuperseded, ConnectionClosed
from hivemesh.transports import SecureChannel, connect, serve

HOST = "127.0.0.1"
A = Identity.from_seed(b"r" * 32)
B = Identity.from_seed(b"s" * 32)


async def drain(channel: SecureChannel) -> list[bytes]:
    """Every frame the channel delivers until it ends."""
    out: list[bytes] = []
    try:
        while True:
            out.append(await channel.recv())
    except ConnectionClosed:
        return out


async def pair() -> tuple[SecureChannel, SecureChannel, object]:
    accepted: list[SecureChannel] = []

    async def keep(ch: SecureChannel) -> None:
        accepted.append(ch)

    listener = await serve(HOST, 0, B, authorize=lambda _a: True, on_channel=keep)
    dialled = await connect(HOST, listener.port, A, authorize=lambda _a: True)
    await eventually(lambda: bool(accepted), "the listener accepted")
    return dialled, accepted[0], listener


def frames(tag: bytes, n: int) -> list[bytes]:
    return [tag + i.to_bytes(4, "big") + b"." * 200 for i in range(n)]


def test_retire_delivers_in_flight_frames_and_hands_back_the_unsent() -> None:
    async def main() -> None:
        a, b, listener = await pair()
        sent = [f + b"." * 1024 for f in frames(b"a", 4000)]  # ~5 MB: more than a socket holds
        for f in sent:
            a.send_nowait(f)  # written at once while the socket takes them, then queued
        a.retire(ChannelSuperseded("test"))
        assert not a.is_sending and not a.is_closed  # half-closed: still reading
        with pytest.raises(ConnectionClosed):
            a.send_nowait(b"late")
        unsent = a.take_unsent()
        got = await drain(b)
        # every frame is either delivered or handed back, in order, exactly once
        assert got + unsent == sent
        assert got and unsent  # both paths taken: written before the CLOSE, handed back
        assert isinstance(b.close_reason, ChannelSuperseded)
        assert b.peer_close_code == ChannelSuperseded.code
        await eventually(lambda: a.is_closed, "the retiring end closes after the peer")
        assert a.statistics().frames_dropped == 0 and b.statistics().frames_dropped == 0
        assert b.statistics().errors == {}  # a retire is a clean end, not an error
        listener.close()  # type: ignore[attr-defined]

    run(main())


def test_the_peer_of_a_retired_channel_gets_its_unsent_frames_back() -> None:
    async def main() -> None:
        a, b, listener = await pair()
        a_sent, b_sent = frames(b"a", 50), frames(b"b", 3000)
        for f in a_sent:
            a.send_nowait(f)
        a_got_task = asyncio.create_task(drain(a))
        await eventually(lambda: b.statistics().frames_in == 50, "b read a's frames")
        for f in b_sent:
            b.send_nowait(f)  # queued at b when a's CLOSE arrives
        a.retire(ChannelSuperseded("test"))
        b_got = await drain(b)
        a_got = await a_got_task
        assert b_got == a_sent
        # b's frames: delivered to a (a kept reading while retired) or handed back
        assert a_got + b.take_unsent() == b_sent
        assert b.take_unsent() == []  # handed back once
        assert a.statistics().frames_dropped == 0 and b.statistics().frames_dropped == 0
        listener.close()  # type: ignore[attr-defined]

    run(main())


def test_both_ends_retiring_at_once_deliver_everything_written() -> None:
    async def main() -> None:
        a, b, listener = await pair()
        a_sent, b_sent = frames(b"a", 2000), frames(b"b", 2000)
        for f in a_sent:
            a.send_nowait(f)
        for f in b_sent:
            b.send_nowait(f)
        a.retire(ChannelSuperseded("both"))
        b.retire(ChannelSuperseded("both"))
        a_got, b_got = await asyncio.gather(drain(a), drain(b))
        assert b_got + a.take_unsent() == a_sent
        assert a_got + b.take_unsent() == b_sent
        await eventually(lambda: a.is_closed and b.is_closed, "both ends closed")
        listener.close()  # type: ignore[attr-defined]

    run(main())


def test_a_peer_that_never_closes_is_cut_after_the_linger() -> None:
    async def main() -> None:
        a, b, listener = await pair()
        a._transport.pause_reading()  # a stops reading: it never sees b's CLOSE, never hangs up
        b.retire(ChannelSuperseded("linger"), linger_s=0.2)
        t0 = asyncio.get_running_loop().time()
        await eventually(lambda: b.is_closed, "the linger deadline ends the channel", 3.0)
        assert asyncio.get_running_loop().time() - t0 >= 0.15
        assert "did not close" in str(b.close_reason)
        a.close()
        listener.close()  # type: ignore[attr-defined]

    run(main())
