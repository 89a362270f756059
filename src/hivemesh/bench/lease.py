"""``hivemesh bench lease``: acquire+release latency per backend beside raw clients.

Every row times one acquire+release pair through :class:`LeaseClient` per
round and, in the same round, a baseline: raw redis-py ``SET NX PX`` plus a
Lua compare-and-delete release (the Redis row and, for scale, every quorum
row), raw JetStream KV ``create`` plus ``update`` (the NATS row), a raw etcd
lease grant, put attached to it and revoke through etcd's v3 JSON gateway
(the etcd row: the same HTTP transport as ours, without our checks). Rounds
interleave ours and the baseline, so machine noise hits both alike.

Rows:

* ``redis``, ``nats``, ``etcd``: the backends against their own raw clients (goal for
  Redis: <= 1.2x raw). The raw Redis client has a 5 s ``socket_timeout`` (a
  deadline on every call, as ours has); the details add a third client in
  the same rounds with no deadline at all, the cheapest redis-py can be.
* ``quorum``: ``--voters`` standalone UDP voter processes on loopback (no
  persistence), goal p50 <= 2 ms.
* ``mesh``: the quorum embedded in the swarm, the real form: ``--voters``
  node processes (``hivemesh up``, Noise channels, voter state on disk,
  synced before any vote that changed it is acknowledged), the same goal.
  Three rows (see :mod:`hivemesh.bench._lease_mesh`): a client in another
  process, through one node's control socket (``mesh://``); a client inside
  a node's process (the Node API, no control-socket hop); and the control
  socket again with a *fresh resource every round*, which pays the voters'
  disk sync on every acquire (a resource's voters otherwise sync once per
  1024 acquires: the token reserve of :mod:`hivemesh.core.lease_voter`) and
  a prepare round (the proposer knows no token for it yet).

``--mesh-tmpfs`` adds the control-socket row with the data dirs on /dev/shm
(a sync costs nothing there). Details carry the CPU time per pair of the
mesh rows (every node process, plus the client's process), steadier than
latency on a shared machine. Backends that are not reachable are reported
as skipped, not as failures.
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
from dataclasses import dataclass, field
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.leases import LeaseClient, LocalQuorum, open_backend

DESCRIPTION = "lease acquire+release p50/p99 per backend vs raw redis-py / nats-py"

_RAW_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
RAW_REDIS = "raw redis-py SET NX PX + Lua DEL"

Pair = Callable[[int], Awaitable[None]]
Samples = tuple[list[float], list[float]]
#: a row: label, baseline name, goal ("ratio": <= 1.2x the baseline, "abs": p50 <= 2 ms)
Row = tuple[str, str, str | None]


@dataclass
class Measured:
    """What one setup measured: samples (ours, baseline) per row, and details."""

    rows: dict[Row, Samples] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hivemesh bench lease``."""
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222/hivemesh_bench", help="NATS URL")
    parser.add_argument("--etcd", default="etcd://127.0.0.1:2379/hivemesh_bench", help="etcd URL")
    parser.add_argument("--rounds", type=int, default=2000, help="acquire+release pairs")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="time bound per row")
    parser.add_argument("--ttl-ms", type=int, default=5000)
    parser.add_argument("--voters", type=int, default=5, help="quorum voters on loopback")
    parser.add_argument(
        "--voters-in-process",
        action="store_true",
        help="run the standalone quorum voters in this process (default: one process each)",
    )
    parser.add_argument(
        "--mesh-tmpfs", action="store_true", help="add a mesh row with the data on /dev/shm"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated rows to run: redis,nats,etcd,quorum,mesh"
    )


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank; NaN if empty)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def interleaved(pairs: list[Pair], rounds: int, max_s: float) -> list[list[float]]:
    """Warm every pair up, then time ``rounds`` rounds of each, rotating which goes first."""
    for i in range(min(50, rounds)):  # warm-up: connections, script caches
        for fn in pairs:
            await fn(-i - 1)
    out: list[list[float]] = [[] for _ in pairs]
    n = len(pairs)
    stop = time.perf_counter() + max_s
    for i in range(rounds):
        for k in range(n):
            j = (i + k) % n
            t = time.perf_counter()
            await pairs[j](i)
            out[j].append((time.perf_counter() - t) * 1000.0)
        if time.perf_counter() > stop:
            break
    return out


def lease_pair(client: LeaseClient, resource: Callable[[int], str], ttl_ms: int) -> Pair:
    """One round of ours: try_acquire then release through ``client``."""

    async def pair(i: int) -> None:
        lease = await client.try_acquire(resource(i), ttl_ms)
        await client.release(lease)

    return pair


def raw_redis_pair(raw: Any, ttl_ms: int) -> Pair:
    """One round of the baseline: SET NX PX, then the Lua compare-and-delete."""
    release = raw.register_script(_RAW_RELEASE)
    key = f"rawbench:{uuid.uuid4().hex[:8]}"

    async def base(i: int) -> None:
        val = f"{i}:bench"
        if not await raw.set(key, val, nx=True, px=ttl_ms):
            raise RuntimeError("raw SET NX failed")
        await release(keys=[key], args=[val])

    return base


async def vs_raw_redis(args: argparse.Namespace, ours: Pair) -> Samples:
    """``ours`` interleaved with raw redis-py (``socket_timeout`` 5 s: a deadline on
    every call, as ours has) SET NX PX + Lua release on one key."""
    import redis.asyncio as aioredis

    raw = aioredis.Redis.from_url(args.redis, socket_timeout=5.0)
    try:
        a, b = await interleaved(
            [ours, raw_redis_pair(raw, args.ttl_ms)], args.rounds, args.max_seconds
        )
        return a, b
    finally:
        await raw.aclose()


async def _redis(args: argparse.Namespace) -> Measured:
    """Ours vs raw redis-py; a second raw client without any deadline in the details."""
    import redis.asyncio as aioredis

    client = LeaseClient(open_backend(args.redis), "bench")
    raw = aioredis.Redis.from_url(args.redis, socket_timeout=5.0)
    bare = aioredis.Redis.from_url(args.redis)
    tag = uuid.uuid4().hex[:8]
    pairs = [
        lease_pair(client, lambda i: f"bench-{tag}", args.ttl_ms),
        raw_redis_pair(raw, args.ttl_ms),
        raw_redis_pair(bare, args.ttl_ms),
    ]
    try:
        ours, base, nodeadline = await interleaved(pairs, args.rounds, args.max_seconds)
    finally:
        await client.aclose()
        await raw.aclose()
        await bare.aclose()
    p50 = pct(ours, 0.5)
    return Measured(
        {("redis", RAW_REDIS, "ratio"): (ours, base)},
        {
            "redis: raw redis-py without socket_timeout (no deadline) p50 ms, ours/that": (
                f"{pct(nodeadline, 0.5):.3f}, {p50 / pct(nodeadline, 0.5):.2f}x"
            )
        },
    )


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


async def _quorum(args: argparse.Namespace) -> Samples:
    """Quorum of ``--voters`` UDP voters on loopback vs raw redis-py in the same loop."""
    cluster = LocalQuorum(args.voters)
    procs: list[subprocess.Popen[str]] = []
    if args.voters_in_process:
        url = await cluster.start()
    else:
        url, procs = _spawn_voters(args.voters)
    client = LeaseClient(open_backend(url), "bench")
    tag = uuid.uuid4().hex[:8]
    try:
        return await vs_raw_redis(args, lease_pair(client, lambda i: f"bench-{tag}", args.ttl_ms))
    finally:
        await client.aclose()
        cluster.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=5)


async def _nats(args: argparse.Namespace) -> Samples:
    import nats

    client = LeaseClient(open_backend(args.nats), "bench")
    tag = uuid.uuid4().hex[:8]
    await client.show(f"bench-{tag}")  # connect, create the bucket
    nc = await nats.connect(args.nats.rsplit("/", 1)[0], connect_timeout=2)
    kv = await nc.jetstream().key_value(args.nats.rsplit("/", 1)[1].split("?")[0])
    rev = 0

    async def base(i: int) -> None:
        nonlocal rev
        key = f"rawbench-{tag}"
        rev = await (kv.create(key, b"held") if rev == 0 else kv.update(key, b"held", last=rev))
        rev = await kv.update(key, b"", last=rev)

    return await beside_raw(args, client, tag, base, nc.close)


async def beside_raw(
    args: argparse.Namespace,
    client: LeaseClient,
    tag: str,
    base: Pair,
    close_raw: Callable[[], Awaitable[None]],
) -> Samples:
    """``client``'s acquire+release on one resource interleaved with ``base``; closes both."""
    ours = lease_pair(client, lambda i: f"bench-{tag}", args.ttl_ms)
    try:
        a, b = await interleaved([ours, base], args.rounds, args.max_seconds)
        return a, b
    finally:
        await client.aclose()
        await close_raw()


RAW_ETCD = "raw etcd gateway grant+put+revoke"


async def _etcd(args: argparse.Namespace) -> Samples:
    """Ours (grant + CAS put, CAS delete + revoke) vs raw grant + put + revoke."""
    import base64
    from urllib.parse import urlsplit

    import httpx

    client = LeaseClient(open_backend(args.etcd), "bench")
    tag = uuid.uuid4().hex[:8]
    parts = urlsplit(args.etcd)
    raw = httpx.AsyncClient(
        base_url=f"http://{parts.hostname}:{parts.port or 2379}", timeout=httpx.Timeout(5.0)
    )
    key = base64.b64encode(f"rawbench/{tag}".encode()).decode()
    ttl_s = str(max(1, args.ttl_ms // 1000))

    async def base(i: int) -> None:
        r = await raw.post("/v3/lease/grant", json={"TTL": ttl_s})
        lease = r.json()["ID"]
        await raw.post("/v3/kv/put", json={"key": key, "value": "aGVsZA==", "lease": lease})
        await raw.post("/v3/lease/revoke", json={"ID": lease})

    return await beside_raw(args, client, tag, base, raw.aclose)


def _metrics(
    label: str, ours: list[float], base: list[float], base_name: str, goal: str | None
) -> list[Metric]:
    """p50 and p99 rows; ``goal`` "ratio" (<= 1.2x base) or "abs" (p50 <= 2 ms)."""
    out = []
    for q, qn in ((0.5, "p50"), (0.99, "p99")):
        o, b = pct(ours, q), pct(base, q)
        m = Metric(f"{label} acquire+release {qn}", o, b, "ms", base_name, higher_is_better=False)
        if goal == "ratio" and qn == "p50":
            m.goal, m.goal_met = f"<= 1.2x {base_name}", o <= 1.2 * b
        elif goal == "abs" and qn == "p50":
            m.goal, m.goal_met = "p50 <= 2 ms", o <= 2.0
        out.append(m)
    return out


def _runs(args: argparse.Namespace) -> list[tuple[str, Callable[[], Measured]]]:
    from hivemesh.bench import _lease_mesh

    def one(
        label: str, fn: Callable[[argparse.Namespace], Any], base: str, goal: str | None
    ) -> Callable[[], Measured]:
        return lambda: Measured({(label, base, goal): asyncio.run(fn(args))})

    where = "in-proc" if args.voters_in_process else "procs"
    runs: list[tuple[str, Callable[[], Measured]]] = [
        ("redis", lambda: asyncio.run(_redis(args))),
        ("nats", one("nats", _nats, "raw nats-py KV create/update", None)),
        ("etcd", one("etcd", _etcd, RAW_ETCD, None)),
        ("quorum", one(f"quorum({args.voters} {where})", _quorum, RAW_REDIS, "abs")),
        ("mesh", lambda: _lease_mesh.run_procs(args, None)),
        ("mesh node-api", lambda: _lease_mesh.run_node_api(args)),
    ]
    if args.mesh_tmpfs and os.path.isdir("/dev/shm"):
        runs.append(("mesh tmpfs", lambda: _lease_mesh.run_procs(args, "/dev/shm")))
    return runs


def run(args: argparse.Namespace) -> BenchResult:
    """Run every reachable backend and return the compared figures."""
    result = BenchResult("lease")
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    for name, fn in _runs(args):
        if only and name.split()[0] not in only:
            continue
        try:
            got = fn()
        except Exception as e:  # unreachable servers, client errors: report, do not crash
            result.details[f"{name} skipped"] = f"{type(e).__name__}: {e}"
            continue
        for (label, base_name, goal), (ours, base) in got.rows.items():
            result.metrics.extend(_metrics(label, ours, base, base_name, goal))
            result.details[f"{label} rounds"] = len(ours)
            result.details[f"{label} mean ms ours/base"] = (
                f"{statistics.fmean(ours):.3f}/{statistics.fmean(base):.3f}"
            )
        result.details.update(got.details)
    result.details["load average (1 min) at end"] = round(os.getloadavg()[0], 2)
    return result
