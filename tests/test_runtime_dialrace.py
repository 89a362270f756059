"""Simultaneous dials, restarts and retired channels between real ConnectionManagers.

Real sockets and real Noise handshakes on loopback. The interleavings that
broke the old rule ("keep the channel dialled by the smaller address; a
channel in the same direction replaces the old one") are forced here
deterministically by gating the dialler's ``connect`` (the manager looks it up
in its module at call time), not by hoping for the right timing:

1. *The loser's CLOSE beats the winner's connect.* A < B. B dialled A (Y) and
   both hold Y; A's own dial (X, the winner: dialled by the smaller address)
   was already under way. B accepts X (the responder adopts first) and closes
   Y. A reads Y's CLOSE before its ``connect`` for X returns -- two sockets,
   read in any order -- so A saw its only link die: it reported B down, then
   up again, and dropped every frame sent in between. This is the flap seen in
   the daemon logs after ``kill -9`` + restart.
2. *Two dials in the same direction.* A dials B at two endpoints at once. B
   accepts X1 then X2 and keeps the newest (X2); A's connects return X2 then
   X1 and A keeps *its* newest (X1). Each end closes the channel the other
   keeps: both links die.
3. *A stale link wins.* B is killed (kill -9: no CLOSE) while A's reader is
   busy, so A has not handled the EOF and still lists the dead channel. B
   restarts and dials A: the dead link won the tie-break and the live one was
   closed, again and again, until A's reader caught up.
4. *A half-open link wins.* B's host freezes (no FIN, no reset: A's channel
   stays open) and B restarts. Its dial loses the tie-break to the half-open
   link A dialled, again and again, until the failure detector drops it. Boot
   ids tell the restart apart: the new life replaces the link at once.
5. *A delayed dial from the previous life* arrives after the new life is
   linked: refused, it never replaces the newer link.

With the fix every test below passes; with the old connections.py, 1-3 fail,
and 4-5 fail without boot ids (see the module docs of
:mod:`hivemesh.runtime.connections` for the rule).
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import hivemesh.runtime.connections as connections  # the dialler looks up connect there
from hivemesh.core.identity import Identity
from hivemesh.errors import ChannelSuperseded, PeerRestarted
from hivemesh.runtime.connections import ConnectionManager

HOST = "127.0.0.1"
Real = Callable[[], Awaitable[Any]]


def _pair() -> tuple[Identity, Identity]:
    """Two identities, the one with the smaller address first."""
    x, y = Identity.from_seed(b"\x11" * 32), Identity.from_seed(b"\x12" * 32)
    return (x, y) if x.address < y.address else (y, x)


class Peer:
    """A ConnectionManager that records what it reports and receives; one
    node start (a life, with its own boot id)."""

    def __init__(self, ident: Identity, *, block_first: asyncio.Event | None = None) -> None:
        self.ident = ident
        self.boot_id = secrets.token_bytes(16)
        self.events: list[tuple[str, bool]] = []
        self.got: list[bytes] = []
        self._block_first = block_first

        async def on_frames(peer: str, frames: list[bytes]) -> None:
            gate, self._block_first = self._block_first, None
            if gate is not None:
                await gate.wait()  # a busy handler: this reader stalls here
            self.got.extend(frames)

        async def on_peer(peer: str, up: bool) -> None:
            self.events.append((peer, up))

        self.mgr = ConnectionManager(
            ident,
            authorize=lambda _a: True,
            on_frames=on_frames,
            on_peer=on_peer,
            dial_timeout_s=2.0,
            reconnect_min_s=0.02,
            reconnect_max_s=0.1,
            slow_peer_timeout_s=5.0,
            rng=random.Random(7),
            handover_s=1.0,
            boot_id=self.boot_id,
        )

    def link_channel(self, other: Peer) -> Any:
        link = self.mgr.links.get(other.ident.address)
        return None if link is None else link.channel


def shared(a: Peer, b: Peer) -> bool:
    """Both ends hold the same open channel (same handshake hash) as their link."""
    ca, cb = a.link_channel(b), b.link_channel(a)
    return (
        ca is not None
        and cb is not None
        and ca.handshake_hash == cb.handshake_hash
        and ca.is_sending
        and cb.is_sending
    )


async def until(pred: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.002)


async def crash(p: Peer) -> None:
    """kill -9 semantics: every socket goes away at once, no CLOSE is sent."""
    m = p.mgr
    m._closing = True
    for link in [*m.links.values(), *m._retired]:
        link.channel._writer.transport.abort()
    for task in [*m._dialling.values(), *([m._dial_loop] if m._dial_loop else [])]:
        task.cancel()
    m._server._server.close()
    await m.close()


def freeze(p: Peer, other: Peer) -> Any:
    """``p``'s host freezes: it stops reading and writing its link to ``other``
    and accepts nothing, but no FIN or reset ever reaches ``other`` (half-open).
    Returns the frozen channel (abort its transport to clean up)."""
    ch = p.link_channel(other)
    ch._transport.pause_reading()
    ch._write_task.cancel()
    p.mgr._server._server.close()
    return ch


class GatedConnect:
    """Replaces ``connections.connect``; hooks can hold a dial at chosen points."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.hooks: dict[tuple[str, str], Callable[[Real], Awaitable[Any]]] = {}
        self.entered: set[tuple[str, str]] = set()

    async def __call__(self, host: str, port: int, identity: Identity, **kw: Any) -> Any:
        key = (identity.address, host)
        hook = self.hooks.pop(key, None)
        if hook is None:
            return await self.real(host, port, identity, **kw)
        self.entered.add(key)
        return await hook(lambda: self.real(host, port, identity, **kw))


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> GatedConnect:
    g = GatedConnect(connections.connect)
    monkeypatch.setattr(connections, "connect", g)
    return g


def run(coro: Awaitable[None], limit_s: float = 30.0) -> None:
    async def main() -> None:
        async with asyncio.timeout(limit_s):
            await coro

    asyncio.run(main())


def test_the_losers_close_beating_the_winners_connect_is_no_flap(gated: GatedConnect) -> None:
    small, big = _pair()

    async def main() -> None:
        a, b = Peer(small), Peer(big)
        pa, pb = await a.mgr.listen(HOST, 0), await b.mgr.listen(HOST, 0)
        go = asyncio.Event()
        y_on_a: list[Any] = []
        held = [b"held-%d" % i for i in range(20)]

        async def a_dials_b(real: Real) -> Any:
            await go.wait()  # started before Y existed, returns after
            x = await real()  # B accepts X now (the winner) and drops Y
            y = y_on_a[0]
            await until(lambda: not y.is_sending, "A reads Y's CLOSE before X's connect returns")
            await until(lambda: a.link_channel(b) is not y, "A's reader handled Y's end")
            for frame in held:  # sent while A has no link to B
                await a.mgr.send(big.address, frame)
            return x

        gated.hooks[(small.address, HOST)] = a_dials_b
        a.mgr.want(HOST, pb, big.address)
        await until(lambda: (small.address, HOST) in gated.entered, "A's dial is under way")
        b.mgr.want(HOST, pa, small.address)  # B dials Y
        await until(lambda: shared(a, b), "both ends hold Y")
        y_on_a.append(a.link_channel(b))
        go.set()
        await until(lambda: shared(a, b) and a.link_channel(b) is not y_on_a[0], "X shared")
        assert a.link_channel(b).handshake_hash != y_on_a[0].handshake_hash
        # nobody reported the other down: one up each, ever
        assert a.events == [(big.address, True)], a.events
        assert b.events == [(small.address, True)], b.events
        await until(lambda: all(f in b.got for f in held), "frames sent mid-switch arrive")
        assert a.mgr.counters["dropped_no_channel"] == 0
        assert a.mgr.counters["handover_completed"] == 1
        await asyncio.gather(a.mgr.close(), b.mgr.close())

    run(main())


def test_two_dials_in_the_same_direction_settle_on_one_channel(gated: GatedConnect) -> None:
    small, big = _pair()

    async def main() -> None:
        a, b = Peer(small), Peer(big)
        await a.mgr.listen(HOST, 0)
        pb = await b.mgr.listen("0.0.0.0", 0)  # reachable at 127.0.0.1 and 127.0.0.2
        first_done = asyncio.Event()
        x2: list[Any] = []

        async def dial_1(real: Real) -> Any:
            x1 = await real()  # B accepts X1 first ...
            first_done.set()
            await until(lambda: x2, "dial 2 returned")
            ch = x2[0]
            await until(
                lambda: ch is None or a.link_channel(b) is ch or not ch.is_sending,
                "A took X2 before X1",
            )
            return x1  # ... and A gets X1 last

        async def dial_2(real: Real) -> Any:
            await first_done.wait()
            try:
                ch = await real()
            except ChannelSuperseded:
                x2.append(None)
                raise
            x2.append(ch)
            return ch

        gated.hooks[(small.address, "127.0.0.1")] = dial_1
        gated.hooks[(small.address, "127.0.0.2")] = dial_2
        a.mgr.want("127.0.0.1", pb, big.address)
        a.mgr.want("127.0.0.2", pb, big.address)
        await until(lambda: shared(a, b), "one shared channel", 5.0)
        await asyncio.sleep(0.3)  # a disagreement would tear the link down by now
        assert shared(a, b)
        assert a.events == [(big.address, True)], a.events
        assert b.events == [(small.address, True)], b.events
        await asyncio.gather(a.mgr.close(), b.mgr.close())

    run(main())


def test_a_dead_link_whose_eof_is_not_yet_handled_never_wins() -> None:
    small, big = _pair()

    async def main() -> None:
        stall = asyncio.Event()
        a, b = Peer(small), Peer(big)
        await a.mgr.listen(HOST, 0)
        pb = await b.mgr.listen(HOST, 0)
        a.mgr.want(HOST, pb, big.address)  # the old link is dialled by the smaller address
        await until(lambda: shared(a, b), "connected")
        a._block_first = stall  # A's reader will sit in its handler ...
        await b.mgr.send(small.address, b"last words")
        await until(lambda: a._block_first is None, "A's reader is busy")
        old = a.link_channel(b)
        await crash(b)  # ... while B dies: A's transport sees EOF, A's reader does not
        await until(lambda: old.is_closed, "the old channel ended")
        assert a.link_channel(b) is old  # still listed: its reader is stuck
        b2 = Peer(big)
        await b2.mgr.listen(HOST, pb)  # restarted on the same port
        b2.mgr.want(HOST, a.mgr.listen_port or 0, small.address)
        await until(lambda: shared(a, b2), "A and the restarted B share a channel", 3.0)
        assert a.link_channel(b2) is not old
        stall.set()  # the old reader finally runs: nothing changes
        await until(lambda: b"last words" in a.got, "the frame read before the crash")
        await asyncio.sleep(0.1)
        assert shared(a, b2)
        assert a.events == [(big.address, True), (big.address, False), (big.address, True)]
        await asyncio.gather(a.mgr.close(), b2.mgr.close())

    run(main())


def test_restart_storm_always_converges_on_one_usable_channel() -> None:
    """kill -9 + restart of one side, both redialling at once, many times."""
    small, big = _pair()
    rng = random.Random(2024)

    async def main() -> None:
        for victim_is_small in (False, True):
            keep, gone = (big, small) if victim_is_small else (small, big)
            a = Peer(keep)
            pa = await a.mgr.listen(HOST, 0)
            b = Peer(gone)
            pb = await b.mgr.listen(HOST, 0)
            a.mgr.want(HOST, pb, gone.address)
            b.mgr.want(HOST, pa, keep.address)
            rounds = 12
            for i in range(rounds):
                await until(lambda a=a, b=b: shared(a, b), f"round {i}: shared channel", 5.0)
                ping, pong = b"ping-%d" % i, b"pong-%d" % i
                await a.mgr.send(gone.address, ping)
                await b.mgr.send(keep.address, pong)
                await until(lambda b=b, ping=ping: ping in b.got, f"round {i}: ping")
                await until(lambda a=a, pong=pong: pong in a.got, f"round {i}: pong")
                await crash(b)
                await asyncio.sleep(rng.random() * 0.03)  # vary who dials first
                b = Peer(gone)
                await b.mgr.listen(HOST, pb)
                b.mgr.want(HOST, pa, keep.address)
            await until(lambda a=a, b=b: shared(a, b), "last round: shared channel", 5.0)
            # the survivor saw exactly: up, then (down, up) once per restart, no flaps
            expected = [(gone.address, True)] + [
                (gone.address, False),
                (gone.address, True),
            ] * rounds
            n = len(expected)
            await until(lambda a=a, n=n: len(a.events) >= n, "every report")
            assert a.events == expected, a.events
            await until(lambda b=b: b.events, "the restarted side reports its peer")
            assert b.events == [(keep.address, True)]
            await asyncio.gather(a.mgr.close(), b.mgr.close())

    run(main(), limit_s=40.0)


def test_a_handover_that_never_completes_reports_down_and_counts_the_frames() -> None:
    small, big = _pair()

    async def main() -> None:
        a, b = Peer(small), Peer(big)
        pa = await a.mgr.listen(HOST, 0)
        await b.mgr.listen(HOST, 0)
        b.mgr.want(HOST, pa, small.address)
        await until(lambda: shared(a, b), "connected")
        # B retires the link (as if it held a better channel) and then vanishes
        # before that channel reaches A: no dials, no accepts.
        b.mgr._closing = True
        for task in [*b.mgr._dialling.values(), *([b.mgr._dial_loop] if b.mgr._dial_loop else [])]:
            task.cancel()
        b.mgr._server.close()
        b.link_channel(a).retire(ChannelSuperseded("test"))
        await until(lambda: big.address in a.mgr._handovers, "A waits for the winner")
        for i in range(5):
            assert await a.mgr.send(big.address, b"waiting-%d" % i)  # held, not dropped
        assert a.events == [(big.address, True)]
        await until(lambda: len(a.events) == 2, "handover expires", 3.0)
        assert a.events == [(big.address, True), (big.address, False)]
        assert a.mgr.counters["handover_expired"] == 1
        assert a.mgr.counters["dropped_on_close"] == 5  # the held frames, counted
        await a.mgr.close()
        b.mgr._closing = False
        await b.mgr.close()

    run(main())


def test_a_half_open_link_is_dropped_when_the_failure_detector_says_so() -> None:
    """The peer's host vanished without a FIN: the channel never ends by itself.
    (Whether a link is silent is the Peer's rule: test_core_peer.)"""
    small, big = _pair()

    async def main() -> None:
        a, b = Peer(small), Peer(big)
        await a.mgr.listen(HOST, 0)
        pb = await b.mgr.listen(HOST, 0)
        a.mgr.want(HOST, pb, big.address)
        await until(lambda: shared(a, b), "connected")
        await a.mgr.send(big.address, b"hello")
        await until(lambda: b"hello" in b.got, "delivered")
        await b.mgr.send(small.address, b"hi")
        await until(lambda: b"hi" in a.got, "delivered back")
        # b goes silent without closing anything (a frozen host): a sees no EOF
        b_ch = b.link_channel(a)
        b_ch._write_task.cancel()
        for task in [*b.mgr._dialling.values(), *([b.mgr._dial_loop] if b.mgr._dial_loop else [])]:
            task.cancel()
        await asyncio.sleep(0.3)
        assert a.link_channel(b) is not None and a.link_channel(b).is_sending
        await a.mgr.disconnect(big.address, "half-open")  # the Peer's Close
        assert a.link_channel(b) is None
        await until(lambda: (big.address, False) in a.events, "reported down")
        b_ch._writer.transport.abort()
        await asyncio.gather(a.mgr.close(), b.mgr.close())

    run(main())


def test_a_restarted_peer_replaces_its_half_open_link_at_once() -> None:
    small, big = _pair()

    async def main() -> None:
        a, b1 = Peer(small), Peer(big)
        pa = await a.mgr.listen(HOST, 0)
        pb1 = await b1.mgr.listen(HOST, 0)
        a.mgr.want(HOST, pb1, big.address)  # dialled by the smaller address: the best rank
        await until(lambda: shared(a, b1), "connected")
        old = a.link_channel(b1)
        frozen = freeze(b1, a)
        await a.mgr.send(big.address, b"into the void")  # accepted by the kernel, never read
        b2 = Peer(big)  # the same identity, restarted: a new boot id
        await b2.mgr.listen(HOST, 0)
        b2.mgr.want(HOST, pa, small.address)
        await until(lambda: shared(a, b2), "A links the restarted B", 2.0)
        assert old.is_closed and isinstance(old.close_reason, PeerRestarted)
        assert a.link_channel(b2).peer_boot_id == b2.boot_id
        assert a.mgr.counters["peer_restarted"] == 1
        assert a.mgr.counters["duplicate_channel_closed"] == 0
        await until(lambda: len(a.events) == 3, "A reports B down and up")
        assert a.events == [(big.address, True), (big.address, False), (big.address, True)]
        await b2.mgr.send(small.address, b"back")
        await a.mgr.send(big.address, b"welcome")
        await until(lambda: b"back" in a.got and b"welcome" in b2.got, "both ways")
        assert a.mgr.statistics()[big.address]["boot_id"] == b2.boot_id.hex()
        frozen._writer.transport.abort()
        await asyncio.gather(a.mgr.close(), b2.mgr.close(), crash(b1))

    run(main())


def test_a_delayed_dial_from_the_previous_life_is_refused(gated: GatedConnect) -> None:
    small, big = _pair()

    async def main() -> None:
        a, b1 = Peer(small), Peer(big)
        pa = await a.mgr.listen(HOST, 0)
        pb1 = await b1.mgr.listen(HOST, 0)
        go = asyncio.Event()

        async def held(real: Real) -> Any:
            await go.wait()  # the old life's dial, delayed past its restart
            return await real()

        gated.hooks[(big.address, HOST)] = held
        b1.mgr.want(HOST, pa, small.address)
        await until(lambda: (big.address, HOST) in gated.entered, "B's first dial is held")
        a.mgr.want(HOST, pb1, big.address)
        await until(lambda: shared(a, b1), "connected")
        frozen = freeze(b1, a)
        b2 = Peer(big)
        await b2.mgr.listen(HOST, 0)
        b2.mgr.want(HOST, pa, small.address)
        await until(lambda: shared(a, b2), "A links the restarted B", 2.0)
        go.set()
        await until(lambda: a.mgr.counters["stale_boot_refused"] == 1, "the old dial refused")
        assert shared(a, b2) and a.link_channel(b2).peer_boot_id == b2.boot_id
        assert a.mgr.counters["peer_restarted"] == 1
        assert a.events == [(big.address, True), (big.address, False), (big.address, True)]
        await b2.mgr.send(small.address, b"still here")
        await until(lambda: b"still here" in a.got, "the new life's link still carries")
        frozen._writer.transport.abort()
        await asyncio.gather(a.mgr.close(), b2.mgr.close(), crash(b1))

    run(main())
