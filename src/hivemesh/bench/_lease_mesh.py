"""The ``mesh`` rows of ``hivemesh bench lease``: the quorum embedded in a real swarm.

Two setups, each against raw redis-py in the same rounds (see
:mod:`hivemesh.bench.lease`), voter state on disk unless asked otherwise:

* :func:`run_procs`: ``--voters`` node processes; the client lives in the
  bench process and talks to one node through its control socket
  (``mesh://``): one row on one resource (the voters sync their log about
  once per 1024 acquires of it) and, on disk, one with a fresh resource
  every round (every acquire waits for a log sync at each voter it reaches).
* :func:`run_node_api`: ``--voters - 1`` node processes plus one
  :class:`~hivemesh.node.Node` inside the bench process, whose
  ``node.leases`` is the client: no control-socket hop.

Details add the CPU time per acquire+release pair: of the node processes
together (over the whole row, so it includes their idle background work
during the baseline's rounds) and of the bench process during our rounds
only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from hivemesh.bench.lease import (
    RAW_REDIS,
    Measured,
    Pair,
    Samples,
    lease_pair,
    vs_raw_redis,
)
from hivemesh.client.swarm import FAST_TIMINGS, OPEN_TRUST, LocalSwarm, wait_until
from hivemesh.commands import LeaseVoters
from hivemesh.leases import LeaseClient, open_backend

__all__ = ["run_node_api", "run_procs"]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _procs_cpu_s(swarm: LocalSwarm) -> float:
    return sum(_cpu_s(n.proc.pid) for n in swarm.nodes.values() if n.proc is not None)


def _wait_formed(swarm: LocalSwarm, extra: set[str]) -> None:
    """Every node process sees every other node (and ``extra``) up."""
    addrs = {node.address for node in swarm.nodes.values()} | extra

    def formed() -> bool:
        for node in swarm.nodes.values():
            members = node.client.status()["members"]
            up = {a for a, m in members.items() if m["state"] == "up"}
            if not up >= addrs - {node.address}:
                return False
        return True

    wait_until(formed, 30, what="the bench swarm forms")


def _start(root: str, n: int) -> LocalSwarm:
    """``n`` ``hivemesh up`` processes on loopback (m0 first, the rest bootstrap from it)."""
    swarm = LocalSwarm(root)
    try:
        first = swarm.start("m0")
        for i in range(1, n):
            swarm.start(f"m{i}", bootstrap=[first.endpoint])
    except BaseException:
        swarm.close()
        raise
    return swarm


class _CpuMeter:
    """Wraps a pair: CPU seconds of this process spent inside it, and rounds."""

    def __init__(self, pair: Pair) -> None:
        self._pair = pair
        self.cpu_s = 0.0
        self.rounds = 0

    async def __call__(self, i: int) -> None:
        t = time.process_time()
        await self._pair(i)
        self.cpu_s += time.process_time() - t
        self.rounds += 1


async def _row(
    args: argparse.Namespace, swarm: LocalSwarm, pair: Pair, name: str, out: Measured
) -> Samples:
    """Run one row, adding its CPU details to ``out``."""
    meter = _CpuMeter(pair)
    before = _procs_cpu_s(swarm)
    samples = await vs_raw_redis(args, meter)
    nodes_ms = (_procs_cpu_s(swarm) - before) * 1000 / max(1, meter.rounds)
    here_ms = meter.cpu_s * 1000 / max(1, meter.rounds)
    out.details[f"{name} cpu ms/pair: node procs, bench proc"] = f"{nodes_ms:.2f}, {here_ms:.2f}"
    return samples


def run_procs(args: argparse.Namespace, where: str | None) -> Measured:
    """Node processes, client through one node's control socket; data under ``where``."""
    out = Measured()
    disk = "data on tmpfs" if where else "data on disk"
    label = f"mesh via control socket ({args.voters} node procs, {disk})"
    with tempfile.TemporaryDirectory(prefix="hm-bench-lease-", dir=where) as root:
        swarm = _start(root, args.voters)
        try:
            _wait_formed(swarm, set())
            first = swarm.nodes["m0"]
            voters = first.client.call("lease.voters")["voters"]
            if len(voters) != args.voters:
                raise TimeoutError(f"voter set has {len(voters)} members, wanted {args.voters}")
            url = f"mesh://{first.data_dir.resolve()}"

            async def rows() -> None:
                client = LeaseClient(open_backend(url), "bench")
                tag = uuid.uuid4().hex[:8]
                try:
                    hot = lease_pair(client, lambda i: f"bench-{tag}", args.ttl_ms)
                    out.rows[(label, RAW_REDIS, "abs")] = await _row(args, swarm, hot, label, out)
                    if where is None:
                        fresh_label = f"{label[:-1]}, fresh resource per round)"
                        fresh = lease_pair(client, lambda i: f"bench-{tag}-{i}", args.ttl_ms)
                        samples = await _row(args, swarm, fresh, fresh_label, out)
                        out.rows[(fresh_label, RAW_REDIS, None)] = samples
                finally:
                    await client.aclose()

            asyncio.run(rows())
        finally:
            swarm.close()
    return out


def _node_settings() -> dict[str, Any]:
    """The swarm's loopback timings (and its open trust: the swarm's node
    processes run open) as Node keyword settings."""
    env = {**FAST_TIMINGS, **OPEN_TRUST}
    return {k.removeprefix("HIVEMESH_").lower(): v for k, v in env.items()}


def run_node_api(args: argparse.Namespace) -> Measured:
    """``--voters - 1`` node processes plus an in-process Node whose leases we time."""
    from hivemesh.node import Node

    out = Measured()
    label = f"mesh via Node API (in-process node + {args.voters - 1} node procs, data on disk)"
    with tempfile.TemporaryDirectory(prefix="hm-bench-lease-") as root:
        swarm = _start(root, args.voters - 1)
        try:

            async def rows() -> None:
                node = Node(
                    Path(root) / "here",
                    bootstrap=[swarm.nodes["m0"].endpoint],
                    **_node_settings(),
                )
                async with asyncio.timeout(60):
                    await node.start()
                try:
                    async with asyncio.timeout(60):
                        await node.wait_peers(args.voters - 1, timeout_s=30)
                        await asyncio.to_thread(_wait_formed, swarm, {node.address})
                    answer = await node.call(LeaseVoters())
                    voters = answer.to_wire()["voters"]
                    if len(voters) != args.voters:
                        raise TimeoutError(f"voter set {voters}: wanted {args.voters} voters")
                    tag = uuid.uuid4().hex[:8]
                    pair = lease_pair(node.leases, lambda i: f"bench-{tag}", args.ttl_ms)
                    out.rows[(label, RAW_REDIS, "abs")] = await _row(args, swarm, pair, label, out)
                finally:
                    await node.close()

            asyncio.run(rows())
        finally:
            swarm.close()
    return out
