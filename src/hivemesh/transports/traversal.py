"""A node's UDP paths to its peers: direct QUIC, relayed, punched (docs/nat.md).

Theory of operation
-------------------
:class:`Traversal` owns the node's :class:`~hivemesh.transports.quic.QuicEndpoint`
and one :class:`~hivemesh.transports.relay.RelayClient` per relay, and hands
every channel it makes to its owner: ``on_inbound`` for the peer's,
``on_outbound`` for ours (the connection manager prefers a direct channel,
so a punched one replaces a relayed one in place). A relayed channel we
opened is upgraded by punching: both ends follow
:func:`~hivemesh.transports.punch.plan_punch`, and while the peer is reachable
only through a relay the opener asks again on
:class:`~hivemesh.transports.punch.PunchSchedule`. :meth:`Traversal.tick`
also re-opens a relay whose channel ended. Counters (``punch_started``,
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
from hivemesh.transports.punch import ObservedAddresses, PunchSchedule, plan_punch
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
        self.address = identity.address
        self.observed = observed if observed is not None else ObservedAddresses(quorum=1)
        self.schedule = schedule if schedule is not None else PunchSchedule()
        self.counters = TransportCounters()
        self.relays: dict[str, RelayClient] = {}
        self._authorize = authorize
        self._on_inbound = on_inbound
        self._on_outbound = on_outbound
        self._has_direct = has_direct
        self._opts = options
        self._boot_id = boot_id
        self._punch_wait_s = punch_wait_s
        self._clock = clock
        self._circuits: dict[str, tuple[RelayClient, int]] = {}  # peer -> circuit we opened
        self._tasks = TaskSet(self.counters, "traversal_task")
        self._waiters: dict[str, asyncio.Event] = {}
        #: relay -> when its channel may next be re-opened (it ended: the relay restarted)
        self._revive_at: dict[str, float] = {}
        self._reserving: dict[str, bool] = {}  # relay -> reserve on it
        #: Seconds between attempts to re-open an ended relay channel.
        self.revive_s = 5.0

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
        self._revive_at[relay_address] = self._clock() + self.revive_s
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
            self._circuits[peer] = (client, cid)
            self.counters.incr("relayed_opened")
            await self._on_outbound(channel)
            self.upgrade(peer)
            return channel
        raise PeerUnreachable(f"no relay reaches {peer[:12]}: {'; '.join(errors) or 'none up'}")

    def upgrade(self, peer: str) -> bool:
        """Start a punch towards ``peer`` if one is due; whether one started."""
        now = self._clock()
        entry = self._circuits.get(peer)
        if entry is None or not self.schedule.may_start(peer, now, direct=self._has_direct(peer)):
            return False
        client, cid = entry
        if not client.is_up or client.circuit_of(peer) != cid:
            self._circuits.pop(peer, None)
            return False
        self.schedule.started(peer, now)
        self.counters.incr("punch_requested")
        self._tasks.spawn(client.punch(cid, tuple(self.observed.candidates(now))))
        return True

    def tick(self) -> None:
        """Re-try upgrades that are due, and re-open (and reserve again on) a
        relay whose channel ended, every :attr:`revive_s` (call about once a
        second). Without that a node behind a NAT stayed unreachable, and
        unable to reach its NATed peers, for good once its relay restarted
        (chaos scenario ``nat``); so did one whose relay was down or cut off
        when it started."""
        for peer in sorted(self._circuits):
            self.upgrade(peer)
        now = self._clock()
        for relay, client in sorted(self.relays.items()):
            if client.is_up or now < self._revive_at.get(relay, float("-inf")):
                continue
            self._revive_at[relay] = now + self.revive_s
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
        if not self.schedule.may_answer(peer, direct=self._has_direct(peer)):
            self.counters.incr("punch_skipped")
            return
        self._tasks.spawn(self._punch(peer, candidates))

    async def _punch(self, peer: str, candidates: tuple[HostPort, ...]) -> None:
        plan = plan_punch(self.address, peer, list(candidates))
        if not plan.candidates:
            self.counters.incr("punch_no_candidates")
            self.schedule.ended(peer, False, self._clock())
            return
        self.schedule.begin(peer)
        self.counters.incr("punch_started")
        ok = False
        try:
            for host, port in plan.candidates:
                self.endpoint.prime(host, port, ttl=plan.prime_ttl)
            ok = await (
                self._dial(peer, plan.candidates, plan.dial_after_s)
                if plan.dial
                else self._await_punch(peer, plan.candidates)
            )
        finally:
            self.schedule.ended(peer, ok, self._clock())
        self.counters.incr("punch_ok" if ok else "punch_failed")

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

    async def _await_punch(self, peer: str, candidates: tuple[HostPort, ...]) -> bool:
        self.endpoint.punch_sources.update(candidates)
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
