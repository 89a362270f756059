"""The public lease API: exported surface, fencing guard, hold() under failures."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest

import hivemesh.leases
from hivemesh.errors import InvalidArgument
from hivemesh.leases import FencingGuard, Lease, LeaseClient, LocalQuorum, open_backend
from hivemesh.leases.errors import LeaseLost, StaleFencingToken


def test_exported_members() -> None:
    assert len(set(hivemesh.leases.__all__)) == len(hivemesh.leases.__all__)
    assert set(hivemesh.leases.__all__) == {
        "DRIFT_MS",
        "DRIFT_RATIO",
        "MAX_TTL_MS",
        "MIN_TTL_MS",
        "FencingGuard",
        "HeldLease",
        "Lease",
        "LeaseBackend",
        "LeaseClient",
        "LeaseInfo",
        "LocalQuorum",
        "QuorumLeaseBackend",
        "VoterServer",
        "open_backend",
        "validate_holder",
        "validate_resource",
        "validate_ttl_ms",
    }
    for name in hivemesh.leases.__all__:
        assert getattr(hivemesh.leases, name) is not None


def test_fencing_guard_accepts_equal_and_higher_refuses_lower() -> None:
    g = FencingGuard()
    assert g.highest("db") is None
    g.check(5, "db")
    g.check(5, "db")
    g.check(9, "db")
    g.check(1, "other-resource")
    with pytest.raises(StaleFencingToken):
        g.check(8, "db")
    assert g.highest("db") == 9 and g.rejected == 1
    for bad in (-1, True, "3", None):
        with pytest.raises(InvalidArgument):
            g.check(bad, "db")  # type: ignore[arg-type]


def test_lease_check_is_valid_only_before_expiry() -> None:
    lease = Lease("r", "h", 7, 1000, expires=100.0)
    assert lease.check(now=99.0) == 7 and lease.remaining_ms(now=99.5) == 500
    with pytest.raises(LeaseLost):
        lease.check(now=100.0)


def test_hold_raises_lease_lost_when_the_backend_goes_dark() -> None:
    async def main() -> None:
        q = LocalQuorum(3)
        url = await q.start()
        client = LeaseClient(open_backend(url), "a", call_timeout_s=0.2)
        t = time.monotonic()
        body_finished = False
        with pytest.raises(LeaseLost):
            async with client.hold("r", 600) as held:
                for s in q.servers:
                    s._drop = 1.0  # every voter stops answering
                await asyncio.sleep(5)
                body_finished = True
        # cancelled by the believed expiry (about 600 ms), not after the 5 s body
        assert not body_finished and time.monotonic() - t < 2.0
        assert not held.lease.valid()
        assert client.statistics().get("backend_unavailable", 0) >= 1
        await client.aclose()
        q.close()

    asyncio.run(main())


def test_hold_releases_when_the_body_raises() -> None:
    async def main() -> None:
        q = LocalQuorum(3)
        url = await q.start()
        a, b = LeaseClient(open_backend(url), "a"), LeaseClient(open_backend(url), "b")
        with pytest.raises(ZeroDivisionError):
            async with a.hold("r", 5000):
                raise ZeroDivisionError
        assert await b.show("r") is None
        async with b.hold("r", 5000) as held:
            assert held.token == 2
        for c in (a, b):
            await c.aclose()
        q.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["delete", "purge"])
def test_nats_tokens_survive_an_operator_deleting_the_key(how: str) -> None:
    async def main() -> None:
        bucket = "hivemesh_test_leases"
        client = LeaseClient(open_backend(f"nats://127.0.0.1:4222/{bucket}"), "a")
        r = f"del-{uuid.uuid4().hex[:8]}"
        first = await client.try_acquire(r, 5000)
        nc = await nats.connect("nats://127.0.0.1:4222")
        kv = await nc.jetstream().key_value(bucket)
        await getattr(kv, how)(r)
        await nc.close()
        second = await client.try_acquire(r, 5000)  # the key is gone: free again
        assert second.fencing_token > first.fencing_token
        await client.release(second)
        await client.aclose()

    asyncio.run(main())


def test_voter_server_counts_garbage_and_keeps_serving() -> None:
    async def main() -> None:
        q = LocalQuorum(3)
        url = await q.start()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, remote_addr=("127.0.0.1", int(url.rsplit(":", 1)[1]))
        )
        for junk in (b"", b"\xc1", b"\x93\xa4prep\x01", b"\x95" + b"\xff" * 40, b"x" * 9000):
            transport.sendto(junk)
        transport.close()
        client = LeaseClient(open_backend(url), "a")
        lease = await client.try_acquire("r", 1000)  # still serving
        await client.release(lease)
        last = q.servers[-1]
        assert last.counters["malformed"] >= 4, last.counters
        await client.aclose()
        q.close()

    asyncio.run(main())
