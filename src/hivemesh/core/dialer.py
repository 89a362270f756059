"""When to dial which endpoint: the dial schedule, as a sans-IO machine.

Theory of operation
-------------------
A node keeps a channel to every endpoint it *wants* (a known peer's
``host:port``, or a bootstrap ``host:port`` whose address the handshake
tells). :class:`Dialer` decides when each is dialled; the driver
(:mod:`hivemesh.runtime.connections`) only opens the sockets. Time is the
caller's monotonic clock in milliseconds, passed to every input;
randomness (the jitter) is an injected generator (:class:`Jitter`). No I/O, no clock.

Inputs: :meth:`Dialer.want`, :meth:`Dialer.forget`, link changes
(:meth:`Dialer.linked`, :meth:`Dialer.unlinked`), how a dial went
(:meth:`Dialer.dialled`) and refusals (:meth:`Dialer.refused`).
Outputs: :meth:`Dialer.due` (the endpoints to dial now, each then counted
as in flight until its outcome comes back) and :meth:`Dialer.next_deadline`.

The rules, per endpoint (its *delay* starts at ``reconnect_min_ms``):

=====================================  ======================================
event                                  next dial
=====================================  ======================================
wanted, no link to its address         now
its address is linked                  none while the link lasts
the link ended after ``>= 2 *          now; the delay resets to the minimum
reconnect_max_ms``
the link ended sooner (flapping)       after the jittered delay; it doubles
dial failed (no answer, error)         after the jittered delay; it doubles,
                                       up to ``reconnect_max_ms``
dial refused (:data:`Outcome.REFUSED`) same, up to ``refused_mult *
                                       reconnect_max_ms``: it will not
                                       change its mind every second
dial superseded (the peer holds a      after ``handover_ms`` unless a link
better channel to us)                  comes first
dial opened a channel that is not     after the jittered delay; it doubles
the link (closed at once)
the endpoint is this node itself       never: the endpoint is dropped
=====================================  ======================================

A peer that no TCP endpoint reaches is tried over the other paths:
:class:`Fallback` says which known, admitted, unlinked peers to try now
(each at most every ``retry_ms``; the driver tries its QUIC endpoints
first, then the relays), and :func:`path_changes` which links changed path.
:class:`StunSchedule` says when to ask each configured STUN server for this
node's mapped address: every server at once at start, then each
:data:`STUN_INTERVAL_MS` after it answered, :data:`STUN_RETRY_MS` after it
failed (no answer, no name), in server order.

The jittered delay is ``delay * (0.5 + rng.random())``. An endpoint is never
dialled twice at once. Targets are kept in endpoint order, so the same
inputs give the same outputs (deterministic under a seeded ``rng``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from hivemesh.errors import (
    ChannelSuperseded,
    ConfigError,
    HivemeshError,
    InviteError,
    PeerIdentityMismatch,
    SelfConnection,
    UnknownPeer,
)


class Jitter(Protocol):
    """The jitter's generator, passed in (a seeded ``random.Random`` does):
    the core never draws on its own."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


__all__ = [
    "REFUSALS",
    "STUN_INTERVAL_MS",
    "STUN_RETRY_MS",
    "UDP_PREFIX",
    "DialPolicy",
    "Dialer",
    "Endpoint",
    "Fallback",
    "Jitter",
    "Outcome",
    "Routes",
    "StunSchedule",
    "Target",
    "dial_outcome",
    "last_error",
    "parse_endpoint",
    "path_changes",
    "refused_everywhere",
    "routes",
]

#: ``(host, port)``
Endpoint = tuple[str, int]

#: An endpoint record ``udp:host:port`` is a QUIC endpoint (the others are TCP).
UDP_PREFIX = "udp:"

#: A STUN server that answered is asked again after this long (ms): well
#: inside the observed addresses' 300 s lifetime and a NAT's UDP timeout.
STUN_INTERVAL_MS = 60_000
#: A STUN server that did not answer is asked again after this long (ms).
STUN_RETRY_MS = 15_000


def parse_endpoint(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` too); raises :class:`ConfigError`."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"endpoint must be host:port, got {text!r}")
    host = host.strip("[]")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"bad port in endpoint {text!r}") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"port out of range in endpoint {text!r}")
    return host, p


@dataclass(frozen=True, slots=True)
class Routes:
    """How a :class:`~hivemesh.core.effects.Dial`'s endpoint records are
    reached: ``tcp`` go to the dial schedule (:class:`Dialer`), ``udp``
    (``udp:`` records) to the QUIC paths, ``bad`` malformed ones are
    dropped and counted (``bad_endpoint``)."""

    tcp: tuple[Endpoint, ...]
    udp: tuple[Endpoint, ...]
    bad: int


def routes(endpoints: Iterable[str]) -> Routes:
    """Sort endpoint records by transport (:class:`Routes`), in their order."""
    tcp: list[Endpoint] = []
    udp: list[Endpoint] = []
    bad = 0
    for ep in endpoints:
        quic = ep.startswith(UDP_PREFIX)
        try:
            (udp if quic else tcp).append(parse_endpoint(ep[len(UDP_PREFIX) :] if quic else ep))
        except ConfigError:
            bad += 1
    return Routes(tuple(tcp), tuple(udp), bad)


class Outcome(enum.Enum):
    """How a dial went (the driver's report to :meth:`Dialer.dialled`)."""

    OPENED = "opened"  # a channel, handed to the links (a link unless closed at once)
    SUPERSEDED = "superseded"  # the peer retired it at once: its better channel comes
    SELF = "self"  # the endpoint is this node
    REFUSED = "refused"  # the endpoint turned us away
    FAILED = "failed"  # no answer, a transport error, a deadline
    CRASHED = "crashed"  # a bug on the dial path (logged by the driver)


#: Errors by which an endpoint turns us away (as opposed to failing to answer).
REFUSALS = (UnknownPeer, InviteError, PeerIdentityMismatch)


def dial_outcome(error: BaseException) -> tuple[Outcome, str]:
    """How a dial that raised ``error`` went, and the counter it is counted
    under: this node itself, superseded (the peer accepted us and retired the
    channel at once: its better one comes), refused (:data:`REFUSALS`), or
    failed (``dial_failed_<code>``)."""
    if isinstance(error, SelfConnection):
        return Outcome.SELF, "dial_self_skipped"
    if isinstance(error, ChannelSuperseded):
        return Outcome.SUPERSEDED, "dial_superseded"
    code = error.code if isinstance(error, HivemeshError) else "dial_error"
    refused = isinstance(error, REFUSALS)
    return (Outcome.REFUSED if refused else Outcome.FAILED), f"dial_failed_{code}"


def refused_everywhere(targets: Iterable[Mapping[str, object]], address: str) -> bool:
    """Whether every endpoint dialled for ``address`` turned us away (rows of
    :meth:`Dialer.targets`; a join through it has nowhere left to go)."""
    return all(t["refused"] for t in targets if t["address"] == address)


def last_error(targets: Iterable[Mapping[str, object]], address: str) -> str | None:
    """The first recorded dial error of an endpoint of ``address``, if any."""
    for t in targets:
        if t["address"] == address and t["last_error"]:
            return str(t["last_error"])
    return None


@dataclass(frozen=True, slots=True)
class DialPolicy:
    """Timing of the dial schedule (ms; see module docs)."""

    reconnect_min_ms: int
    reconnect_max_ms: int
    handover_ms: int
    refused_mult: int = 6


@dataclass(slots=True)
class Target:
    """An endpoint to keep a channel to, and how dialling it went."""

    host: str
    port: int
    address: str | None
    delay_ms: int
    due_ms: int | None = 0  # next dial; None while linked or in flight
    in_flight: bool = False
    attempts: int = 0
    last_error: str | None = None
    refused: str | None = None  # the code of the last refusal, until a link opens

    def status(self) -> dict[str, object]:
        """What ``status`` shows of it."""
        return {
            "endpoint": f"{self.host}:{self.port}",
            "address": self.address,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "refused": self.refused,
        }


class Dialer:
    """The dial schedule of every wanted endpoint (see module docs)."""

    def __init__(self, local: str, policy: DialPolicy, rng: Jitter) -> None:
        self.local = local
        self.policy = policy
        self._rng = rng
        self._targets: dict[Endpoint, Target] = {}
        self._linked: set[str] = set()

    # -- inputs ----------------------------------------------------------------

    def want(self, host: str, port: int, address: str | None, now_ms: int) -> None:
        """Keep a channel to ``host:port`` (to ``address`` if known)."""
        if address == self.local:
            return
        t = self._targets.get((host, port))
        if t is None:
            t = Target(host, port, address, self.policy.reconnect_min_ms, due_ms=now_ms)
            self._targets[(host, port)] = t
        elif address is not None and t.address != address:
            t.address = address
        if t.address in self._linked:
            t.due_ms = None
        elif t.due_ms is None and not t.in_flight:
            t.due_ms = now_ms

    def forget(self, address: str) -> list[Endpoint]:
        """Stop dialling every endpoint of ``address``; returns them."""
        gone = sorted(ep for ep, t in self._targets.items() if t.address == address)
        for ep in gone:
            del self._targets[ep]
        return gone

    def linked(self, address: str) -> None:
        """A link to ``address`` is up (or held for a handover): no dials to it."""
        self._linked.add(address)
        for t in self._targets.values():
            if t.address == address:
                t.due_ms = None

    def unlinked(self, address: str, lived_ms: int | None, now_ms: int) -> None:
        """The link to ``address`` ended after ``lived_ms`` (None: it was
        never this node's link to wait on); redial its endpoints."""
        self._linked.discard(address)
        for _, t in sorted(self._targets.items()):
            if t.address != address or t.in_flight:
                continue
            if lived_ms is not None and lived_ms < 2 * self.policy.reconnect_max_ms:
                t.due_ms = now_ms + self._backoff(t, self.policy.reconnect_max_ms)
            else:
                if lived_ms is not None:
                    t.delay_ms = self.policy.reconnect_min_ms
                t.due_ms = now_ms

    def dialled(
        self,
        endpoint: Endpoint,
        outcome: Outcome,
        now_ms: int,
        *,
        peer: str | None = None,
        error: str | None = None,
    ) -> None:
        """How the dial of ``endpoint`` went (``peer``: the address the
        handshake proved; ``error``: what failed, for ``status``)."""
        t = self._targets.get(endpoint)
        if t is None:  # forgotten meanwhile
            return
        t.in_flight = False
        p = self.policy
        if outcome is Outcome.SELF or (peer is not None and peer == self.local):
            del self._targets[endpoint]
            return
        if peer is not None and t.address is None:
            t.address = peer
        if outcome is Outcome.OPENED:
            t.last_error = t.refused = None
        elif error is not None:
            t.last_error = error
        if t.address in self._linked:
            t.due_ms = None
        elif outcome is Outcome.SUPERSEDED:
            t.due_ms = now_ms + p.handover_ms
        elif outcome is Outcome.REFUSED:
            t.due_ms = now_ms + self._backoff(t, p.reconnect_max_ms * p.refused_mult)
        else:  # failed, crashed, or a channel that did not become the link: back off
            t.due_ms = now_ms + self._backoff(t, p.reconnect_max_ms)

    def refused(
        self,
        address: str | None,
        code: str,
        error: str,
        endpoint: Endpoint | None = None,
        *,
        wrong_node: bool = False,
    ) -> bool:
        """An endpoint turned us away with ``code``: mark the targets it
        concerns -- ``endpoint`` only when the address is unknown or the node
        there is not the one dialled (``wrong_node``), else every endpoint of
        ``address``. True when the cause is new for one of them (log it then)."""
        if endpoint is not None and (address is None or wrong_node):
            targets = [self._targets[endpoint]] if endpoint in self._targets else []
        else:
            targets = [t for _, t in sorted(self._targets.items()) if t.address == address]
        new = not targets or any(t.refused != code for t in targets)
        for t in targets:
            t.refused, t.last_error = code, error
        return new

    # -- outputs ---------------------------------------------------------------

    def due(self, now_ms: int) -> list[Endpoint]:
        """The endpoints to dial now (each is in flight until :meth:`dialled`)."""
        out = []
        for ep, t in sorted(self._targets.items()):
            if t.due_ms is not None and t.due_ms <= now_ms and not t.in_flight:
                if t.address in self._linked:
                    t.due_ms = None
                    continue
                t.due_ms = None
                t.in_flight = True
                t.attempts += 1
                out.append(ep)
        return out

    def next_deadline(self) -> int | None:
        """When :meth:`due` has something next (ms), or None."""
        dues = [t.due_ms for t in self._targets.values() if t.due_ms is not None]
        return min(dues) if dues else None

    def target(self, endpoint: Endpoint) -> Target | None:
        """The target of ``endpoint``, if wanted."""
        return self._targets.get(endpoint)

    def targets(self) -> list[dict[str, object]]:
        """Every wanted endpoint with how dialling it went, in endpoint order."""
        return [t.status() for _, t in sorted(self._targets.items())]

    def _backoff(self, t: Target, limit_ms: int) -> int:
        """The jittered current delay; the delay doubles up to ``limit_ms``."""
        pause = int(t.delay_ms * (0.5 + self._rng.random()))
        t.delay_ms = min(t.delay_ms * 2, limit_ms)
        return pause


class Fallback:
    """Which peers to reach over UDP or a relay now (module docs)."""

    def __init__(self, local: str, retry_ms: int) -> None:
        self.local = local
        self.retry_ms = retry_ms
        self._tried: dict[str, int] = {}

    def due(
        self,
        known: Iterable[str],
        linked: Container[str],
        admits: Callable[[str], bool],
        now_ms: int,
    ) -> list[str]:
        """The known peers with no link that we admit and did not try within
        ``retry_ms``, in address order (each counted as tried now)."""
        out = []
        for peer in sorted(set(known)):
            if peer == self.local or peer in linked or not admits(peer):
                continue
            last = self._tried.get(peer)
            if last is not None and now_ms - last < self.retry_ms:
                continue
            self._tried[peer] = now_ms
            out.append(peer)
        return out


class StunSchedule:
    """When to ask which STUN server (module docs); times in ms."""

    def __init__(
        self,
        servers: Iterable[str],
        *,
        interval_ms: int = STUN_INTERVAL_MS,
        retry_ms: int = STUN_RETRY_MS,
    ) -> None:
        self.interval_ms = interval_ms
        self.retry_ms = retry_ms
        self._due = dict.fromkeys(sorted(set(servers)), 0)

    def due(self, now_ms: int) -> list[str]:
        """The servers to ask now, in order."""
        return [server for server, at in self._due.items() if at <= now_ms]

    def asked(self, server: str, ok: bool, now_ms: int) -> None:
        """``server`` answered (``ok``) or failed at ``now_ms``."""
        if server in self._due:
            self._due[server] = now_ms + (self.interval_ms if ok else self.retry_ms)

    def next_deadline(self) -> int | None:
        """When the next server is due (None: no servers)."""
        return min(self._due.values(), default=None)


def path_changes(before: dict[str, str], now: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(peer, from, to)`` for every link whose path changed between two
    looks (``none``: no link), in address order."""
    return [
        (peer, before.get(peer, "none"), now.get(peer, "none"))
        for peer in sorted(set(before) | set(now))
        if before.get(peer) != now.get(peer)
    ]
