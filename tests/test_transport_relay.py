"""The relay on 127.0.0.1: end-to-end secure channels through a relay that
cannot read or forge them; limits and hostile input refused and counted."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from aiotest import eventually, run
from hivemesh.core.identity import Identity
from hivemesh.errors import ConnectionClosed, PeerUnreachable, UnknownPeer
from hivemesh.transports import SecureChannel

quic = pytest.importorskip("hivemesh.transports.quic", reason="aioquic is not installed")
from hivemesh.transports.relay import RelayClient, RelayService  # noqa: E402
from hivemesh.transports.relay_policy import RelayLimits, RelayTable  # noqa: E402
from hivemesh.transports.relay_wire import Kind, Message, Punch, decode, encode  # noqa: E402

HOST = "127.0.0.1"
A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
C = Identity.from_seed(b"c" * 32)
M = Identity.from_seed(b"m" * 32)  # not trusted by the relay


@dataclass
class Node:
    identity: Identity
    endpoint: quic.QuicEndpoint
    inbound: list[SecureChannel] = field(default_factory=list)
    punches: list[tuple[str, int, tuple[tuple[str, int], ...]]] = field(default_factory=list)
    observed: list[tuple[str, tuple[str, int]]] = field(default_factory=list)
    clients: list[RelayClient] = field(default_factory=list)  # held while the test runs

    async def accept(self, channel: SecureChannel) -> None:
        self.inbound.append(channel)

    def client(self, relay: Node, **kw: object) -> RelayClient:
        client = RelayClient(
            self.endpoint,
            self.identity,
            relay.identity.address,
            (HOST, relay.endpoint.port),
            authorize=lambda addr: True,
            on_channel=self.accept,
            on_punch=lambda rc, peer, cid, cands: self.punches.append((peer, cid, cands)),
            on_observed=lambda relay, hp: self.observed.append((relay, hp)),
            **kw,  # type: ignore[arg-type]
        )
        self.clients.append(client)
        return client


@asynccontextmanager
async def mesh(
    limits: RelayLimits | None = None, trust: Callable[[str], bool] = lambda a: a != M.address
) -> AsyncIterator[tuple[Node, Node, Node, RelayService, list[bytes]]]:
    forwarded: list[bytes] = []
    service = RelayService(RelayTable(limits or RelayLimits()), tap=forwarded.append)

    async def no_nodes(ch: SecureChannel) -> None:
        ch.close()

    relay_ep = await quic.QuicEndpoint.open(
        HOST, 0, C, authorize=trust, on_channel=no_nodes, on_relay_channel=service.handle
    )
    nodes = []
    for ident in (A, B):
        node = Node(ident, None)  # type: ignore[arg-type]
        node.endpoint = await quic.QuicEndpoint.open(
            HOST, 0, ident, authorize=lambda a: True, on_channel=node.accept
        )
        nodes.append(node)
    relay = Node(C, relay_ep)
    try:
        yield nodes[0], nodes[1], relay, service, forwarded
    finally:
        for e in (nodes[0].endpoint, nodes[1].endpoint, relay_ep):
            e.close()


async def relayed(a: Node, b: Node, c: Node) -> tuple[RelayClient, SecureChannel, int]:
    """b reserves at the relay c; a opens a circuit to b through c, which b accepts."""
    await b.client(c).start()
    ra = a.client(c)
    await ra.start(reserve=False)
    ch, cid = await ra.open(B.address)
    await eventually(lambda: bool(b.inbound), "b accepted")
    return ra, ch, cid


def test_a_relayed_channel_is_end_to_end_and_the_relay_sees_only_ciphertext() -> None:
    async def main() -> None:
        async with mesh() as (a, b, c, service, forwarded):
            rb = b.client(c)
            await rb.start()
            ra = a.client(c)
            await ra.start(reserve=False)
            ch, _ = await ra.open(B.address)
            assert ch.peer_address == B.address and ch.path == f"relay:{C.address}"
            await eventually(lambda: bool(b.inbound), "b accepted the relayed channel")
            (inbound,) = b.inbound
            assert inbound.peer_address == A.address and inbound.handshake_hash == ch.handshake_hash
            secret = b"SECRET-PAYLOAD-" * 1000
            for _ in range(20):
                await ch.send(secret)
            for _ in range(20):
                assert await inbound.recv() == secret
            await inbound.send(b"back")
            assert await ch.recv() == b"back"
            seen = b"".join(forwarded)
            assert len(seen) > 20 * len(secret) and b"SECRET-PAYLOAD" not in seen
            assert service.counters["relay_bytes"] == len(seen)
            assert a.observed and a.observed[0][0] == C.address
            assert a.observed[0][1] == (HOST, a.endpoint.port)
            ch.close()
            await eventually(lambda: inbound.is_closed, "the close travelled through the relay")

    run(main())


def test_untrusted_and_unreserved_requests_are_refused_and_counted() -> None:
    async def main() -> None:
        async with mesh() as (a, _b, c, service, _):
            m_ep = await quic.QuicEndpoint.open(
                HOST, 0, M, authorize=lambda x: True, on_channel=a.accept
            )
            try:
                rm = RelayClient(
                    m_ep,
                    M,
                    C.address,
                    (HOST, c.endpoint.port),
                    authorize=lambda x: True,
                    on_channel=a.accept,
                )
                with pytest.raises(UnknownPeer):
                    await rm.start()
                await eventually(
                    lambda: c.endpoint.counters.get("errors.unknown_peer") == 1, "counted"
                )
            finally:
                m_ep.close()
            ra = a.client(c)
            await ra.start(reserve=False)
            with pytest.raises(PeerUnreachable, match="no_reservation"):
                await ra.open(B.address)
            assert service.counters["relay_refused_no_reservation"] == 1

    run(main())


def test_spoofed_punches_floods_and_oversize_frames_are_refused_and_counted() -> None:
    async def main() -> None:
        limits = RelayLimits(max_data_bytes=40 << 10, max_candidates=4, punch_interval_s=60)
        async with mesh(limits) as (a, b, c, service, _):
            ra, ch, cid = await relayed(a, b, c)
            # a punch claiming another identity
            await ra.send_raw(encode(Message(Kind.PUNCH, cid, punch=Punch(M.address, ()))))
            # a punch on a circuit that is not a's
            await ra.send_raw(encode(Message(Kind.PUNCH, cid + 99, punch=Punch(A.address, ()))))
            # a candidate flood
            flood = tuple(("127.0.0.1", 1000 + i) for i in range(20))
            await ra.send_raw(encode(Message(Kind.PUNCH, cid, punch=Punch(A.address, flood))))
            # a fair punch, then one too soon
            await ra.punch(cid, (("127.0.0.1", 4242),))
            await ra.punch(cid, (("127.0.0.1", 4242),))
            await ra.send_raw(b"\x63garbage")
            await eventually(
                lambda: service.counters.get("relay_refused_punch_rate") == 1, "punches handled"
            )
            cnt = service.counters
            assert cnt["relay_refused_spoofed"] == 1
            assert cnt["relay_refused_foreign"] == 1
            assert cnt["relay_refused_candidates"] == 1
            assert cnt["relay_refused_malformed"] == 1
            assert cnt["relay_punches"] == 1
            await eventually(lambda: bool(b.punches) and bool(a.punches), "both got candidates")
            peer, _, cands = b.punches[0]
            assert peer == A.address and cands[0] == (HOST, a.endpoint.port)
            assert (HOST, 4242) in cands
            # an oversize relayed frame closes that circuit only
            big = encode(Message(Kind.DATA, cid, data=b"x" * (41 << 10)))
            await ra.send_raw(big)
            await eventually(lambda: ch.is_closed, "the circuit closed")
            assert service.counters["relay_refused_oversize"] == 1
            assert isinstance(ch.close_reason, ConnectionClosed)
            assert ra.is_up  # the relay channel itself carries on
            ch2, _ = await ra.open(B.address)
            assert ch2.peer_address == B.address

    run(main())


def test_relay_bandwidth_is_shaped_and_circuits_per_peer_are_capped() -> None:
    async def main() -> None:
        limits = RelayLimits(bytes_per_s=400_000, burst_bytes=100_000, max_circuits_per_peer=2)
        async with mesh(limits) as (a, b, c, service, _):
            ra, ch, _ = await relayed(a, b, c)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            payload = b"y" * 50_000
            for _ in range(10):  # 500 kB at 400 kB/s after a 100 kB burst: >= ~1 s
                await ch.send(payload)
            for _ in range(10):
                assert await b.inbound[0].recv() == payload
            assert loop.time() - t0 >= 0.8
            assert service.counters["relay_throttled"] > 0
            await ra.open(B.address)
            with pytest.raises(PeerUnreachable, match="circuits_per_peer"):
                await ra.open(B.address)
            assert struct.calcsize(">BI") == 5

    run(main())


def test_a_peers_second_relay_channel_ends_the_circuits_of_its_first() -> None:
    async def main() -> None:
        async with mesh(RelayLimits(max_circuits_per_peer=1)) as (a, b, c, service, _):
            ra, ch, cid = await relayed(a, b, c)
            assert service.table.circuit(A.address, cid) is not None
            ra2 = a.client(c)  # a second relay channel from a: it replaces the first
            await ra2.start(reserve=False)
            await eventually(lambda: b.inbound[0].is_closed, "b heard its circuit end")
            await eventually(lambda: ch.is_closed and not ra.is_up, "a's first channel ended")
            assert service.table.circuit(A.address, cid) is None
            assert service.counters["relay_channels_replaced"] == 1
            assert service.counters["relay_circuits_closed"] == 1
            ch2, _ = await ra2.open(B.address)  # the cap of one is free again
            await eventually(lambda: len(b.inbound) == 2, "b accepted the new circuit")
            await ch2.send(b"over the new channel")
            assert await b.inbound[1].recv() == b"over the new channel"
            assert service.counters.get("relay_refused_circuits_per_peer", 0) == 0

    run(main())


class _FakeRelayChannel:
    """A relay channel of ``peer`` whose batches of frames the test hands in."""

    def __init__(self, peer: str) -> None:
        self.peer_address, self.remote_endpoint = peer, None
        self.batches: asyncio.Queue[list[bytes]] = asyncio.Queue()
        self.got: list[Message] = []
        self.closed = False

    async def recv_batch(self) -> list[bytes]:
        return await self.batches.get()

    async def send(self, data: bytes, timeout_s: float | None = None) -> None:
        self.got.append(decode(data))

    def close(self) -> None:
        self.closed = True  # frames already read still come out of recv_batch


def test_frames_a_replaced_channel_had_read_are_not_served() -> None:
    """A batch the old channel read before it was replaced opens nothing: its
    circuits would be the new channel's, which knows nothing of them."""

    async def main() -> None:
        service = RelayService()
        ch = {n: _FakeRelayChannel(n) for n in ("a1", "a2", "b")}
        ch["a2"].peer_address = ch["a1"].peer_address = "a"
        serve = lambda n: asyncio.ensure_future(service.handle(ch[n]))  # type: ignore[arg-type]  # noqa: E731
        tasks = [serve("b"), serve("a1")]
        ch["b"].batches.put_nowait([encode(Message(Kind.RESERVE))])
        await eventually(lambda: bool(ch["b"].got), "b reserved")
        ch["b"].got.clear()
        tasks.append(serve("a2"))
        await eventually(lambda: ch["a1"].closed, "a's first channel closed")
        connect = encode(Message(Kind.CONNECT, 5, text="b"))
        ch["a1"].batches.put_nowait([connect])
        await eventually(lambda: tasks[1].done(), "the replaced channel is served no more")
        assert service.table.circuit("a", 5) is None and ch["b"].got == []
        ch["a2"].batches.put_nowait([connect])
        await eventually(lambda: service.table.circuit("a", 5) is not None, "a2's circuit")
        assert [m.kind for m in ch["b"].got] == [Kind.INCOMING]
        for t in tasks:
            t.cancel()

    run(main())
