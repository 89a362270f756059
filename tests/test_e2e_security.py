"""Node-level security on real processes: forged relays and revocation.

The daemons are real ``hivemesh up`` processes. The attacker is this test
process speaking the real protocol over the real transport: it holds its own
Ed25519 identity (so it is an authenticated, trusted peer in ``open`` mode)
and builds frames with the core codec.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.core.event import decode_event, encode_event
from hivemesh.core.feed import head_message
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import Identity, public_key_of
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore
from hivemesh.errors import HivemeshError
from hivemesh.runtime.daemon import now_ms
from hivemesh.transports import SecureChannel, connect


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    root: Path = tmp_path_factory.mktemp("sec")
    with LocalSwarm(root) as s:
        a = s.start("a")
        s.start("b", bootstrap=[a.endpoint])
        yield s


async def _until(fn: Any, timeout_s: float = 10.0, what: str = "condition") -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            value = await asyncio.to_thread(fn)
        except HivemeshError:
            value = None
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s")
        await asyncio.sleep(0.05)


async def _dial(host_port: tuple[str, int], me: Identity, target: str) -> SecureChannel:
    return await connect(
        host_port[0],
        host_port[1],
        me,
        expect_address=target,
        authorize=lambda _addr: True,
        timeout_s=5.0,
    )


async def _recv_type(ch: SecureChannel, ftype: int, timeout_s: float = 5.0) -> list[Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            got, fields = decode_frame(await ch.recv())
            if got == ftype:
                return fields


async def _author_sends_first_event(
    target: Any, who: Identity, seed: int
) -> tuple[Node, SecureChannel]:
    """``who`` runs a real core node (to author valid events), dials ``target``
    and sends it its first event; returns the core node and the channel."""
    core = Node(who, MemoryStore(), random.Random(seed), now_ms=now_ms())
    core.add_peer(target.address)
    ch = await _dial(("127.0.0.1", target.port), who, target.address)
    core.append("app.note", {"n": 1}, now_ms())
    for _peer, frame in core.outbox():
        await ch.send(frame)
    return core, ch


def _vv(client: Client) -> dict[str, int]:
    vv: dict[str, int] = client.status()["journal"]["version_vector"]
    return vv


def test_forged_event_relayed_by_a_trusted_peer_is_rejected(swarm: LocalSwarm) -> None:
    a, b = swarm.nodes["a"], swarm.nodes["b"]
    b.client.ctx_set("default", "owner", "b")

    async def scenario() -> None:
        await _until(lambda: _vv(a.client).get(b.address, 0) >= 2, what="a holds b's feed")
        held = _vv(a.client)[b.address]
        mallory = Identity.from_seed(bytes([7]) * 32)
        ch = await _dial(("127.0.0.1", a.port), mallory, a.address)
        b_pub = public_key_of(b.address)
        # Fetch b's real feed from a, to forge a perfect continuation of it.
        ch.send_nowait(encode_frame(FrameType.WANT, [[b_pub, 1, held]]))
        author, raws, _sig, _hops = await _recv_type(ch, FrameType.EVENTS)
        assert author == b_pub
        last = decode_event(raws[-1])
        forged = encode_event(
            b_pub, last.seq + 1, last.id, last.hlc + 1, "ctx.update", {"c": "x", "u": b"evil"}
        )
        bad_sig = mallory.sign(head_message(b_pub, forged.seq, forged.id))
        before = (await asyncio.to_thread(a.client.status))["counters"].get("bad_signature", 0)
        ch.send_nowait(encode_frame(FrameType.EVENTS, b_pub, [forged.raw], bad_sig, 0))
        await _until(
            lambda: a.client.status()["counters"].get("bad_signature", 0) > before,
            what="a counts the forged signature",
        )
        assert _vv(a.client)[b.address] == held
        # and it went no further: b's own view of its feed is unchanged
        assert _vv(b.client)[b.address] == held
        ch.close()

    asyncio.run(scenario())


def test_an_author_that_signs_its_own_events_badly_is_dropped_and_cut_off(
    swarm: LocalSwarm,
) -> None:
    """Batches straight from their author are applied before their signature
    is checked (core.journal, attested runs); a bad one is found at the next
    group commit: the run is dropped, counted, never served, the author cut off."""
    a, b = swarm.nodes["a"], swarm.nodes["b"]

    async def scenario() -> None:
        liar = Identity.from_seed(bytes([11]) * 32)
        core, ch = await _author_sends_first_event(a, liar, 2)
        # b pulls #1 from a, so a has settled (verified and stored) it
        await _until(lambda: _vv(b.client).get(liar.address) == 1, what="b holds liar's #1")
        ev = core.append("app.note", {"n": 2}, now_ms())
        core.outbox()
        bad_sig = liar.sign(b"anything but the head message")
        before = (await asyncio.to_thread(a.client.status))["counters"].get("bad_signature", 0)
        await ch.send(encode_frame(FrameType.EVENTS, liar.public, [ev.raw], bad_sig, 0))
        await _until(
            lambda: a.client.status()["counters"].get("bad_signature", 0) > before,
            what="a finds the bad signature",
        )
        with pytest.raises(HivemeshError):  # a hung up on the liar
            async with asyncio.timeout(5):
                while True:
                    await ch.recv()
        assert _vv(a.client)[liar.address] == 1  # back to the verified head
        assert (await asyncio.to_thread(a.client.status))["counters"].get(
            "attested_events_dropped", 0
        ) >= 1
        assert _vv(b.client)[liar.address] == 1  # #2 was never served

    asyncio.run(scenario())


def test_revoked_peer_is_disconnected_and_its_new_events_refused(swarm: LocalSwarm) -> None:
    a = swarm.nodes["a"]

    async def scenario() -> None:
        rev = Identity.from_seed(bytes([9]) * 32)
        trusted = Identity.from_seed(bytes([10]) * 32)
        # The revoked-to-be peer runs a real core node to author valid events.
        core, ch = await _author_sends_first_event(a, rev, 1)
        await _until(lambda: _vv(a.client).get(rev.address) == 1, what="a accepts rev's event")

        await asyncio.to_thread(a.client.revoke, rev.address)
        # disconnected: the channel ends, with the peer told why
        with pytest.raises(HivemeshError):
            async with asyncio.timeout(5):
                while True:
                    await ch.recv()
        # refused at the handshake when it tries again
        with pytest.raises(HivemeshError):
            await _dial(("127.0.0.1", a.port), rev, a.address)
        peers = await asyncio.to_thread(a.client.peers)
        assert not any(p["address"] == rev.address and p["channel"] for p in peers)

        # its new, validly signed events relayed by a trusted peer are refused
        core.append("app.note", {"n": 2}, now_ms())
        frames = [f for _p, f in core.outbox()]
        assert frames
        before = (await asyncio.to_thread(a.client.status))["counters"].get("untrusted_author", 0)
        relay = await _dial(("127.0.0.1", a.port), trusted, a.address)
        for f in frames:
            await relay.send(f)
        await _until(
            lambda: a.client.status()["counters"].get("untrusted_author", 0) > before,
            what="a counts the untrusted author",
        )
        assert _vv(a.client)[rev.address] == 1
        relay.close()

    asyncio.run(scenario())


def test_a_pinned_bootstrap_address_defeats_an_impostor_endpoint(swarm: LocalSwarm) -> None:
    a, b = swarm.nodes["a"], swarm.nodes["b"]
    # c is told "b lives at a's endpoint": the handshake proves otherwise
    c = swarm.start("c", bootstrap=[f"{b.address}@{a.endpoint}"])

    def refused() -> bool:
        counters = c.client.status()["counters"]
        return bool(counters.get("dial_failed_identity_mismatch", 0) >= 1)

    wait_until(refused, 10, what="c refuses the impostor")
    assert c.client.peers() == [] or all(p["channel"] is None for p in c.client.peers())
    assert a.address not in c.client.status()["journal"]["version_vector"]
