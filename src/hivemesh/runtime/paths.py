"""The daemon's UDP paths: QUIC beside TCP, relays, hole punching (wiring only).

With ``udp``, ``relays`` or ``relay_role`` set, the daemon starts
:class:`NodePaths` after its TCP listener: a QUIC endpoint on the same port
number over UDP, a :class:`~hivemesh.transports.relay.RelayService` when it
accepts the relay role, and a :class:`~hivemesh.transports.traversal.Traversal`
that keeps a reservation at every configured relay. Every channel these
make goes to the connection manager (``adopt_inbound`` / ``adopt_outbound``),
whose tie-break prefers a direct channel to a relayed one
(:func:`hivemesh.core.links.channel_rank`), so a punched channel replaces
a relayed link in place. The decisions live in the transports' sans-IO
parts (:mod:`~hivemesh.transports.relay_policy`,
:mod:`~hivemesh.transports.punch`) and, for which peers to try over which
path and when a link changed path, in :mod:`hivemesh.core.dialer`
(:class:`~hivemesh.core.dialer.Fallback`, :func:`~hivemesh.core.dialer.path_changes`);
this module moves bytes and time.

With ``udp`` the node announces ``udp:host:port`` beside its TCP endpoint
(the TCP dialler skips such records; :meth:`NodePaths.learn_udp` takes
them). One supervised loop, once a second: a trusted peer we know of (a
member or an endpoint record) but hold no link to (its TCP endpoints do not
answer) is dialled over QUIC at its ``udp:`` endpoints, else tried through
the relays (at most every ``retry_s``): TCP first, then direct UDP, then a
relay, and a relayed link keeps trying to punch; relayed links are offered an upgrade (punch);
every link's path is compared with the last seen (a new link is a change
from ``none``), and a change is logged,
counted (``path_changes``) and kept in :attr:`NodePaths.events` (the last
:data:`MAX_EVENTS`, shown by ``status``).

With ``stun`` servers configured, a second supervised loop asks each one
that :class:`~hivemesh.core.dialer.StunSchedule` says is due, from the QUIC
socket (:meth:`QuicEndpoint.send_datagram`; answers come back through
:attr:`QuicEndpoint.on_other_datagram` and are matched by
:class:`~hivemesh.transports.stun.Transactions`), for our mapped address: a
:class:`~hivemesh.transports.stun.BindingTransaction` with a fresh random
transaction id, after a name lookup bounded by :data:`STUN_RESOLVE_S`. An
answer is one report to the traversal's
:class:`~hivemesh.transports.punch.ObservedAddresses` under the reporter
``stun:host:port``, like a relay's OBSERVED: one server is one vote
(docs/nat.md). Bad datagrams are counted by their error code
(``stun_malformed``, ``stun_mismatch``), timeouts as ``stun_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from hivemesh.config import bootstrap_targets, parse_endpoint
from hivemesh.core.dialer import Fallback, StunSchedule, path_changes
from hivemesh.core.identity import short
from hivemesh.core.links import path_words
from hivemesh.errors import HivemeshError, StunMalformed, StunMismatch
from hivemesh.runtime.clock import now_ms
from hivemesh.transports.stun import BindingTransaction, Transactions, is_stun

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "MAX_EVENTS",
    "STUN_RESOLVE_S",
    "NodePaths",
]

log = logging.getLogger("hivemesh.runtime.paths")
#: Path changes kept for ``status``.
MAX_EVENTS = 64
#: The deadline of a STUN server's name lookup (s).
STUN_RESOLVE_S = 2.0


class NodePaths:
    """A daemon's QUIC endpoint, relay role and relay clients (see module docs)."""

    def __init__(self, d: Daemon, *, retry_s: float = 5.0) -> None:
        self.d = d
        self.endpoint: Any = None
        self.service: Any = None
        self.traversal: Any = None
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._paths: dict[str, str] = {}
        self._udp: dict[str, set[tuple[str, int]]] = {}  # peer -> its QUIC endpoints
        #: which unlinked peers to try over UDP and relays (the rule is the core's)
        self._fallback = Fallback(d.address, int(retry_s * 1000))
        #: Per ``stun`` server: its last answer (``mapped``) or failure (``error``).
        self.stun: dict[str, dict[str, Any]] = {}
        self._stun_txs = Transactions()
        self._stun_answered = asyncio.Event()  # servers are asked one at a time
        self._family = socket.AF_INET

    async def start(self, host: str, port: int) -> None:
        """Listen on UDP ``host:port``, start the relay role and the relay clients."""
        from hivemesh.transports.quic import QuicEndpoint
        from hivemesh.transports.relay import RelayService
        from hivemesh.transports.traversal import Traversal

        logging.getLogger("quic").setLevel(logging.WARNING)  # aioquic's per-connection INFO
        d, cfg = self.d, self.d.config
        self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if cfg.relay_role:
            self.service = RelayService()
        self.endpoint = await QuicEndpoint.open(
            host,
            port,
            d.identity,
            authorize=d.invites.admit_channel,
            on_channel=lambda ch: self.traversal.inbound(ch),
            on_relay_channel=self.service.handle if self.service is not None else None,
            boot_id=d.conns.boot_id,
        )
        self.traversal = Traversal(
            self.endpoint,
            d.identity,
            authorize=d.invites.admit_channel,
            on_inbound=d.conns.adopt_inbound,
            on_outbound=d.conns.adopt_outbound,
            has_direct=self.has_direct,
            boot_id=d.conns.boot_id,
        )
        for address, rhost, rport in bootstrap_targets(cfg.relays):
            if address is None:
                log.warning(
                    "relay %s:%d names no address (ADDRESS@host:port): skipped", rhost, rport
                )
                continue
            try:
                await self.traversal.add_relay(address, rhost, rport)
            except (HivemeshError, OSError) as exc:
                d.counters["relay_unreachable"] += 1
                log.warning("relay %s at %s:%d: %s", short(address), rhost, rport, exc)
        d.supervisor.spawn("paths", self._loop)
        if cfg.stun:
            self.endpoint.on_other_datagram = self._on_datagram
            d.supervisor.spawn("stun", self._stun_loop)

    def learn_udp(self, address: str, endpoint: tuple[str, int]) -> None:
        """``address`` announced a QUIC endpoint (a ``udp:`` record,
        :func:`hivemesh.core.dialer.routes`)."""
        self._udp.setdefault(address, set()).add(endpoint)

    async def _dial_udp(self, peer: str) -> bool:
        """A direct QUIC channel to one of ``peer``'s announced endpoints."""
        for host, port in sorted(self._udp.get(peer, ())):
            try:
                channel = await self.endpoint.dial(host, port, expect_address=peer, timeout_s=1.5)
            except (HivemeshError, OSError) as exc:
                log.debug("QUIC dial of %s at %s:%d: %s", short(peer), host, port, exc)
                continue
            await self.d.conns.adopt_outbound(channel)
            self.d.counters["udp_links"] += 1
            return True
        return False

    @property
    def port(self) -> int:
        """The bound UDP port."""
        return int(self.endpoint.port)

    def has_direct(self, peer: str) -> bool:
        """Whether ``peer``'s link runs directly (not through a relay)."""
        link = self.d.conns.links.get(peer)
        return link is not None and not link.channel.path.startswith("relay")

    async def _loop(self) -> None:
        while True:
            self.d.supervisor.beat("paths")
            self._watch_paths()
            await self._reach_unlinked()
            self.traversal.tick()
            await asyncio.sleep(1.0)

    def _watch_paths(self) -> None:
        links = self.d.conns.links
        now = {peer: path_words(link.channel.path) for peer, link in links.items()}
        for peer, before, after in path_changes(self._paths, now):
            self.d.counters["path_changes"] += 1
            log.info("path to %s: %s -> %s", short(peer), before, after)
            self.events.append({"peer": peer, "from": before, "to": after, "at": time.time()})
        self._paths = now

    async def _reach_unlinked(self) -> None:
        d = self.d
        known = set(d.endpoints.known()) | set(d.peer.members_snapshot())
        for peer in self._fallback.due(known, d.conns.links, d.authorize, now_ms()):
            if await self._dial_udp(peer) or not self.traversal.relays:
                continue
            try:
                await self.traversal.connect_relayed(peer, timeout_s=3.0)
                d.counters["relayed_links"] += 1
            except HivemeshError as exc:
                d.counters["relayed_link_failed"] += 1
                log.debug("no relayed link to %s: %s", short(peer), exc)

    async def _stun_loop(self) -> None:
        schedule = StunSchedule(self.d.config.stun)
        while True:
            self.d.supervisor.beat("stun")
            for server in schedule.due(now_ms()):
                schedule.asked(server, await self._ask_stun(server), now_ms())
            await asyncio.sleep(max(0, (schedule.next_deadline() or 0) - now_ms()) / 1000)

    async def _ask_stun(self, server: str) -> bool:
        """One Binding transaction with ``server``; its answer is one observed-address vote."""
        d, loop = self.d, asyncio.get_running_loop()
        host, port = parse_endpoint(server)
        family = self._family
        try:
            async with asyncio.timeout(STUN_RESOLVE_S):
                infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM)
        except (OSError, TimeoutError) as exc:
            d.counters["stun_unresolved"] += 1
            self.stun[server] = {"error": f"cannot resolve: {exc}", "at": time.time()}
            return False
        addr = (str(infos[0][4][0]), int(infos[0][4][1]))
        tx = BindingTransaction(secrets.token_bytes(12), loop.time())
        answered = self._stun_answered
        answered.clear()
        self._stun_txs.open(tx, addr)
        try:
            while not tx.done:
                for datagram in tx.datagrams_to_send(loop.time()):
                    self.endpoint.send_datagram(datagram, addr)
                    d.counters["stun_requests_sent"] += 1
                wake = tx.next_deadline()
                if wake is not None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, wake - loop.time())):
                            await answered.wait()
                tx.handle_timer(loop.time())
        finally:
            self._stun_txs.close(tx)
        if tx.mapped is None:
            d.counters["stun_timeout"] += 1
            self.stun[server] = {"error": f"no answer from {addr[0]}:{addr[1]}", "at": time.time()}
            log.warning("STUN server %s did not answer", server)
            return False
        mapped = f"{tx.mapped[0]}:{tx.mapped[1]}"
        if self.stun.get(server, {}).get("mapped") != mapped:
            log.info("STUN server %s sees us as %s", server, mapped)
        self.stun[server] = {"mapped": mapped, "at": time.time()}
        self.traversal.observed.report(f"stun:{server}", tx.mapped, time.monotonic())
        d.counters["stun_ok"] += 1
        return True

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> bool:
        """A non-QUIC datagram on the QUIC socket: a STUN answer is ours."""
        if not is_stun(data):
            return False
        try:
            answered = self._stun_txs.receive(data, addr)
        except (StunMalformed, StunMismatch) as exc:
            self.d.counters[exc.code] += 1
            log.debug("STUN datagram from %s:%d dropped: %s", addr[0], addr[1], exc)
            return True
        if answered is None:
            self.d.counters["stun_late_answer"] += 1  # a retransmission's answer
        else:
            self._stun_answered.set()
        return True

    def statistics(self) -> dict[str, Any]:
        """For ``status``: the UDP port, relay and traversal counters, path events."""
        return {
            "udp_port": self.port,
            "quic": self.endpoint.counters.snapshot(),
            "traversal": self.traversal.counters.snapshot(),
            "relay": None if self.service is None else self.service.counters,
            "relays": {a: c.is_up for a, c in sorted(self.traversal.relays.items())},
            "observed": [
                f"{h}:{p}" for h, p in self.traversal.observed.candidates(time.monotonic())
            ],
            # reporters (relays, STUN servers) see one IP behind several ports
            "symmetric": self.traversal.observed.symmetric(time.monotonic()),
            "stun": {k: dict(v) for k, v in sorted(self.stun.items())},
            "path_events": list(self.events),
        }

    def close(self) -> None:
        """Close the relay clients and the QUIC endpoint."""
        if self.traversal is not None:
            self.traversal.close()
        if self.endpoint is not None:
            self.endpoint.close()
