"""Fencing tokens keep increasing across a crash (SIGKILL) and restart of the server.

Each test runs its own private server process (loopback, a free port, a
temporary data directory) so it can be killed without touching the shared one.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hivemesh.errors import BackendUnavailable
from hivemesh.leases import Lease, LeaseClient, open_backend
from hivemesh.leases.errors import LeaseUnavailable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {port} after {deadline_s}s")


def wait_ready(url: str, port: int, deadline_s: float = 15.0) -> None:
    """Wait until the server answers lease reads, not just accepts TCP (a
    restarted JetStream recovers its streams after its port opens)."""
    wait_port(port, deadline_s)
    end = time.monotonic() + deadline_s
    while True:
        try:
            asyncio.run(_show_then_close(LeaseClient(open_backend(url), "probe")))
            return
        except BackendUnavailable:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def redis_server(port: int, data: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
         "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def nats_server(port: int, data: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


SERVERS: dict[str, tuple[str, Callable[[int, Path], subprocess.Popen[bytes]]]] = {
    "redis": ("redis://127.0.0.1:{port}/0", redis_server),
    "nats": ("nats://127.0.0.1:{port}/restart_test", nats_server),
}


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_tokens_increase_across_server_crash_and_restart(kind: str, tmp_path: Path) -> None:
    template, start = SERVERS[kind]
    if shutil.which(kind + "-server") is None:
        pytest.skip(f"{kind}-server not installed")
    port = free_port()
    url = template.format(port=port)

    async def grab(holder: str, ttl_ms: int) -> int:
        c = LeaseClient(open_backend(url), holder, call_timeout_s=2.0)
        try:
            return (await c.try_acquire("job-1", ttl_ms)).fencing_token
        finally:
            await c.aclose()

    proc = start(port, tmp_path)
    try:
        wait_ready(url, port)
        tokens = [asyncio.run(grab("a", 60_000))]
        with pytest.raises(LeaseUnavailable):
            asyncio.run(grab("b", 60_000))
    finally:
        proc.kill()  # crash: no shutdown, no final flush
        proc.wait(timeout=10)
    with pytest.raises(BackendUnavailable):
        asyncio.run(grab("b", 60_000))  # down: typed error, no hang
    proc = start(port, tmp_path)
    try:
        wait_ready(url, port)
        # the lease survived the crash with the server's state: still held
        with pytest.raises(LeaseUnavailable):
            asyncio.run(grab("b", 60_000))
        c = LeaseClient(open_backend(url), "operator")
        info = asyncio.run(_show_then_close(c))
        assert info == ("a", tokens[0])
    finally:
        proc.kill()
        proc.wait(timeout=10)
    proc = start(port, tmp_path)
    try:
        wait_ready(url, port)
        asyncio.run(_force_release(url, tokens[0]))
        tokens.append(asyncio.run(grab("b", 60_000)))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert tokens[1] > tokens[0]


async def _show_then_close(c: LeaseClient) -> tuple[str, int] | None:
    try:
        info = await c.show("job-1")
        return None if info is None else (info.holder, info.fencing_token)
    finally:
        await c.aclose()


async def _force_release(url: str, token: int) -> None:
    c = LeaseClient(open_backend(url), "a")
    try:
        await c.release(Lease("job-1", "a", token, 60_000, time.monotonic() + 60))
    finally:
        await c.aclose()


def test_redis_scripts_are_loaded_again_after_a_script_flush(tmp_path: Path) -> None:
    """The backend runs its scripts by SHA (EVALSHA); a server that forgot them
    (new, restarted, SCRIPT FLUSH) answers NOSCRIPT, which means the script did
    not run: the backend loads it and runs it once."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    import redis.asyncio as aioredis

    port = free_port()
    proc = redis_server(port, tmp_path)

    async def main() -> None:
        url = f"redis://127.0.0.1:{port}/0"
        admin = aioredis.Redis.from_url(url)
        c = LeaseClient(open_backend(url), "a", call_timeout_s=2.0)
        try:
            lease = await c.try_acquire("r", 60_000)
            await admin.script_flush()
            await c.release(lease)  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
            await admin.script_flush()
            again = await c.try_acquire("r", 60_000)
            assert again.fencing_token == lease.fencing_token + 1
            info = await admin.info("commandstats")
            assert info["cmdstat_script|load"]["calls"] >= 2
        finally:
            await c.aclose()
            await admin.aclose()

    try:
        wait_port(port)
        asyncio.run(main())
    finally:
        proc.kill()
        proc.wait(timeout=10)
