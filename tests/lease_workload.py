"""Concurrent randomized lease workloads that record histories for the checker.

Real parts: the clients talk to the real backend server, optionally through a
:class:`ChaosProxy` (a loopback TCP forwarder) that kills every connection at
random moments, so operations end with an *unknown* outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemesh.errors import BackendUnavailable
from hivemesh.leases import FencingGuard, Lease, LeaseBackend, LeaseClient
from hivemesh.leases.errors import LeaseContended, LeaseLost, LeaseUnavailable, StaleFencingToken
from hivemesh.verify import Op


class ChaosProxy:
    """A loopback TCP forwarder whose connections can be killed or stalled."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.stalled = False
        self.kills = 0

    async def start(self) -> int:
        """Listen on 127.0.0.1 and return the port."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self._target)
        except OSError:
            cw.transport.abort()
            return
        self._pairs.append((cw, sw))
        for r, w in ((cr, sw), (sr, cw)):
            t = asyncio.create_task(self._pump(r, w))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await r.read(65536):
                while self.stalled:
                    await asyncio.sleep(0.01)
                w.write(data)
                await w.drain()
        w.transport.abort()

    def kill_all(self) -> None:
        """Abort every proxied connection (both sides) right now."""
        for cw, sw in self._pairs:
            cw.transport.abort()
            sw.transport.abort()
        self._pairs.clear()
        self.kills += 1

    async def close(self) -> None:
        """Stop listening and drop everything."""
        self.kill_all()
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Recorder:
    """Runs lease operations through a LeaseClient and records them as Ops."""

    t0: float = field(default_factory=time.monotonic)
    ops: list[Op] = field(default_factory=list)

    def now_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1000.0

    def _belief(self, lease: Lease) -> float:
        return (lease.expires - self.t0) * 1000.0

    async def try_acquire(self, c: LeaseClient, resource: str, ttl_ms: int) -> Lease | None:
        t0 = self.now_ms()
        try:
            lease = await c.try_acquire(resource, ttl_ms)
        except LeaseContended:  # not granted, but may linger on some voters: maybe applied
            self.ops.append(
                Op(c.holder, "acquire", resource, t0, self.now_ms(), "unknown", None, ttl_ms)
            )
            return None
        except LeaseUnavailable:
            self.ops.append(
                Op(c.holder, "acquire", resource, t0, self.now_ms(), "fail", None, ttl_ms)
            )
            return None
        except BackendUnavailable:
            self.ops.append(
                Op(c.holder, "acquire", resource, t0, self.now_ms(), "unknown", None, ttl_ms)
            )
            return None
        self.ops.append(
            Op(
                c.holder, "acquire", resource, t0, self.now_ms(), "ok",
                lease.fencing_token, ttl_ms, self._belief(lease),
            )
        )  # fmt: skip
        return lease

    async def renew(self, c: LeaseClient, lease: Lease) -> Lease | None:
        t0 = self.now_ms()
        args = (c.holder, "renew", lease.resource, t0)
        try:
            new = await c.renew(lease)
        except LeaseLost:
            self.ops.append(Op(*args, self.now_ms(), "fail", lease.fencing_token, lease.ttl_ms))
            return None
        except BackendUnavailable:
            self.ops.append(Op(*args, self.now_ms(), "unknown", lease.fencing_token, lease.ttl_ms))
            return None
        self.ops.append(
            Op(*args, self.now_ms(), "ok", lease.fencing_token, lease.ttl_ms, self._belief(new))
        )
        return new

    async def release(self, c: LeaseClient, lease: Lease) -> bool:
        t0 = self.now_ms()
        args = (c.holder, "release", lease.resource, t0)
        try:
            await c.release(lease)
        except LeaseLost:
            self.ops.append(Op(*args, self.now_ms(), "fail", lease.fencing_token))
            return False
        except BackendUnavailable:
            self.ops.append(Op(*args, self.now_ms(), "unknown", lease.fencing_token))
            return False
        self.ops.append(Op(*args, self.now_ms(), "ok", lease.fencing_token))
        return True


@dataclass
class WorkloadResult:
    """The recorded history plus counts the test asserts on."""

    ops: list[Op]
    stale_tokens: int
    effects: int
    kills: int


async def run_workload(
    make_backend: Callable[[], LeaseBackend],
    *,
    seed: int,
    clients: int = 4,
    resources: int = 2,
    ops_per_client: int = 120,
    duration_s: float = 3.0,
    proxy: ChaosProxy | None = None,
    kill_every_s: tuple[float, float] = (0.05, 0.2),
) -> WorkloadResult:
    """Run ``clients`` concurrent random clients; bounded by op count and time."""
    rec = Recorder()
    guard = FencingGuard()
    names = [f"res-{seed}-{i}" for i in range(resources)]
    deadline = time.monotonic() + duration_s
    effects = 0

    async def one(i: int) -> None:
        nonlocal effects
        rng = random.Random(f"{seed}/{i}")
        client = LeaseClient(make_backend(), f"c{i}", call_timeout_s=0.5)
        try:
            n = 0
            while n < ops_per_client and time.monotonic() < deadline:
                resource = rng.choice(names)
                ttl = rng.choice((100, 200, 300))
                lease = await rec.try_acquire(client, resource, ttl)
                n += 1
                if lease is None:
                    await asyncio.sleep(rng.uniform(0, 0.02))
                    continue
                for _ in range(rng.randint(0, 3)):
                    if lease is None:
                        break
                    await asyncio.sleep(rng.uniform(0, ttl / 2500))
                    if lease.valid():
                        guard.check(lease.fencing_token, resource)
                        effects += 1
                    lease = await rec.renew(client, lease)
                    n += 1
                if lease is not None and rng.random() < 0.8:
                    await rec.release(client, lease)
                    n += 1
        finally:
            await client.aclose()

    async def killer() -> None:
        rng = random.Random(f"{seed}/kill")
        assert proxy is not None
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(*kill_every_s))
            proxy.kill_all()

    stale = 0
    kt = asyncio.create_task(killer()) if proxy is not None else None
    try:
        results = await asyncio.gather(*(one(i) for i in range(clients)), return_exceptions=True)
    finally:
        if kt is not None:
            kt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await kt
    for r in results:
        if isinstance(r, StaleFencingToken):
            stale += 1
        elif isinstance(r, BaseException):
            raise r
    return WorkloadResult(rec.ops, stale + guard.rejected, effects, proxy.kills if proxy else 0)
