"""``hivemesh bench lease``: acquire+release latency per backend beside raw clients.

For each round we time one acquire+release pair through :class:`LeaseClient`
on each backend, and in the same round the baseline: raw redis-py ``SET NX PX``
plus a Lua compare-and-delete release (for Redis), raw JetStream KV
``create`` plus ``update`` (for NATS). The quorum backend runs ``--voters``
UDP voters on loopback, one process each (``hivemesh lease voter``), and is
held to an absolute goal (p50 <= 2 ms), shown beside raw Redis for scale.
"quorum over the mesh" starts ``--voters`` real node processes (``hivemesh
up``, Noise channels, fsynced voter state) and times a ``mesh://`` client on
one node's control socket, against the same goal; once with the data dirs
on disk (each voter fdatasyncs before acknowledging a write) and once on
tmpfs, which isolates the protocol and transport from the disk.
Rounds interleave ours and the baseline, so machine noise hits both alike.
Backends that are not reachable are reported as skipped, not as failures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.errors import BackendUnavailable
from hivemesh.leases import LeaseClient, LocalQuorum, open_backend

DESCRIPTION = "lease acquire+release p50/p99 per backend vs raw redis-py / nats-py"

_RAW_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hivemesh bench lease``."""
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222/hivemesh_bench", help="NATS URL")
    parser.add_argument("--rounds", type=int, default=2000, help="acquire+release pairs")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="time bound per backend")
    parser.add_argument("--ttl-ms", type=int, default=5000)
    parser.add_argument("--voters", type=int, default=5, help="quorum voters on loopback")
    parser.add_argument(
        "--voters-in-process",
        action="store_true",
        help="run the voters in this process (default: one process per voter)",
    )


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


Pair = Callable[[int], Awaitable[None]]


async def _interleaved(
    ours: Pair, base: Pair, rounds: int, max_s: float
) -> tuple[list[float], ...]:
    for i in range(min(50, rounds)):  # warm-up: connections, script caches
        await ours(-i - 1)
        await base(-i - 1)
    a: list[float] = []
    b: list[float] = []
    stop = time.perf_counter() + max_s
    for i in range(rounds):
        for fn, out in ((ours, a), (base, b)) if i % 2 == 0 else ((base, b), (ours, a)):
            t = time.perf_counter()
            await fn(i)
            out.append((time.perf_counter() - t) * 1000.0)
        if time.perf_counter() > stop:
            break
    return a, b


async def _redis(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    import redis.asyncio as aioredis

    client = LeaseClient(open_backend(args.redis), "bench")
    raw = aioredis.Redis.from_url(args.redis, socket_timeout=5.0)
    release = raw.register_script(_RAW_RELEASE)
    tag = uuid.uuid4().hex[:8]

    async def ours(i: int) -> None:
        lease = await client.try_acquire(f"bench-{tag}", args.ttl_ms)
        await client.release(lease)

    async def base(i: int) -> None:
        key, val = f"rawbench:{tag}", f"{i}:bench"
        if not await raw.set(key, val, nx=True, px=args.ttl_ms):
            raise RuntimeError("raw SET NX failed")
        await release(keys=[key], args=[val])

    try:
        return await _interleaved(ours, base, args.rounds, args.max_seconds)  # type: ignore[return-value]
    finally:
        await client.aclose()
        await raw.aclose()


def _spawn_voters(n: int) -> tuple[str, list[subprocess.Popen[str]]]:
    """Start ``n`` ``hivemesh lease voter`` processes on loopback; their URL."""
    procs: list[subprocess.Popen[str]] = []
    addrs: list[str] = []
    try:
        for _ in range(n):
            p = subprocess.Popen(
                [sys.executable, "-m", "hivemesh", "lease", "voter", "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            procs.append(p)
        for p in procs:
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 10.0)
            if not ready:
                raise TimeoutError("a voter process did not start within 10 s")
            addrs.append(json.loads(p.stdout.readline())["voter"])
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return "quorum://" + ",".join(addrs), procs


async def _quorum(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Quorum of ``--voters`` UDP voters on loopback vs raw redis-py in the same loop."""
    import redis.asyncio as aioredis

    cluster = LocalQuorum(args.voters)
    procs: list[subprocess.Popen[str]] = []
    if args.voters_in_process:
        url = await cluster.start()
    else:
        url, procs = _spawn_voters(args.voters)
    client = LeaseClient(open_backend(url), "bench")
    raw = aioredis.Redis.from_url(args.redis, socket_timeout=5.0)
    release = raw.register_script(_RAW_RELEASE)
    tag = uuid.uuid4().hex[:8]

    async def ours(i: int) -> None:
        lease = await client.try_acquire(f"bench-{tag}", args.ttl_ms)
        await client.release(lease)

    async def base(i: int) -> None:
        key, val = f"rawbench:q:{tag}", f"{i}:bench"
        if not await raw.set(key, val, nx=True, px=args.ttl_ms):
            raise RuntimeError("raw SET NX failed")
        await release(keys=[key], args=[val])

    try:
        return await _interleaved(ours, base, args.rounds, args.max_seconds)  # type: ignore[return-value]
    finally:
        await client.aclose()
        await raw.aclose()
        cluster.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=5)


def _start_mesh(root: str, n: int) -> tuple[Any, str]:
    """``n`` ``hivemesh up`` processes on loopback, fully joined; the mesh:// URL of one."""
    from hivemesh.runtime.swarm import LocalSwarm, wait_until

    swarm = LocalSwarm(root)
    try:
        first = swarm.start("m0")
        for i in range(1, n):
            swarm.start(f"m{i}", bootstrap=[first.endpoint])
        addrs = {node.address for node in swarm.nodes.values()}

        def formed() -> bool:
            for node in swarm.nodes.values():
                members = node.client.status()["members"]
                up = {a for a, m in members.items() if m["state"] == "up"}
                if not up >= addrs - {node.address}:
                    return False
            return True

        wait_until(formed, 30, what="the bench swarm forms")
        voters = first.client.call("lease.voters")["voters"]
        if len(voters) != n:
            raise TimeoutError(f"voter set has {len(voters)} members, wanted {n}")
    except BaseException:
        swarm.close()
        raise
    return swarm, f"mesh://{first.data_dir.resolve()}"


async def _mesh(
    args: argparse.Namespace, where: str | None = None
) -> tuple[list[float], list[float]]:
    """Quorum over the mesh: ``--voters`` node processes (data dirs under ``where``),
    a client on one node's control socket, vs raw redis-py in the same loop."""
    import tempfile

    import redis.asyncio as aioredis

    with tempfile.TemporaryDirectory(prefix="hm-bench-lease-", dir=where) as root:
        swarm, url = await asyncio.to_thread(_start_mesh, root, args.voters)
        client = LeaseClient(open_backend(url), "bench")
        raw = aioredis.Redis.from_url(args.redis, socket_timeout=5.0)
        release = raw.register_script(_RAW_RELEASE)
        tag = uuid.uuid4().hex[:8]

        async def ours(i: int) -> None:
            lease = await client.try_acquire(f"bench-{tag}", args.ttl_ms)
            await client.release(lease)

        async def base(i: int) -> None:
            key, val = f"rawbench:m:{tag}", f"{i}:bench"
            if not await raw.set(key, val, nx=True, px=args.ttl_ms):
                raise RuntimeError("raw SET NX failed")
            await release(keys=[key], args=[val])

        try:
            return await _interleaved(ours, base, args.rounds, args.max_seconds)  # type: ignore[return-value]
        finally:
            await client.aclose()
            await raw.aclose()
            await asyncio.to_thread(swarm.close)


async def _mesh_tmpfs(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """:func:`_mesh` with the data dirs on /dev/shm (fdatasync costs nothing there)."""
    return await _mesh(args, "/dev/shm")


async def _nats(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    import nats

    backend = open_backend(args.nats)
    client = LeaseClient(backend, "bench")
    tag = uuid.uuid4().hex[:8]
    await client.show(f"bench-{tag}")  # connect, create the bucket
    nc = await nats.connect(args.nats.rsplit("/", 1)[0], connect_timeout=2)
    kv = await nc.jetstream().key_value(args.nats.rsplit("/", 1)[1].split("?")[0])

    async def ours(i: int) -> None:
        lease = await client.try_acquire(f"bench-{tag}", args.ttl_ms)
        await client.release(lease)

    rev = 0

    async def base(i: int) -> None:
        nonlocal rev
        key = f"rawbench-{tag}"
        rev = await (kv.create(key, b"held") if rev == 0 else kv.update(key, b"held", last=rev))
        rev = await kv.update(key, b"", last=rev)

    try:
        return await _interleaved(ours, base, args.rounds, args.max_seconds)  # type: ignore[return-value]
    finally:
        await client.aclose()
        await nc.close()


def _metrics(
    label: str, ours: list[float], base: list[float], base_name: str, goal: float | None
) -> list[Metric]:
    out = []
    for q, qn in ((0.5, "p50"), (0.99, "p99")):
        o, b = _pct(ours, q), _pct(base, q)
        m = Metric(f"{label} acquire+release {qn}", o, b, "ms", base_name, higher_is_better=False)
        if goal is not None and qn == "p50":
            m.goal = f"<= {goal}x {base_name}"
            m.goal_met = o <= goal * b
        out.append(m)
    return out


def run(args: argparse.Namespace) -> BenchResult:
    """Run every reachable backend and return the compared figures."""
    result = BenchResult("lease")
    runs: list[tuple[str, Callable[[argparse.Namespace], Any], str, float | None]] = [
        ("redis", _redis, "raw redis-py SET NX PX + Lua DEL", 1.2),
        ("nats", _nats, "raw nats-py KV create/update", None),
        ("quorum", _quorum, "raw redis-py SET NX PX + Lua DEL", None),
        ("mesh", _mesh, "raw redis-py SET NX PX + Lua DEL", None),
    ]
    if os.path.isdir("/dev/shm"):  # the same with fsync made free: protocol + transport only
        runs.append(("mesh-tmpfs", _mesh_tmpfs, "raw redis-py SET NX PX + Lua DEL", None))
    for label, fn, base_name, goal in runs:
        try:
            ours, base = asyncio.run(fn(args))
        except (BackendUnavailable, OSError, TimeoutError) as e:
            result.details[f"{label} skipped"] = f"{type(e).__name__}: {e}"
            continue
        except Exception as e:  # nats/redis client errors: report, do not crash the CLI
            result.details[f"{label} skipped"] = f"{type(e).__name__}: {e}"
            continue
        metrics = _metrics(label, ours, base, base_name, goal)
        if label == "quorum":  # an absolute goal: 5 voters on loopback, p50 <= 2 ms
            where = "in-proc" if args.voters_in_process else "procs"
            metrics[0].name = f"quorum({args.voters} {where}) acquire+release p50"
            metrics[1].name = f"quorum({args.voters} {where}) acquire+release p99"
            metrics[0].goal = "p50 <= 2 ms"
            metrics[0].goal_met = metrics[0].ours <= 2.0
        if label.startswith("mesh"):  # the same goal, quorum over the swarm's Noise channels
            disk = "data on tmpfs" if label == "mesh-tmpfs" else "data on disk, fdatasync"
            what = f"quorum over the mesh ({args.voters} node procs, {disk})"
            metrics[0].name = f"{what} acquire+release p50"
            metrics[1].name = f"{what} acquire+release p99"
            metrics[0].goal = "p50 <= 2 ms"
            metrics[0].goal_met = metrics[0].ours <= 2.0
        result.metrics.extend(metrics)
        result.details[f"{label} rounds"] = len(ours)
        result.details[f"{label} mean ms ours/base"] = (
            f"{statistics.fmean(ours):.3f}/{statistics.fmean(base):.3f}"
        )
    return result
