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
:mod:`~hivemesh.transports.punch`); this module moves bytes and time.

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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from hivemesh.config import bootstrap_targets, parse_endpoint
from hivemesh.core.identity import short
from hivemesh.errors import ConfigError, HivemeshError

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["MAX_EVENTS", "NodePaths", "path_of"]

log = logging.getLogger("hivemesh.runtime.paths")
#: Path changes kept for ``status``.
MAX_EVENTS = 64


def path_of(channel: Any) -> str:
    """A channel's path in words: ``direct TCP``, ``direct UDP``, ``punched``,
    ``relayed via <relay>``."""
    path = str(getattr(channel, "path", "tcp"))
    if path.startswith("relay:"):
        return f"relayed via {short(path[6:])}"
    return {"tcp": "direct TCP", "udp": "direct UDP"}.get(path, path)


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
        self._tried: dict[str, float] = {}
        self._retry_s = retry_s

    async def start(self, host: str, port: int) -> None:
        """Listen on UDP ``host:port``, start the relay role and the relay clients."""
        from hivemesh.transports.quic import QuicEndpoint
        from hivemesh.transports.relay import RelayService
        from hivemesh.transports.traversal import Traversal

        logging.getLogger("quic").setLevel(logging.WARNING)  # aioquic's per-connection INFO
        d, cfg = self.d, self.d.config
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

    def learn_udp(self, address: str, endpoint: str) -> None:
        """``address`` announced a QUIC endpoint ``host:port`` (``udp:`` record)."""
        try:
            self._udp.setdefault(address, set()).add(parse_endpoint(endpoint))
        except ConfigError:
            self.d.counters["bad_endpoint"] += 1

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
        return link is not None and not str(getattr(link.channel, "path", "")).startswith("relay")

    async def _loop(self) -> None:
        while True:
            self.d.supervisor.beat("paths")
            self._watch_paths()
            await self._reach_unlinked()
            self.traversal.tick()
            await asyncio.sleep(1.0)

    def _watch_paths(self) -> None:
        links = self.d.conns.links
        for peer in sorted(set(links) | set(self._paths)):
            link = links.get(peer)
            now = path_of(link.channel) if link is not None else "none"
            before = self._paths.get(peer)
            if now == before:
                continue
            if link is None:
                self._paths.pop(peer, None)
            else:
                self._paths[peer] = now
            before = before or "none"
            self.d.counters["path_changes"] += 1
            log.info("path to %s: %s -> %s", short(peer), before, now)
            self.events.append({"peer": peer, "from": before, "to": now, "at": time.time()})

    async def _reach_unlinked(self) -> None:
        d = self.d
        known = set(d.endpoints.known()) | set(d.peer.members_snapshot())
        now = time.monotonic()
        for peer in sorted(known):
            if peer == d.address or peer in d.conns.links or not d.authorize(peer):
                continue
            if now - self._tried.get(peer, float("-inf")) < self._retry_s:
                continue
            self._tried[peer] = now
            if await self._dial_udp(peer) or not self.traversal.relays:
                continue
            try:
                await self.traversal.connect_relayed(peer, timeout_s=3.0)
                d.counters["relayed_links"] += 1
            except HivemeshError as exc:
                d.counters["relayed_link_failed"] += 1
                log.debug("no relayed link to %s: %s", short(peer), exc)

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
            "path_events": list(self.events),
        }

    def close(self) -> None:
        """Close the relay clients and the QUIC endpoint."""
        if self.traversal is not None:
            self.traversal.close()
        if self.endpoint is not None:
            self.endpoint.close()
