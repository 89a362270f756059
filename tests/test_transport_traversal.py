"""Hole punching's asyncio driver on 127.0.0.1: a punch we wait for labels the
connection it brings "punched", and every punch (success, failure, cancel)
forgets its candidates once it ends, so the endpoint's sources stay bounded."""

from __future__ import annotations

import asyncio

import pytest

from aiotest import eventually, run
from hivemesh.core.identity import Identity
from hivemesh.transports import SecureChannel

quic = pytest.importorskip("hivemesh.transports.quic", reason="aioquic is not installed")
from hivemesh.transports.traversal import Traversal  # noqa: E402

HOST = "127.0.0.1"
# The larger address waits for the smaller one's dial (punch.plan_punch).
D, W = sorted(
    (Identity.from_seed(b"d" * 32), Identity.from_seed(b"w" * 32)), key=lambda i: i.address
)


def test_a_punch_labels_its_connection_and_every_punch_forgets_its_candidates() -> None:
    async def main() -> None:
        inbound: list[SecureChannel] = []

        async def adopt(ch: SecureChannel) -> None:
            inbound.append(ch)

        async def ignore(ch: SecureChannel) -> None:
            return None

        w_ep = await quic.QuicEndpoint.open(
            HOST, 0, W, authorize=lambda a: True, on_channel=lambda ch: trav.inbound(ch)
        )
        d_ep = await quic.QuicEndpoint.open(HOST, 0, D, authorize=lambda a: True, on_channel=ignore)
        trav = Traversal(
            w_ep,
            W,
            authorize=lambda a: True,
            on_inbound=adopt,
            on_outbound=adopt,
            has_direct=lambda p: False,
            punch_wait_s=0.3,
        )
        sources, counts = w_ep.punch_sources, trav.counters.snapshot
        on_punch = trav._on_punch  # what the relay client calls on a peer's PUNCH
        try:
            # success: d's dial from its candidate arrives "punched"
            on_punch(None, D.address, 1, ((HOST, d_ep.port),))  # type: ignore[arg-type]
            assert (HOST, d_ep.port) in sources
            await d_ep.dial(HOST, w_ep.port, expect_address=W.address, path="punched")
            await eventually(lambda: counts().get("punch_ok") == 1, "the punch succeeded")
            assert [ch.path for ch in inbound] == ["punched"]
            assert len(sources) == 0
            # the punch ended: a later connection from there is plain UDP
            await d_ep.dial(HOST, w_ep.port, expect_address=W.address)
            await eventually(lambda: len(inbound) == 2, "the second channel")
            assert inbound[1].path == "udp"
            # many failures (nobody dials) ...
            peers = [f"{D.address[:2]}0{i:03d}" for i in range(60)]
            assert all(p < W.address for p in peers)  # we wait for each
            for i, peer in enumerate(peers[:30]):
                on_punch(None, peer, 1, ((HOST, 40000 + i),))  # type: ignore[arg-type]
            assert len(sources) == 30
            await eventually(lambda: counts().get("punch_failed") == 30, "30 punches failed")
            assert len(sources) == 0
            # ... and cancelled ones (the traversal closes while they wait)
            for i, peer in enumerate(peers[30:]):
                on_punch(None, peer, 1, ((HOST, 41000 + i),))  # type: ignore[arg-type]
            await asyncio.sleep(0.05)  # they run and wait
            assert len(sources) == 30
            trav.close()
            await eventually(lambda: counts().get("punch_failed") == 60, "30 punches cancelled")
            assert len(sources) == 0
        finally:
            trav.close()
            for ep in (w_ep, d_ep):
                ep.close()

    run(main())
