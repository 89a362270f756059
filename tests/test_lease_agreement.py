"""Backend agreement: one hypothesis state machine drives every lease backend.

Every step runs the same operation against each backend (real Redis, real
NATS, real etcd, five quorum voters on loopback UDP, and the quorum embedded in a real
swarm of five ``hivemesh up`` processes, each client on a different node's
control socket) and asserts they
all show the same observable behaviour, and the behaviour of a tiny reference
model kept by the machine itself: who holds, acquire fails while held,
release/renew by a non-holder is rejected, tokens increase, expiry frees.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.leases import Lease, LeaseClient, LocalQuorum, open_backend
from hivemesh.leases.errors import LeaseLost, LeaseUnavailable

#: name -> backend URL; None means 5 fresh quorum voters on loopback per example.
URLS: dict[str, str | None] = {
    "redis": "redis://127.0.0.1:6379/0",
    "nats": "nats://127.0.0.1:4222/hivemesh_test_leases?skew_ms=10",
    "etcd": "etcd://127.0.0.1:2379/hivemesh_test_leases?skew_ms=10",
    "quorum": None,
    "mesh": "mesh",  # the module's swarm (see the fixture below)
}
FACTORIES = URLS  # the names every step runs against
CLIENTS = ("alice", "bob", "carol")
RESOURCES = ("r0", "r1")
LONG_TTL_MS = 60_000
SHORT_TTL_MS = 60


#: mesh:// URLs of the module's swarm nodes, one per client (set by the fixture)
MESH_URLS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def mesh_swarm(tmp_path_factory: pytest.TempPathFactory) -> object:
    """One swarm of 5 node processes for every example (resources are per example)."""
    with LocalSwarm(tmp_path_factory.mktemp("agree")) as swarm:
        first = swarm.start("n0")
        for i in range(1, 5):
            swarm.start(f"n{i}", bootstrap=[first.endpoint])
        addrs = {n.address for n in swarm.nodes.values()}
        for n in swarm.nodes.values():
            wait_until(
                lambda n=n: (
                    {a for a, m in n.client.status()["members"].items() if m["state"] == "up"}
                    >= addrs - {n.address}
                ),
                20,
                what="the agreement swarm forms",
            )
        MESH_URLS[:] = [f"mesh://{swarm.nodes[f'n{i}'].data_dir.resolve()}" for i in range(3)]
        yield swarm
        MESH_URLS.clear()


class LeaseAgreement(RuleBasedStateMachine):
    """Same operations, every backend, same answers."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.prefix = uuid.uuid4().hex[:10]
        self.quorum = LocalQuorum(5)
        urls = {
            name: url or self.loop.run_until_complete(self.quorum.start())
            for name, url in URLS.items()
        }
        self.clients = {
            name: {
                c: LeaseClient(open_backend(MESH_URLS[i] if url == "mesh" else url), c)
                for i, c in enumerate(CLIENTS)
            }
            for name, url in urls.items()
        }
        # reference model: resource -> holder; per backend: (client, resource) -> Lease
        self.holder: dict[str, str | None] = dict.fromkeys(RESOURCES)
        self.leases: dict[str, dict[tuple[str, str], Lease]] = {n: {} for n in FACTORIES}
        self.last_token: dict[str, dict[str, int]] = {n: {} for n in FACTORIES}

    def res(self, r: str) -> str:
        return f"agree-{self.prefix}-{r}"

    def each(self, op: Callable[[str, dict[str, LeaseClient]], object]) -> dict[str, object]:
        """Run ``op`` for every backend concurrently; map name -> result or exception."""

        async def one(name: str) -> object:
            try:
                return await op(name, self.clients[name])  # type: ignore[misc]
            except (LeaseLost, LeaseUnavailable) as e:
                return e

        async def all_() -> list[object]:
            async with asyncio.timeout(10):
                return await asyncio.gather(*(one(n) for n in FACTORIES))

        return dict(zip(FACTORIES, self.loop.run_until_complete(all_()), strict=True))

    def grant(self, name: str, c: str, r: str, lease: Lease) -> None:
        last = self.last_token[name].get(r, 0)
        assert lease.fencing_token > last, (name, lease, last)
        self.last_token[name][r] = lease.fencing_token
        self.leases[name][(c, r)] = lease

    @rule(c=st.sampled_from(CLIENTS), r=st.sampled_from(RESOURCES))
    def acquire(self, c: str, r: str) -> None:
        out = self.each(lambda n, cl: cl[c].try_acquire(self.res(r), LONG_TTL_MS))
        for name, result in out.items():
            if self.holder[r] is None:
                assert isinstance(result, Lease), (name, result)
                self.grant(name, c, r, result)
            else:
                assert isinstance(result, LeaseUnavailable), (name, result)
        if self.holder[r] is None:
            self.holder[r] = c

    def _mine_or_forged(self, name: str, c: str, r: str) -> Lease:
        lease = self.leases[name].get((c, r))
        if lease is not None:
            return lease
        token = self.last_token[name].get(r, 1)  # the live token, but not c's
        return Lease(self.res(r), c, token, LONG_TTL_MS, time.monotonic() + 60)

    @rule(c=st.sampled_from(CLIENTS), r=st.sampled_from(RESOURCES))
    def release(self, c: str, r: str) -> None:
        out = self.each(lambda n, cl: cl[c].release(self._mine_or_forged(n, c, r)))
        for name, result in out.items():
            if self.holder[r] == c:
                assert result is None, (name, result)
                del self.leases[name][(c, r)]
            else:
                assert isinstance(result, LeaseLost), (name, result)
        if self.holder[r] == c:
            self.holder[r] = None

    @rule(c=st.sampled_from(CLIENTS), r=st.sampled_from(RESOURCES))
    def renew(self, c: str, r: str) -> None:
        out = self.each(lambda n, cl: cl[c].renew(self._mine_or_forged(n, c, r)))
        for name, result in out.items():
            if self.holder[r] == c:
                assert isinstance(result, Lease), (name, result)
                assert result.fencing_token == self.leases[name][(c, r)].fencing_token
                self.leases[name][(c, r)] = result
            else:
                assert isinstance(result, LeaseLost), (name, result)

    @precondition(lambda self: any(h is None for h in self.holder.values()))
    @rule(c=st.sampled_from(CLIENTS), other=st.sampled_from(CLIENTS), data=st.data())
    def expire_and_take_over(self, c: str, other: str, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from([r for r in RESOURCES if self.holder[r] is None]))
        out = self.each(lambda n, cl: cl[c].try_acquire(self.res(r), SHORT_TTL_MS))
        for name, result in out.items():
            assert isinstance(result, Lease), (name, result)
            self.grant(name, c, r, result)
        self.loop.run_until_complete(asyncio.sleep((SHORT_TTL_MS + 40) / 1000))
        # Expired: the old holder can no longer renew or release; someone else may take it.
        for method in ("renew", "release"):
            out = self.each(lambda n, cl, m=method: getattr(cl[c], m)(self.leases[n][(c, r)]))
            for name, result in out.items():
                assert isinstance(result, LeaseLost), (name, method, result)
        for name in FACTORIES:
            del self.leases[name][(c, r)]
        self.acquire(other, r)

    @invariant()
    def show_agrees(self) -> None:
        for r in RESOURCES:
            out = self.each(lambda n, cl, r=r: cl[CLIENTS[0]].show(self.res(r)))
            for name, info in out.items():
                if self.holder[r] is None:
                    assert info is None, (name, info)
                else:
                    holder = self.holder[r]
                    assert info is not None and info.holder == holder, (name, info)
                    assert info.fencing_token == self.leases[name][(holder, r)].fencing_token

    def teardown(self) -> None:
        async def close() -> None:
            for per in self.clients.values():
                for cl in per.values():
                    await cl.aclose()

        self.loop.run_until_complete(close())
        self.quorum.close()
        self.loop.close()


LeaseAgreement.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLeaseAgreement = LeaseAgreement.TestCase
