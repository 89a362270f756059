"""ConnectionManager over the real transport on loopback."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hivemesh.core.identity import Identity
from hivemesh.runtime.connections import ConnectionManager
from hivemesh.transports import ChannelOptions, SecureChannel, serve


def _manager(ident: Identity, events: list[tuple[str, bool]], **kw: Any) -> ConnectionManager:
    async def on_frames(peer: str, frames: list[bytes]) -> None:
        return None

    async def on_peer(peer: str, up: bool) -> None:
        events.append((peer, up))

    opts: dict[str, Any] = {
        "on_frames": on_frames,
        "dial_timeout_s": 2.0,
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.2,
        "slow_peer_timeout_s": 5.0,
    }
    opts.update(kw)
    return ConnectionManager(
        ident,
        authorize=lambda _a: True,
        on_peer=on_peer,
        rng=random.Random(1),
        **opts,
    )


async def _link(a: ConnectionManager, b: ConnectionManager) -> None:
    """``a`` dials ``b`` on loopback; returns once both hold the link."""
    pb = await b.listen("127.0.0.1", 0)
    a.want("127.0.0.1", pb, b.address)
    await _until(lambda: b.address in a.links and a.address in b.links)


async def _until(pred: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def test_simultaneous_dials_leave_one_shared_channel() -> None:
    async def main() -> None:
        ia, ib = Identity.from_seed(b"\x01" * 32), Identity.from_seed(b"\x02" * 32)
        ea: list[tuple[str, bool]] = []
        eb: list[tuple[str, bool]] = []
        a, b = _manager(ia, ea), _manager(ib, eb)
        pa = await a.listen("127.0.0.1", 0)
        pb = await b.listen("127.0.0.1", 0)
        a.want("127.0.0.1", pb, ib.address)
        b.want("127.0.0.1", pa, ia.address)

        def same() -> bool:
            la, lb = a.links.get(ib.address), b.links.get(ia.address)
            return (
                la is not None
                and lb is not None
                and la.channel.handshake_hash == lb.channel.handshake_hash
                and not la.channel.is_closed
            )

        await _until(same)
        await asyncio.sleep(0.5)  # let any losing channel be closed
        assert same()
        # each side reported the peer up exactly once, never down
        assert ea == [(ib.address, True)] and eb == [(ia.address, True)]
        await a.close()
        await b.close()

    asyncio.run(main())


def test_a_hopelessly_slow_peer_is_disconnected_and_the_drop_counted() -> None:
    async def main() -> None:
        ia, ib = Identity.from_seed(b"\x03" * 32), Identity.from_seed(b"\x04" * 32)
        stalled: list[SecureChannel] = []

        async def never_read(ch: SecureChannel) -> None:
            stalled.append(ch)

        listener = await serve(
            "127.0.0.1",
            0,
            ib,
            authorize=lambda _a: True,
            on_channel=never_read,
            options=ChannelOptions(recv_queue_frames=4),
        )
        events: list[tuple[str, bool]] = []
        a = _manager(
            ia, events, slow_peer_timeout_s=0.3, options=ChannelOptions(send_queue_frames=4)
        )
        a.want("127.0.0.1", listener.port, ib.address)
        await _until(lambda: ib.address in a.links)
        frame = b"x" * (256 * 1024)
        sent = 0
        for _ in range(400):  # bounded: ~100 MB at most
            if not await a.send(ib.address, frame):
                break
            sent += 1
        assert sent < 400, "the stalled peer never applied backpressure"
        assert a.counters["dropped_slow_peer"] >= 1
        assert a.counters["send_backpressure_waits"] >= 1
        await _until(lambda: (ib.address, False) in events)  # reported by the notifier task
        await a.close()
        listener.close()
        await listener.wait_closed()

    asyncio.run(main())


def test_frames_for_a_peer_without_a_channel_are_counted() -> None:
    async def main() -> None:
        a = _manager(Identity.from_seed(b"\x05" * 32), [])
        assert not await a.send(Identity.from_seed(b"\x06" * 32).address, b"frame")
        assert a.counters["dropped_no_channel"] == 1

    asyncio.run(main())


def test_send_fast_takes_only_what_an_open_channel_accepts_at_once() -> None:
    async def main() -> None:
        ia, ib = Identity.from_seed(b"\x07" * 32), Identity.from_seed(b"\x08" * 32)
        got: list[bytes] = []

        async def on_frames(peer: str, frames: list[bytes]) -> None:
            got.extend(frames)

        a, b = _manager(ia, []), _manager(ib, [], on_frames=on_frames)
        pb = await b.listen("127.0.0.1", 0)
        assert not a.send_fast(ib.address, b"early")  # no channel yet: send() decides
        a.want("127.0.0.1", pb, ib.address)
        await _until(lambda: ib.address in a.links)
        assert a.send_fast(ib.address, b"one") and a.send_fast(ib.address, b"two")
        await _until(lambda: got == [b"one", b"two"])
        a.links[ib.address].channel.close()
        assert not a.send_fast(ib.address, b"late")  # closed: send() counts the drop
        await a.close()
        await b.close()

    asyncio.run(main())


def test_frames_go_inline_unless_the_reader_is_busy_and_stay_in_order() -> None:
    """``on_frames_now`` takes frames from the read callback while the link's
    reader is idle; a declined batch goes to the reader, and frames that
    arrive while it is still handling that batch queue behind it."""

    async def main() -> None:
        ia, ib = Identity.from_seed(b"\x09" * 32), Identity.from_seed(b"\x0a" * 32)
        got: list[tuple[str, bytes]] = []
        gate = asyncio.Event()
        decline = False

        async def on_frames(peer: str, frames: list[bytes]) -> None:
            await gate.wait()  # the reader stays busy until the test opens the gate
            got.extend(("reader", f) for f in frames)

        def on_frames_now(peer: str, frames: list[bytes]) -> bool:
            if decline:
                return False
            got.extend(("inline", f) for f in frames)
            return True

        a = _manager(ia, [])
        b = _manager(ib, [], on_frames=on_frames, on_frames_now=on_frames_now)
        await _link(a, b)
        assert a.send_fast(ib.address, b"1") and a.send_fast(ib.address, b"2")
        await _until(lambda: len(got) == 2)
        decline = True
        assert a.send_fast(ib.address, b"3")
        await _until(lambda: b.links[ia.address].busy)  # the reader holds frame 3
        decline = False
        assert a.send_fast(ib.address, b"4") and a.send_fast(ib.address, b"5")
        await _until(lambda: b.links[ia.address].channel.statistics().frames_in == 5)
        assert len(got) == 2  # 4 and 5 wait behind 3 instead of overtaking it
        gate.set()
        await _until(lambda: len(got) == 5)
        assert a.send_fast(ib.address, b"6")
        await _until(lambda: len(got) == 6)
        assert [f for _, f in got] == [b"1", b"2", b"3", b"4", b"5", b"6"]
        assert [how for how, _ in got] == ["inline"] * 2 + ["reader"] * 3 + ["inline"]
        assert b.counters["frames_inline"] == 3
        await a.close()
        await b.close()

    asyncio.run(main())


def test_an_inline_handler_that_raises_is_counted_and_its_link_dropped() -> None:
    async def main() -> None:
        ia, ib = Identity.from_seed(b"\x0b" * 32), Identity.from_seed(b"\x0c" * 32)

        async def on_frames(peer: str, frames: list[bytes]) -> None:
            return None

        def on_frames_now(peer: str, frames: list[bytes]) -> bool:
            raise RuntimeError("a bug in a handler")

        a = _manager(ia, [])
        b = _manager(ib, [], on_frames=on_frames, on_frames_now=on_frames_now)
        await _link(a, b)
        link = b.links[ia.address]
        assert a.send_fast(ib.address, b"boom")
        await _until(lambda: b.counters["reader_crashed"] == 1)
        await _until(lambda: b.links.get(ia.address) is not link)  # that link is gone
        await a.close()
        await b.close()

    asyncio.run(asyncio.wait_for(main(), 20))
