"""Hole punching and address discovery decisions, sans-IO.

Theory of operation
-------------------
**Observed addresses** (:class:`ObservedAddresses`). Every peer we hold a
UDP channel with (a relay says so in OBSERVED) reports the ``ip:port`` it
sees our socket come from. One report proves little (a peer may lie, a NAT
may map per destination), so an address is *believed* once ``quorum``
distinct reporters agree on it (default 2; a node that knows a single relay
may set 1); reports older than ``ttl_s`` are forgotten, and a reporter's
newer report replaces its older one. Several agreeing reporters with the
same port mean an endpoint-independent mapping (punchable); reporters that
disagree on the port point to a symmetric NAT (:meth:`ObservedAddresses.symmetric`).

**Punch plans** (:func:`plan_punch`). Two nodes that share a relay circuit
exchange candidates through the relay (PUNCH). Both first prime their own
NAT towards every candidate with low-TTL datagrams; then the one with the
smaller address dials (QUIC) after ``dial_after_s``, the other waits for it
(both ends compute the same roles). Candidates are de-duplicated, capped
and tried in the order given (the relay's observation first).

**Retries** (:class:`PunchSchedule`). A relayed link keeps trying to
upgrade: after a failed punch the next is due after ``base_s`` doubling up
to ``max_s``; a punch that never reports back (its circuit closed before
the answer) stops blocking the next after ``in_flight_s``; a success or a
direct link resets it. No punch starts, nor answers a peer's offer, while
one towards that peer runs or once a direct link exists.

**Upgrades** (:class:`Upgrades`). What the asyncio traversal
(:mod:`hivemesh.transports.traversal`) decides, in one place: which
relayed circuit we opened to each peer, when to ask a peer for a punch
(due on the schedule, its circuit still open), whether to answer a peer's
offer and with which plan, and when to re-open a relay channel that ended
(every ``revive_s``). It counts ``punch_requested``, ``punch_skipped``,
``punch_no_candidates``, ``punch_started``, ``punch_ok`` and ``punch_failed``.

**Punch sources** (:class:`PunchSources`). A QUIC connection accepted from
a candidate of a punch we wait for is "punched", not plain "udp". Those
candidates are expected from :meth:`Upgrades.answer` until
:meth:`Upgrades.ended` (success, failure or a cancelled punch: the driver
ends every punch it started), so they are bounded by the punches running,
at most one per peer. An accepted connection is labelled when its stream
opens, before its channel can end the punch, so ending it forgets nothing
a label still needs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemesh.transports.stats import TransportCounters

__all__ = [
    "ObservedAddresses",
    "PunchAsk",
    "PunchPlan",
    "PunchSchedule",
    "PunchSources",
    "Upgrades",
    "plan_punch",
]

HostPort = tuple[str, int]


@dataclass
class ObservedAddresses:
    """Reports of our public address by peers (see the module docs)."""

    quorum: int = 2
    ttl_s: float = 300.0
    _reports: dict[str, tuple[HostPort, float]] = field(default_factory=dict)

    def report(self, reporter: str, observed: HostPort, now: float) -> None:
        """``reporter`` sees our socket as ``observed`` at ``now``."""
        self._reports[reporter] = (observed, now)

    def _live(self, now: float) -> list[HostPort]:
        self._reports = {r: v for r, v in self._reports.items() if now - v[1] <= self.ttl_s}
        return [v[0] for _, v in sorted(self._reports.items())]

    def believed(self, now: float) -> list[HostPort]:
        """Addresses at least ``quorum`` reporters agree on, most reported first."""
        counts = Counter(self._live(now))
        return [
            a for a, n in sorted(counts.items(), key=lambda x: (-x[1], x[0])) if n >= self.quorum
        ]

    def candidates(self, now: float) -> list[HostPort]:
        """Every address reported lately (believed first): what to offer a peer."""
        believed = self.believed(now)
        rest = sorted(set(self._live(now)) - set(believed))
        return believed + rest

    def symmetric(self, now: float) -> bool:
        """Reporters see one IP behind several ports: a symmetric NAT."""
        seen = self._live(now)
        ports: dict[str, set[int]] = {}
        for ip, port in seen:
            ports.setdefault(ip, set()).add(port)
        return any(len(p) > 1 for p in ports.values())


@dataclass(frozen=True, slots=True)
class PunchPlan:
    """What this node does in one punch: prime ``candidates``; dial them if ``dial``."""

    candidates: tuple[HostPort, ...]
    dial: bool
    prime_ttl: int = 2
    dial_after_s: float = 0.3


def plan_punch(
    local: str, peer: str, candidates: list[HostPort], *, max_candidates: int = 8
) -> PunchPlan:
    """The plan for punching towards ``peer`` (see the module docs)."""
    seen: list[HostPort] = []
    for c in candidates:
        if c not in seen and 0 < c[1] < 65536:
            seen.append(c)
    return PunchPlan(tuple(seen[:max_candidates]), dial=local < peer)


@dataclass
class PunchSchedule:
    """When the next punch towards each peer is due (see the module docs)."""

    base_s: float = 5.0
    max_s: float = 120.0
    #: A punch that never reports back (its PUNCH lost with a closed circuit)
    #: blocks the next one this long at most.
    in_flight_s: float = 10.0
    _failures: dict[str, int] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)
    _running: set[str] = field(default_factory=set)

    def may_answer(self, peer: str, *, direct: bool) -> bool:
        """Whether to punch on ``peer``'s offer (none runs, no direct link)."""
        return not direct and peer not in self._running

    def may_start(self, peer: str, now: float, *, direct: bool) -> bool:
        """Whether to ask ``peer`` for a punch now (also: one is due)."""
        return self.may_answer(peer, direct=direct) and self.due(peer, now)

    def begin(self, peer: str) -> None:
        """A punch towards ``peer`` runs (primes, dials or waits)."""
        self._running.add(peer)

    def ended(self, peer: str, ok: bool, now: float) -> None:
        """The punch towards ``peer`` ended: a direct link (``ok``) or not."""
        self._running.discard(peer)
        if ok:
            self.succeeded(peer)
        else:
            self.failed(peer, now)

    def due(self, peer: str, now: float) -> bool:
        """Whether a punch towards ``peer`` may start now."""
        return now >= self._due.get(peer, float("-inf"))

    def started(self, peer: str, now: float) -> None:
        """A punch started: no other until it ends or ``in_flight_s`` passes."""
        self._due[peer] = now + self.in_flight_s

    def failed(self, peer: str, now: float) -> float:
        """A punch failed; returns the delay until the next."""
        n = self._failures.get(peer, 0)
        self._failures[peer] = n + 1
        delay = min(self.base_s * float(2**n), self.max_s)
        self._due[peer] = now + delay
        return delay

    def succeeded(self, peer: str) -> None:
        """A direct link exists: start over next time."""
        self._failures.pop(peer, None)
        self._due.pop(peer, None)


@dataclass(frozen=True, slots=True)
class PunchAsk:
    """Ask ``peer`` for a punch: offer ``candidates`` on circuit ``cid`` of ``relay``."""

    relay: str
    cid: int
    candidates: tuple[HostPort, ...]


class PunchSources:
    """Where the punches we wait for may come from (see the module docs): a
    container of ``(host, port)`` for :meth:`QuicLink.path
    <hivemesh.transports.quic_link.QuicLink.path>`."""

    def __init__(self) -> None:
        self._waiting: dict[str, frozenset[HostPort]] = {}

    def expect(self, peer: str, candidates: tuple[HostPort, ...]) -> None:
        """A punch from ``peer`` may come from any of ``candidates``."""
        self._waiting[peer] = frozenset(candidates)

    def forget(self, peer: str) -> None:
        """The punch with ``peer`` ended."""
        self._waiting.pop(peer, None)

    def __contains__(self, addr: object) -> bool:
        return any(addr in c for c in self._waiting.values())

    def __len__(self) -> int:
        """How many punches are waited for."""
        return len(self._waiting)


@dataclass
class Upgrades:
    """Relayed links to upgrade and relays to re-open (see the module docs)."""

    local: str
    schedule: PunchSchedule = field(default_factory=PunchSchedule)
    observed: ObservedAddresses = field(default_factory=lambda: ObservedAddresses(quorum=1))
    counters: TransportCounters = field(default_factory=TransportCounters)
    #: Seconds between attempts to re-open an ended relay channel.
    revive_s: float = 5.0
    #: Candidates of the punches we wait for (the QUIC endpoint's ``punch_sources``).
    sources: PunchSources = field(default_factory=PunchSources)
    _circuits: dict[str, tuple[str, int]] = field(default_factory=dict)
    _revive_at: dict[str, float] = field(default_factory=dict)

    def relayed(self, peer: str, relay: str, cid: int) -> None:
        """We opened circuit ``cid`` to ``peer`` through ``relay``."""
        self._circuits[peer] = (relay, cid)
        self.counters.incr("relayed_opened")

    def peers(self) -> list[str]:
        """Peers we hold a relayed circuit to, sorted."""
        return sorted(self._circuits)

    def ask(
        self, peer: str, now: float, *, direct: bool, open_: Callable[[str, int], bool]
    ) -> PunchAsk | None:
        """Whether to ask ``peer`` for a punch now (``open_(relay, cid)``: the
        circuit is still open; a closed one is forgotten)."""
        entry = self._circuits.get(peer)
        if entry is None or not self.schedule.may_start(peer, now, direct=direct):
            return None
        if not open_(*entry):
            del self._circuits[peer]
            return None
        self.schedule.started(peer, now)
        self.counters.incr("punch_requested")
        return PunchAsk(entry[0], entry[1], tuple(self.observed.candidates(now)))

    def answer(
        self, peer: str, candidates: tuple[HostPort, ...], now: float, *, direct: bool
    ) -> PunchPlan | None:
        """Whether to punch on ``peer``'s offer of ``candidates``, and how; a
        plan returned is running until :meth:`ended`."""
        if not self.schedule.may_answer(peer, direct=direct):
            self.counters.incr("punch_skipped")
            return None
        plan = plan_punch(self.local, peer, list(candidates))
        if not plan.candidates:
            self.counters.incr("punch_no_candidates")
            self.schedule.ended(peer, False, now)
            return None
        self.schedule.begin(peer)
        if not plan.dial:
            self.sources.expect(peer, plan.candidates)
        self.counters.incr("punch_started")
        return plan

    def ended(self, peer: str, ok: bool, now: float) -> None:
        """The punch towards ``peer`` ended: a direct link (``ok``) or not
        (failed or cancelled); its candidates are expected no more."""
        self.schedule.ended(peer, ok, now)
        self.sources.forget(peer)
        self.counters.incr("punch_ok" if ok else "punch_failed")

    def relay_added(self, relay: str, now: float) -> None:
        """A relay is in use (its first start runs now)."""
        self._revive_at[relay] = now + self.revive_s

    def revive(self, relay: str, now: float, *, up: bool) -> bool:
        """Whether to re-open ``relay``'s channel now (it is not ``up``)."""
        if up or now < self._revive_at.get(relay, float("-inf")):
            return False
        self._revive_at[relay] = now + self.revive_s
        return True
