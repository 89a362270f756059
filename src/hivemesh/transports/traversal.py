"""A node's UDP paths to its peers: direct QUIC, relayed, punched (docs/nat.md).

Theory of operation
-------------------
:class:`Traversal` owns the node's :class:`~hivemesh.transports.quic.QuicEndpoint`
and one :class:`~hivemesh.transports.relay.RelayClient` per relay, and hands
every channel it makes to its owner: ``on_inbound`` for the peer's,
``on_outbound`` for ours (the connection manager prefers a direct channel,
so a punched one replaces a relayed one in place). A relayed channel we
opened is upgraded by punching, and :meth:`Traversal.tick` re-opens a relay
whose channel ended. When to ask, whether to answer and how to punch, and
when to re-open a relay are :class:`~hivemesh.transports.punch.Upgrades`'s
decisions; this class carries them out. Counters (``punch_started``,
``punch_ok``, ``punch_failed``, ...) are in :attr:`Traversal.counters`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from hivemesh.core.identity import Identity
from hivemesh.errors import HivemeshError, PeerUnreachable
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.punch import ObservedAddresses, PunchPlan, PunchSchedule, Upgrades
from hivemesh.transports.quic import QuicEndpoint
from hivemesh.transports.relay import RelayClient
from hivemesh.transports.session import ChannelOptions
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.streams import TaskSet

__all__ = ["Traversal"]

_log = logging.getLogger(__name__)
HostPort = tuple[str, int]
OnChannel = Callable[[SecureChannel], Awaitable[None]]


class Traversal:
    """Direct, relayed and punched UDP paths of one node (see module docs)."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        identity: Identity,
        *,
        authorize: Authorize,
        on_inbound: OnChannel,
        on_outbound: OnChannel,
        has_direct: Callable[[str], bool],
        observed: ObservedAddresses | None = None,
        schedule: PunchSchedule | None = None,
        options: ChannelOptions | None = None,
        boot_id: bytes | None = None,
        punch_wait_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.identity = identity
        self.counters = TransportCounters()
        self.upgrades = Upgrades(identity.address, counters=self.counters)
        if observed is not None:
            self.upgrades.observed = observed
        if schedule is not None:
            self.upgrades.schedule = schedule
        self.observed, self.schedule = self.upgrades.observed, self.upgrades.schedule
        endpoint.punch_sources = self.upgrades.sources  # expected while a punch waits
        self.relays: dict[str, RelayClient] = {}
        self._authorize = authorize
        self._on_inbound = on_inbound
        self._on_outbound = on_outbound
        self._has_direct = has_direct
        self._opts = options
        self._boot_id = boot_id
        self._punch_wait_s = punch_wait_s
        self._clock = clock
        self._tasks = TaskSet(self.counters, "traversal_task")
        self._waiters: dict[str, asyncio.Event] = {}
        self._reserving: dict[str, bool] = {}  # relay -> reserve on it

    async def inbound(self, channel: SecureChannel) -> None:
        """Every inbound channel (QUIC direct or punched, relayed) goes here first."""
        event = self._waiters.get(channel.peer_address)
        if event is not None and channel.path == "punched":
            event.set()
        await self._on_inbound(channel)

    async def add_relay(
        self, relay_address: str, host: str, port: int, *, reserve: bool = True
    ) -> RelayClient:
        """Use the relay at ``host:port``; with ``reserve``, be reachable through it.

        The relay is kept even if this first attempt raises (the relay is down
        or cut off at our start): :meth:`tick` tries it again, as it does for
        a relay whose channel ended."""
        client = RelayClient(
            self.endpoint,
            self.identity,
            relay_address,
            (host, port),
            authorize=self._authorize,
            on_channel=self.inbound,
            on_punch=self._on_punch,
            on_observed=self._on_observed,
            options=self._opts,
            counters=self.counters,
            boot_id=self._boot_id,
        )
        self.relays[relay_address] = client
        self._reserving[relay_address] = reserve
        self.upgrades.relay_added(relay_address, self._clock())
        await client.start(reserve=reserve)
        return client

    def _on_observed(self, reporter: str, observed: HostPort) -> None:
        self.observed.report(reporter, observed, self._clock())
        self.counters.incr("observed_reports")

    async def connect_relayed(self, peer: str, *, timeout_s: float = 5.0) -> SecureChannel:
        """A relayed channel to ``peer`` through the first relay that has it."""
        errors = []
        for relay_address, client in sorted(self.relays.items()):
            if not client.is_up:
                continue
            try:
                channel, cid = await client.open(peer, timeout_s=timeout_s)
            except HivemeshError as exc:
                errors.append(f"{relay_address[:12]}: {exc}")
                continue
            self.upgrades.relayed(peer, relay_address, cid)
            await self._on_outbound(channel)
            self.upgrade(peer)
            return channel
        raise PeerUnreachable(f"no relay reaches {peer[:12]}: {'; '.join(errors) or 'none up'}")

    def upgrade(self, peer: str) -> bool:
        """Start a punch towards ``peer`` if one is due; whether one started."""

        def open_(relay: str, cid: int) -> bool:
            client = self.relays[relay]
            return client.is_up and client.circuit_of(peer) == cid

        ask = self.upgrades.ask(peer, self._clock(), direct=self._has_direct(peer), open_=open_)
        if ask is not None:
            self._tasks.spawn(self.relays[ask.relay].punch(ask.cid, ask.candidates))
        return ask is not None

    def tick(self) -> None:
        """Re-try upgrades that are due, and re-open (and reserve again on) a
        relay whose channel ended, every :attr:`revive_s` (call about once a
        second). Without that a node behind a NAT stayed unreachable, and
        unable to reach its NATed peers, for good once its relay restarted
        (chaos scenario ``nat``); so did one whose relay was down or cut off
        when it started."""
        for peer in self.upgrades.peers():
            self.upgrade(peer)
        now = self._clock()
        for relay, client in sorted(self.relays.items()):
            if self.upgrades.revive(relay, now, up=client.is_up):
                self._tasks.spawn(self._revive(client, self._reserving.get(relay, True)))

    async def _revive(self, client: RelayClient, reserve: bool) -> None:
        try:
            await client.start(reserve=reserve)
        except (HivemeshError, OSError, TimeoutError):
            self.counters.incr("relay_revive_failed")
            return
        self.counters.incr("relay_revived")

    def _on_punch(
        self, client: RelayClient, peer: str, cid: int, candidates: tuple[HostPort, ...]
    ) -> None:
        plan = self.upgrades.answer(peer, candidates, self._clock(), direct=self._has_direct(peer))
        if plan is not None:
            self._tasks.spawn(self._punch(peer, plan))

    async def _punch(self, peer: str, plan: PunchPlan) -> None:
        ok = False
        try:
            for host, port in plan.candidates:
                self.endpoint.prime(host, port, ttl=plan.prime_ttl)
            ok = await (
                self._dial(peer, plan.candidates, plan.dial_after_s)
                if plan.dial
                else self._await_punch(peer)
            )
        finally:
            self.upgrades.ended(peer, ok, self._clock())

    async def _dial(self, peer: str, candidates: tuple[HostPort, ...], after_s: float) -> bool:
        await asyncio.sleep(after_s)
        for host, port in candidates:
            try:
                channel = await self.endpoint.dial(
                    host, port, expect_address=peer, timeout_s=2.0, path="punched"
                )
            except HivemeshError as exc:
                _log.debug("punch dial of %s:%d failed: %r", host, port, exc)
                continue
            await self._on_outbound(channel)
            return True
        return False

    async def _await_punch(self, peer: str) -> bool:
        event = self._waiters.setdefault(peer, asyncio.Event())
        try:
            async with asyncio.timeout(self._punch_wait_s):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.pop(peer, None)

    def close(self) -> None:
        """Close the relay clients and tasks (not the endpoint)."""
        for client in self.relays.values():
            client.close()
        self._tasks.cancel()
