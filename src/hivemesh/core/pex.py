"""Membership vocabulary: member records, tuning, and epidemic dissemination.

Theory of operation
-------------------
Membership news travels as :class:`Update` records ``[state, address,
incarnation, endpoints, origin]``: "``origin`` says ``address`` is in
``state`` at ``incarnation``, and can be dialled at ``endpoints``". Because
every alive record carries the member's dialable ``host:port`` endpoints,
membership gossip *is* peer exchange: a node that hears about a member can
dial it, with no registry and no special node.

A :class:`BroadcastQueue` holds the newest update per address (a newer update
about an address replaces the older one: there is no point spreading stale
news). Each time updates are piggybacked on an outgoing frame, the least
transmitted ones go first and their counts rise; an update is retired after
``retransmit_limit(n)`` = ``retransmit_mult * ceil(log10(n + 1))``
transmissions, as in SWIM's infection-style dissemination (and hashicorp
memberlist's ``RetransmitMult``). That bounds traffic per update to
O(log n) per node while reaching every member with high probability.

:class:`MembershipConfig` (the SWIM tuning, memberlist's LAN defaults) and
the member records (:class:`Member`, :class:`MemberChange`) live here too so
that this module is the whole vocabulary; :mod:`hivemesh.core.membership`
re-exports them and holds the protocol.

Decoding is strict: anything that is not exactly an update raises
:class:`~hivemesh.errors.DecodeError` for the caller to count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from functools import lru_cache
from typing import Any

from hivemesh.core.identity import public_key_of
from hivemesh.errors import DecodeError, InvalidAddress, InvalidArgument

__all__ = [
    "MAX_ENDPOINTS",
    "MAX_ENDPOINT_CHARS",
    "MAX_UPDATES_PER_FRAME",
    "STATE_OF",
    "UPDATE_OF",
    "BroadcastQueue",
    "Member",
    "MemberChange",
    "MemberState",
    "MembershipConfig",
    "Update",
    "UpdateState",
    "check_address",
    "check_endpoints",
    "decode_update",
    "decode_updates",
    "retransmit_limit",
]

#: Most endpoints a member may advertise.
MAX_ENDPOINTS = 8
#: Longest endpoint string (``host:port``; hosts may be DNS names).
MAX_ENDPOINT_CHARS = 261
#: Most updates accepted in one frame.
MAX_UPDATES_PER_FRAME = 4096
_MAX_INCARNATION = 2**63 - 1


class UpdateState(IntEnum):
    """Wire codes of member states."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@dataclass(frozen=True, slots=True)
class Update:
    """One piece of membership news (see the module docstring)."""

    state: UpdateState
    address: str
    incarnation: int
    endpoints: tuple[str, ...]
    origin: str

    def encode(self) -> list[Any]:
        """The wire form ``[state, address, incarnation, endpoints, origin]``."""
        return [int(self.state), self.address, self.incarnation, list(self.endpoints), self.origin]


class MemberState(StrEnum):
    """A member's state as this node sees it."""

    UP = "up"
    SUSPECT = "suspect"
    DOWN = "down"
    LEFT = "left"


#: Wire state -> member state, and back.
STATE_OF = {
    UpdateState.ALIVE: MemberState.UP,
    UpdateState.SUSPECT: MemberState.SUSPECT,
    UpdateState.DEAD: MemberState.DOWN,
    UpdateState.LEFT: MemberState.LEFT,
}
UPDATE_OF = {v: k for k, v in STATE_OF.items()}
#: Wire code -> update state (decoding: a lookup, not an enum call).
_UPDATE_STATES: dict[int, UpdateState] = {int(s): s for s in UpdateState}


@dataclass(frozen=True, slots=True)
class Member:
    """A snapshot of one member as this node sees it."""

    address: str
    state: MemberState
    incarnation: int
    endpoints: tuple[str, ...]
    since_ms: int


@dataclass(frozen=True, slots=True)
class MemberChange:
    """A member changed state (``previous`` is None for a new member)."""

    address: str
    previous: MemberState | None
    state: MemberState
    incarnation: int
    endpoints: tuple[str, ...]
    at_ms: int


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    """SWIM tuning; defaults are memberlist's LAN defaults. Units in the names.

    ``probe_timeout_ms`` must sit well above the p99 round trip, and the
    rest of the interval must fit an indirect probe (two round trips):
    with round trips near the timeout, live members get suspected often and
    false DOWNs appear under loss (each one undone by refutation).
    """

    probe_interval_ms: int = 1000
    probe_timeout_ms: int = 500
    indirect_checks: int = 3
    suspicion_mult: int = 4
    suspicion_max_timeout_mult: int = 6
    retransmit_mult: int = 4
    gossip_interval_ms: int = 200
    gossip_nodes: int = 3
    push_pull_interval_ms: int = 30_000
    join_timeout_ms: int = 30_000
    max_piggyback: int = 16
    max_members: int = 4096
    max_relays: int = 1024
    down_retention_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if not 0 < self.probe_timeout_ms < self.probe_interval_ms:
            raise InvalidArgument("need 0 < probe_timeout_ms < probe_interval_ms")
        if self.suspicion_mult < 1 or self.suspicion_max_timeout_mult < 1:
            raise InvalidArgument("suspicion multipliers must be >= 1")
        for name in ("indirect_checks", "retransmit_mult", "gossip_nodes", "max_piggyback"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be >= 0")
        for name in ("gossip_interval_ms", "push_pull_interval_ms", "join_timeout_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be > 0")

    @classmethod
    def lan(cls) -> MembershipConfig:
        """memberlist's ``DefaultLANConfig`` (the default)."""
        return cls()

    @classmethod
    def fast(cls, probe_interval_ms: int = 200) -> MembershipConfig:
        """Same shape, scaled to a shorter probe interval (tests, loopback demos)."""
        return cls(
            probe_interval_ms=probe_interval_ms,
            probe_timeout_ms=probe_interval_ms // 2,
            gossip_interval_ms=max(1, probe_interval_ms // 5),
            push_pull_interval_ms=probe_interval_ms * 30,
            join_timeout_ms=probe_interval_ms * 30,
        )

    def suspicion_timeout_ms(self, n_members: int, confirmations: int) -> int:
        """Suspicion timeout for a cluster of ``n_members`` after ``confirmations``."""
        scale = max(1.0, math.log10(max(1, n_members)))
        lo = self.suspicion_mult * scale * self.probe_interval_ms
        hi = self.suspicion_max_timeout_mult * lo
        k = self.suspicion_mult - 2
        if n_members - 2 < k:
            k = 0
        if k < 1:
            return int(lo)
        frac = math.log(confirmations + 1) / math.log(k + 1)
        return int(max(lo, hi - frac * (hi - lo)))

    def detection_bound_ms(self, n_members: int) -> int:
        """Worst case from a member's crash until every live member marks it down.

        Each live member probes the crashed one within two shuffled rounds
        (``2 * (n - 1)`` periods), suspects it at the end of that period and
        declares it down when its suspicion timer (at most the unconfirmed
        maximum) fires. One more period covers timer latency.
        """
        rounds = 2 * max(1, n_members - 1) + 2
        return rounds * self.probe_interval_ms + self.suspicion_timeout_ms(n_members, 0)


def check_address(value: Any, what: str) -> str:
    """Return ``value`` if it is a valid address, else raise DecodeError."""
    if type(value) is not str:
        raise DecodeError(f"{what} must be an address string")
    try:
        public_key_of(value)
    except InvalidAddress as exc:
        raise DecodeError(f"{what}: {exc}") from None
    return value


def check_endpoints(value: Any) -> tuple[str, ...]:
    """Validate a wire endpoint list (``["host:port", ...]``)."""
    if type(value) is not list or len(value) > MAX_ENDPOINTS:
        raise DecodeError(f"endpoints must be a list of at most {MAX_ENDPOINTS}")
    for ep in value:
        if type(ep) is not str or not 0 < len(ep) <= MAX_ENDPOINT_CHARS or ":" not in ep:
            raise DecodeError("endpoint must be a 'host:port' string")
    return tuple(value)


def decode_update(item: Any) -> Update:
    """Decode one wire update; raises DecodeError."""
    if type(item) is not list or len(item) != 5:
        raise DecodeError("update must be [state, address, incarnation, endpoints, origin]")
    state, address, inc, endpoints, origin = item
    code = _UPDATE_STATES.get(state) if type(state) is int else None
    if code is None:
        raise DecodeError(f"unknown member state {state!r:.20}")
    if type(inc) is not int or not 0 <= inc <= _MAX_INCARNATION:
        raise DecodeError("incarnation must be a non-negative int64")
    return Update(
        code,
        check_address(address, "update address"),
        inc,
        check_endpoints(endpoints),
        check_address(origin, "update origin"),
    )


def decode_updates(value: Any) -> list[Update]:
    """Decode a wire list of updates; raises DecodeError."""
    if type(value) is not list or len(value) > MAX_UPDATES_PER_FRAME:
        raise DecodeError("updates must be a list")
    return [decode_update(item) for item in value]


@lru_cache(maxsize=256)  # asked for every frame sent; a pure function of two ints
def retransmit_limit(retransmit_mult: int, n_members: int) -> int:
    """How many times an update is piggybacked before it is retired."""
    return retransmit_mult * max(1, math.ceil(math.log10(n_members + 1)))


@dataclass(slots=True)
class _Queued:
    update: Update
    transmits: int
    order: int


class BroadcastQueue:
    """Newest update per address, handed out least-transmitted first."""

    def __init__(self, *, capacity: int = 4096) -> None:
        self._items: dict[str, _Queued] = {}
        self._order = 0
        self._capacity = capacity
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, update: Update) -> None:
        """Queue ``update``, replacing older news about the same address."""
        self._order += 1
        if update.address not in self._items and len(self._items) >= self._capacity:
            # Full: retire the most transmitted entry (it has spread furthest).
            victim = max(self._items.values(), key=lambda q: (q.transmits, -q.order))
            del self._items[victim.update.address]
            self.dropped += 1
        self._items[update.address] = _Queued(update, 0, self._order)

    def take(self, limit: int, retransmit_limit: int) -> list[Update]:
        """Up to ``limit`` updates to piggyback now; counts the transmission."""
        if not self._items or limit <= 0:
            return []
        chosen = list(self._items.values())
        if len(chosen) > 1:  # often one piece of news
            chosen.sort(key=lambda q: (q.transmits, -q.order))
            del chosen[limit:]
        out = []
        for q in chosen:
            q.transmits += 1
            out.append(q.update)
            if q.transmits >= retransmit_limit:
                del self._items[q.update.address]
        return out

    def pending(self) -> list[Update]:
        """Queued updates (for inspection), oldest first."""
        return [q.update for q in sorted(self._items.values(), key=lambda q: q.order)]
