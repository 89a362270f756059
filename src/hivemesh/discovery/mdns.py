"""LAN discovery with multicast DNS (zeroconf), asyncio.

Theory of operation
-------------------
Each node advertises one service instance ``<address>._hivemesh._tcp.local.``
on the interfaces it is configured for, with the node's listening port, the
interface IPs as A records, and a TXT record ``addr=<address>`` (``v=1``).
It also browses for the same service type. Every instance it resolves
(each resolution has a deadline) becomes a :class:`Discovered` record
``(address, endpoints)`` handed to ``on_found``; the runtime joins it through
membership *only if the trust store admits the address* (nodes are private
by default: discovery finds candidates, trust decides). Records whose TXT
address is invalid or does not match the instance name are counted and
ignored.

Only the configured interfaces are used (default loopback only); nothing is
sent elsewhere. Resolutions are bounded (``max_resolving`` in flight,
``max_found`` remembered); beyond that they are counted and dropped.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from zeroconf import IPVersion, ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from hivemesh.core.identity import public_key_of
from hivemesh.errors import ConfigError, DeadlineExceeded, InvalidAddress

__all__ = ["SERVICE_TYPE", "Discovered", "LanDiscovery"]

SERVICE_TYPE = "_hivemesh._tcp.local."


@dataclass(frozen=True, slots=True)
class Discovered:
    """A node found on the LAN: its address and dialable endpoints."""

    address: str
    endpoints: tuple[str, ...]


class LanDiscovery:
    """Advertise this node and find others over mDNS on chosen interfaces."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        interfaces: Sequence[str] = ("127.0.0.1",),
        on_found: Callable[[Discovered], None] | None = None,
        advertise: bool = True,
        service_type: str = SERVICE_TYPE,
        resolve_timeout_ms: int = 3000,
        max_resolving: int = 64,
        max_found: int = 1024,
        spawn: Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None,
    ) -> None:
        public_key_of(address)
        if not 0 < port < 65536:
            raise ConfigError(f"port {port} out of range")
        ips = []
        for ip in interfaces:
            try:
                parsed = ipaddress.IPv4Address(ip)
            except ValueError:
                raise ConfigError(f"mDNS interface must be an IPv4 address: {ip!r}") from None
            if parsed.is_unspecified:
                raise ConfigError("name interfaces explicitly; 0.0.0.0 is not allowed")
            ips.append(str(parsed))
        if not ips:
            raise ConfigError("mDNS needs at least one interface")
        self.address = address
        self.port = port
        self.interfaces = tuple(ips)
        self.service_type = service_type
        self.counters: Counter[str] = Counter()
        self._on_found = on_found
        self._advertise = advertise
        self._resolve_timeout_ms = resolve_timeout_ms
        self._max_resolving = max_resolving
        self._max_found = max_found
        #: starts the resolver tasks (a daemon passes its supervisor's
        #: ``watch``: a resolver that fails is logged and counted)
        self._spawn = spawn or _create_task
        self._found: dict[str, Discovered] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None

    @property
    def instance_name(self) -> str:
        """This node's mDNS service instance name."""
        return f"{self.address}.{self.service_type}"

    async def start(self) -> None:
        """Open the mDNS sockets, advertise (if enabled) and start browsing."""
        if self._zc is not None:
            return
        self._changed = asyncio.Event()
        self._zc = AsyncZeroconf(interfaces=list(self.interfaces), ip_version=IPVersion.V4Only)
        if self._advertise:
            self._info = AsyncServiceInfo(
                self.service_type,
                self.instance_name,
                addresses=[socket.inet_aton(ip) for ip in self.interfaces],
                port=self.port,
                properties={"addr": self.address, "v": "1"},
            )
            await self._zc.async_register_service(self._info)
        self._browser = AsyncServiceBrowser(
            self._zc.zeroconf, self.service_type, handlers=[self._on_change]
        )

    async def close(self) -> None:
        """Withdraw the advertisement and close the sockets."""
        for task in sorted(self._tasks, key=id):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._browser is not None:
            await self._browser.async_cancel()
            self._browser = None
        if self._zc is not None:
            if self._info is not None:
                await self._zc.async_unregister_service(self._info)
                self._info = None
            await self._zc.async_close()
            self._zc = None

    def found(self) -> list[Discovered]:
        """Nodes discovered so far, sorted by address."""
        return [self._found[a] for a in sorted(self._found)]

    async def wait_found(self, address: str, timeout_s: float) -> Discovered:
        """Wait until ``address`` is discovered; raises DeadlineExceeded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while address not in self._found:
            left = deadline - loop.time()
            if left <= 0:
                raise DeadlineExceeded(f"{address[:12]} not discovered in {timeout_s} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                continue
        return self._found[address]

    # -- internals -------------------------------------------------------------------

    def _on_change(self, **kwargs: Any) -> None:
        name = kwargs["name"]
        state = kwargs["state_change"]
        if state is ServiceStateChange.Removed or name == self.instance_name:
            return
        if len(self._tasks) >= self._max_resolving:
            self.counters["mdns_resolve_dropped"] += 1
            return
        task = self._spawn("mdns_resolve", self._resolve(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, name: str) -> None:
        zc = self._zc
        if zc is None:
            return
        info = AsyncServiceInfo(self.service_type, name)
        if not await info.async_request(zc.zeroconf, self._resolve_timeout_ms):
            self.counters["mdns_resolve_timeout"] += 1
            return
        props = info.properties or {}
        raw = props.get(b"addr")
        address = raw.decode("ascii", "replace") if isinstance(raw, bytes) else ""
        try:
            public_key_of(address)
        except InvalidAddress:
            self.counters["mdns_bad_record"] += 1
            return
        if name != f"{address}.{self.service_type}" or not info.port:
            self.counters["mdns_bad_record"] += 1
            return
        if address == self.address:
            return
        endpoints = tuple(
            sorted(
                f"[{ip}]:{info.port}" if ":" in ip else f"{ip}:{info.port}"
                for ip in info.parsed_addresses()
            )
        )
        if not endpoints:
            self.counters["mdns_bad_record"] += 1
            return
        found = Discovered(address, endpoints)
        if self._found.get(address) == found:
            return
        if address not in self._found and len(self._found) >= self._max_found:
            self.counters["mdns_found_dropped"] += 1
            return
        self._found[address] = found
        self.counters["mdns_found"] += 1
        self._changed.set()
        if self._on_found is not None:
            self._on_found(found)


def _create_task(name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro, name=f"hm-{name}")
