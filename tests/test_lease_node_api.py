"""``hivemesh.Node.leases`` and ``Node.claims``: three in-process nodes on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hivemesh.commands import LeaseVoters
from hivemesh.leases import FencingGuard
from hivemesh.leases.errors import LeaseUnavailable
from hivemesh.node import Node

# loopback nodes that bootstrap from each other: open trust (nodes are private by default)
FAST = {
    "probe_interval_ms": 200,
    "probe_timeout_ms": 100,
    "sync_interval_ms": 300,
    "trust_mode": "open",
}


def test_node_leases_hold_and_claims_decide(tmp_path: Path) -> None:
    async def main() -> None:
        a = Node(tmp_path / "a", **FAST)
        await a.start()
        b = Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST)
        c = Node(tmp_path / "c", bootstrap=[a.endpoint], **FAST)
        try:
            await b.start()
            await c.start()
            for n in (a, b, c):
                await n.wait_peers(2, timeout_s=15)
            guard = FencingGuard()
            async with a.leases.hold("browser", ttl_ms=2000) as held:
                guard.check(held.token, "browser")
                try:
                    await b.leases.try_acquire("browser", ttl_ms=2000)
                    raise AssertionError("b acquired a held lease")
                except LeaseUnavailable:
                    pass
            lease = await b.leases.try_acquire("browser", ttl_ms=2000)
            assert lease.holder == b.address and lease.fencing_token > held.token
            guard.check(lease.check(), "browser")
            await b.leases.release(lease)
            voters = (await a.call(LeaseVoters())).to_wire()["voters"]
            assert sorted(voters) == sorted([a.address, b.address, c.address])

            await c.claims.claim("job")
            while b.claims.winner("job") != c.address:  # bounded by the asyncio.timeout below
                await asyncio.sleep(0.02)
            await b.claims.claim("job")
            assert await b.claims.wait_decided("job", timeout_s=5) == c.address
            assert await c.claims.wait_decided("job", timeout_s=5) == c.address
            assert await c.claims.release("job") == 1  # c moves on: b's claim is next
            while b.claims.winner("job") == c.address:  # the release replicates
                await asyncio.sleep(0.02)
            assert await b.claims.wait_decided("job", timeout_s=5) == b.address
        finally:
            for n in (c, b, a):
                await n.close()

    async def bounded() -> None:
        async with asyncio.timeout(60):
            await main()

    asyncio.run(bounded())


def test_a_restarted_node_releases_the_claims_of_its_previous_life(tmp_path: Path) -> None:
    async def main() -> None:
        a = Node(tmp_path / "a", **FAST)
        await a.start()
        try:
            seq = await a.claims.claim("job")
            assert a.claims.view.own_live(a.daemon.identity.public) == [("job", seq)]
        finally:
            await a.close()
        again = Node(tmp_path / "a", **FAST)
        await again.start()
        try:
            assert again.claims.view.own_live(again.daemon.identity.public) == []
            assert again.claims.winner("job") is None
            fresh = await again.claims.claim("job")  # a new claim, not the dead one
            assert fresh > seq
        finally:
            await again.close()

    asyncio.run(asyncio.wait_for(main(), 60))
