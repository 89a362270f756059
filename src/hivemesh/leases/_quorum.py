"""``quorum://`` leases: the sans-IO protocol of :mod:`hivemesh.core.lease_quorum` over UDP.

Theory of operation
-------------------
This module is only a pump (aioquic's ``asyncio/protocol.py`` shape): a
:class:`VoterServer` feeds each datagram to a :class:`~hivemesh.core.lease_quorum.Voter`
and sends the reply back; a :class:`QuorumLeaseBackend` owns one
:class:`~hivemesh.core.lease_quorum.Proposer`, flushes its outbox, resolves
one future per operation from its events, and re-arms a single timer at its
``next_deadline()``. Messages are msgpack lists through :mod:`hivemesh.core.codec`
(size-limited; garbage is counted and dropped). Loss, duplication and
reordering are the protocol's business (retransmission, idempotent voters).

URL: ``quorum://127.0.0.1:7001,127.0.0.1:7002,...?timeout_ms=1000&retransmit_ms=20``
-- every voter's address, the same list on every client (voter ids are the
``host:port`` strings). IP literals only.

This standalone deployment has *no authentication*: run it on loopback or a
trusted network. A hivemesh node wires the same core to its identity-bound
transport instead. A voter started with ``state_path`` persists its durable
state (fsync + rename) before replying to any write that changed it, so
fencing tokens survive restarts; without it, a restarted voter forgets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import secrets
import socket
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hivemesh.core import codec
from hivemesh.core.lease_quorum import Acquire, Outcome, Proposer, Release, Renew, Show, Voter
from hivemesh.errors import BackendUnavailable, DecodeError, InvalidArgument
from hivemesh.leases._api import LeaseInfo
from hivemesh.leases.errors import LeaseContended
from hivemesh.stores.private import open_private

__all__ = ["LocalQuorum", "QuorumLeaseBackend", "VoterServer", "parse_voters"]

_MAX_DATAGRAM = 8192


def _now_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


def parse_voters(spec: str, *, allow_port_zero: bool = False) -> list[tuple[str, int]]:
    """``"127.0.0.1:7001,[::1]:7002"`` -> addresses; raises InvalidArgument."""
    out: list[tuple[str, int]] = []
    for part in spec.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
            p = int(port)
        except ValueError as e:
            raise InvalidArgument(f"voter address must be IP:PORT, got {part!r}") from e
        if not sep or not (0 if allow_port_zero else 1) <= p < 65536:
            raise InvalidArgument(f"voter address must be IP:PORT, got {part!r}")
        out.append((host, p))
    if len(set(out)) != len(out) or not out:
        raise InvalidArgument(f"voter list must be non-empty and distinct: {spec!r}")
    return out


def _vid(addr: tuple[str, int]) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any) -> None:
        self._on = on_datagram

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._on(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable etc.
        pass


class VoterServer:
    """One quorum voter listening on UDP.

    ``drop_probability`` (with ``seed``) drops incoming datagrams on purpose,
    for fault-injection tests against real sockets.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        state_path: str | os.PathLike[str] | None = None,
        drop_probability: float = 0.0,
        seed: int | str = 0,
    ) -> None:
        self._bind = (host, port)
        self._state_path = Path(state_path) if state_path is not None else None
        self._drop = drop_probability
        self._rng = random.Random(seed)
        self._transport: asyncio.DatagramTransport | None = None
        self.voter: Voter | None = None
        #: malformed / dropped datagram counts
        self.counters: dict[str, int] = {"malformed": 0, "dropped": 0}

    @property
    def address(self) -> str:
        """``host:port`` once started (the voter id clients use)."""
        if self._transport is None:
            raise InvalidArgument("voter not started")
        host, port = self._transport.get_extra_info("sockname")[:2]
        return _vid((host, port))

    async def start(self) -> str:
        """Bind, restore persisted state if any, and return the address."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self._on_datagram), local_addr=self._bind
        )
        self._transport = transport
        state = None
        if self._state_path is not None and self._state_path.exists():
            state = codec.unpack(self._state_path.read_bytes())
        self.voter = Voter(self.address, state=state, now_ms=_now_ms())
        return self.address

    def _persist(self) -> None:
        assert self._state_path is not None and self.voter is not None
        tmp = self._state_path.with_suffix(".tmp")
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.write(codec.pack(self.voter.snapshot()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._state_path)

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.voter is None or self._transport is None:
            return
        if self._drop and self._rng.random() < self._drop:
            self.counters["dropped"] += 1
            return
        try:
            msg = codec.unpack(data, limit=_MAX_DATAGRAM)
            before = self.voter.counters.get("accept_ok", 0), self.voter.counters.get("renew_ok", 0)
            reply = self.voter.receive(msg, _now_ms())
        except DecodeError:
            self.counters["malformed"] += 1
            return
        if self._state_path is not None and before != (
            self.voter.counters.get("accept_ok", 0),
            self.voter.counters.get("renew_ok", 0),
        ):
            self._persist()
        self._transport.sendto(codec.pack(reply), addr)

    def close(self) -> None:
        """Stop listening."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class QuorumLeaseBackend:
    """A :class:`~hivemesh.leases.LeaseBackend` over quorum voters on UDP."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "quorum":
            raise InvalidArgument(f"not a quorum URL: {url!r}")
        self._addrs = parse_voters(parts.netloc)
        q = parse_qs(parts.query)
        try:
            self._timeout_ms = int(q.get("timeout_ms", ["1000"])[0])
            self._retransmit_ms = int(q.get("retransmit_ms", ["20"])[0])
        except ValueError as e:
            raise InvalidArgument(f"bad quorum URL options in {url!r}") from e
        self._ids = {a: _vid(a) for a in self._addrs}
        self._by_id = {v: a for a, v in self._ids.items()}
        self._proposer = Proposer(
            sorted(self._by_id),
            timeout_ms=self._timeout_ms,
            retransmit_ms=self._retransmit_ms,
            proposer_id=secrets.token_hex(8),
        )
        self._url = f"quorum://{','.join(sorted(self._by_id))}"
        self._transport: asyncio.DatagramTransport | None = None
        self._futures: dict[int, asyncio.Future[Outcome]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        #: malformed replies dropped
        self.malformed = 0

    @property
    def url(self) -> str:
        """``quorum://`` and the sorted voter list."""
        return self._url

    async def _ensure(self) -> None:
        if self._transport is not None:
            return
        async with self._lock:
            if self._transport is None:
                family = socket.AF_INET6 if ":" in self._addrs[0][0] else socket.AF_INET
                transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                    lambda: _Datagrams(self._on_datagram), family=family
                )
                self._transport = transport

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        vid = self._ids.get(addr)
        if vid is None:
            return
        try:
            self._proposer.receive(vid, codec.unpack(data, limit=_MAX_DATAGRAM), _now_ms())
        except DecodeError:
            self.malformed += 1
            return
        self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._proposer.handle_timer(_now_ms())
        self._pump()

    def _pump(self) -> None:
        if self._transport is not None:
            for vid, msg in self._proposer.outbox():
                self._transport.sendto(codec.pack(msg), self._by_id[vid])
        for ev in self._proposer.events():
            fut = self._futures.pop(ev.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(ev)
        deadline = self._proposer.next_deadline()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(deadline / 1000.0, self._on_timer)

    async def _run(self, op: Acquire | Renew | Release | Show, timeout_s: float) -> Outcome:
        what = type(op).__name__.lower()
        rid = None
        try:
            async with asyncio.timeout(timeout_s):
                await self._ensure()
                fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
                # The protocol's deadline is the caller's: it gives up when we do.
                rid = self._proposer.start(op, _now_ms(), timeout_ms=int(timeout_s * 1000))
                self._futures[rid] = fut
                self._pump()
                ev = await fut
        except TimeoutError as e:
            if rid is not None:
                self._futures.pop(rid, None)
                self._proposer.cancel(rid, _now_ms())
                self._pump()
            raise BackendUnavailable(f"quorum {what}: no decision within {timeout_s:.3f}s") from e
        except OSError as e:
            raise BackendUnavailable(f"quorum {what}: {e}") from e
        if ev.status == "unknown":
            raise BackendUnavailable(f"quorum {what}: no majority answered in time")
        return ev

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Two-phase majority acquire; the token or None if held."""
        ev = await self._run(Acquire(resource, holder, ttl_ms), timeout_s)
        if ev.status == "fail" and ev.partial:
            raise LeaseContended(f"{resource!r}: lost a race after reaching some voters")
        return ev.token if ev.status == "ok" else None

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Majority renew."""
        return (await self._run(Renew(resource, holder, token, ttl_ms), timeout_s)).status == "ok"

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Majority release (a partial one counts: some voters did let go)."""
        ev = await self._run(Release(resource, holder, token), timeout_s)
        return ev.status == "ok" or ev.partial

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """Majority read of the current holder."""
        ev = await self._run(Show(resource), timeout_s)
        if not ev.holder or ev.token is None:
            return None
        return LeaseInfo(resource, ev.holder, ev.token, max(0, ev.remaining_ms))

    async def aclose(self) -> None:
        """Close the socket; pending operations fail with BackendUnavailable."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(BackendUnavailable("quorum backend closed"))
        self._futures.clear()


class LocalQuorum:
    """N voters on loopback in this event loop (tests, benchmarks, demos)."""

    def __init__(self, n: int = 5, *, drop_probability: float = 0.0, seed: int | str = 0) -> None:
        if not 1 <= n <= 99:
            raise InvalidArgument("n must be in [1, 99]")
        self.servers = [
            VoterServer("127.0.0.1", 0, drop_probability=drop_probability, seed=f"{seed}/{i}")
            for i in range(n)
        ]

    async def start(self) -> str:
        """Start every voter; return the ``quorum://`` URL."""
        addrs = [await s.start() for s in self.servers]
        return "quorum://" + ",".join(addrs)

    def close(self) -> None:
        """Stop every voter."""
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.close()
