"""mDNS discovery over real multicast on loopback (in-process and across processes)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from hivemesh.core.identity import Identity
from hivemesh.discovery.mdns import SERVICE_TYPE, Discovered, LanDiscovery
from hivemesh.errors import ConfigError, DeadlineExceeded

SRC = str(Path(__file__).resolve().parents[1] / "src")


def ident(tag: str) -> Identity:
    return Identity.from_seed(tag.encode().ljust(32, b"."))


async def wait_until(pred, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return bool(pred())


def test_two_nodes_find_each_other() -> None:
    a, b = ident("mdns-a"), ident("mdns-b")

    async def main() -> None:
        seen: list[Discovered] = []
        da = LanDiscovery(a.address, 7101, on_found=seen.append)
        db = LanDiscovery(b.address, 7102)
        await da.start()
        await db.start()
        try:
            got_b = await da.wait_found(b.address, 10)
            got_a = await db.wait_found(a.address, 10)
        finally:
            await da.close()
            await db.close()
        assert got_b == Discovered(b.address, ("127.0.0.1:7102",))
        assert got_a == Discovered(a.address, ("127.0.0.1:7101",))
        assert got_b in seen
        assert a.address not in {d.address for d in da.found()}  # never ourselves

    asyncio.run(main())


def test_discovers_another_process() -> None:
    other = ident("mdns-proc")
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from hivemesh.discovery.mdns import LanDiscovery
        async def main():
            d = LanDiscovery({other.address!r}, 7203, advertise=True)
            await d.start()
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            await d.close()
        asyncio.run(main())
        """
    )
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

        async def main() -> Discovered:
            me = LanDiscovery(ident("mdns-me").address, 7204, advertise=False)
            await me.start()
            try:
                return await me.wait_found(other.address, 15)
            finally:
                await me.close()

        assert asyncio.run(main()) == Discovered(other.address, ("127.0.0.1:7203",))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=15)


def test_bad_records_are_counted_and_ignored() -> None:
    liar = ident("mdns-liar")

    async def main() -> None:
        me = LanDiscovery(ident("mdns-judge").address, 7301, advertise=False)
        zc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        # Instance name claims one address, TXT another: refused.
        info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{liar.address}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton("127.0.0.1")],
            port=7302,
            properties={"addr": ident("mdns-other").address},
        )
        await zc.async_register_service(info)
        await me.start()
        try:
            assert await wait_until(lambda: me.counters["mdns_bad_record"] >= 1, 10)
            assert liar.address not in {d.address for d in me.found()}
            with pytest.raises(DeadlineExceeded):
                await me.wait_found(liar.address, 0.3)
        finally:
            await me.close()
            await zc.async_unregister_service(info)
            await zc.async_close()

    asyncio.run(main())


@pytest.mark.parametrize("interfaces", [(), ("0.0.0.0",), ("eth0",), ("::1",)])
def test_interfaces_must_be_explicit_ipv4(interfaces: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        LanDiscovery(ident("x").address, 7000, interfaces=interfaces)
