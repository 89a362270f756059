"""How news about a member changes this node's view: SWIM's incarnation rules.

The state-transition half of :mod:`hivemesh.core.membership` (which keeps
probing, timers and the wire): :class:`NewsRules` applies one
:class:`~hivemesh.core.pex.Update` to the member table, records the
resulting :class:`~hivemesh.core.pex.MemberChange` and re-broadcasts what was
news. Sans-IO and deterministic like the rest of ``core``.

News about a member ``m`` currently held at incarnation ``inc``::

    update          held state of m                 -> result
    alive(i)        unknown                         -> add m up (if admitted, room)
    alive(i)        any, i > inc                    -> up at i (new endpoints kept)
    suspect(i)      i < inc, or i == inc and down/left -> ignored
    suspect(i)      suspect at i                    -> one more confirmer (timer shrinks)
    suspect(i)      otherwise                       -> suspect at i (timer starts)
    dead(i)         i < inc, or down/left           -> ignored
    dead(i)         otherwise                       -> down at i
    left(i)         i < inc, or left                -> ignored
    left(i)         otherwise                       -> left at i
    any about us    at or above our incarnation     -> refute: alive(i + 1)

A full-state ``SYNC`` downgrades ``dead`` to ``suspect`` first, so a live
node can still refute it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemesh.core.pex import (
    BroadcastQueue,
    MemberChange,
    MembershipConfig,
    MemberState,
    Update,
    UpdateState,
)

__all__ = ["MemberRecord", "NewsRules"]

#: 1 for the states that count as live (up or suspect), else 0.
_LIVE = {MemberState.UP: 1, MemberState.SUSPECT: 1, MemberState.DOWN: 0, MemberState.LEFT: 0}


@dataclass(slots=True)
class MemberRecord:
    """What this node holds about one member (mutable; internal to membership)."""

    address: str
    state: MemberState
    incarnation: int
    endpoints: tuple[str, ...]
    since_ms: int
    suspect_start_ms: int = 0
    suspect_deadline_ms: int = 0
    confirmers: set[str] = field(default_factory=set)


class NewsRules:
    """Mixin of :class:`~hivemesh.core.membership.Membership`: the rules above.

    It owns no state; the attributes below are the membership's.
    """

    address: str
    endpoints: tuple[str, ...]
    incarnation: int
    config: MembershipConfig
    counters: Counter[str]
    _admit: Callable[[str], bool] | None
    _members: dict[str, MemberRecord]
    #: Members up or suspect (kept with ``_members``: the cluster size is
    #: asked on every frame sent), and the addresses of the suspects.
    _live_n: int
    _suspects: set[str]
    #: The live addresses, sorted (None: to be recomputed after a change).
    _live_sorted: list[str] | None
    _changes: list[MemberChange]
    _queue: BroadcastQueue
    _left: bool

    def _merge(self, updates: list[Update], now_ms: int, *, full_state: bool = False) -> None:
        for u in updates:
            if full_state and u.state is UpdateState.DEAD and u.address != self.address:
                u = Update(UpdateState.SUSPECT, u.address, u.incarnation, u.endpoints, u.origin)
            self._apply(u, now_ms)

    def _apply(self, u: Update, now_ms: int) -> None:
        if u.address == self.address:
            self._about_self(u)
            return
        if self._admit is not None and not self._admit(u.address):
            self.counters["member_not_admitted"] += 1
            return
        r = self._members.get(u.address)
        if r is None:
            if u.state is UpdateState.ALIVE and self._add(
                u.address, u.incarnation, u.endpoints, now_ms
            ):
                self._broadcast(u)
            return
        if u.state is UpdateState.ALIVE:
            if u.incarnation > r.incarnation:
                r.incarnation = u.incarnation
                if u.endpoints:
                    r.endpoints = u.endpoints
                self._set_state(r, MemberState.UP, now_ms)
                self._broadcast(u)
        elif u.state is UpdateState.SUSPECT:
            if u.incarnation < r.incarnation:
                return
            if u.incarnation == r.incarnation and r.state in (MemberState.DOWN, MemberState.LEFT):
                return
            if r.state is MemberState.SUSPECT and u.incarnation == r.incarnation:
                if u.origin not in r.confirmers:
                    self._suspect(r, u.incarnation, u.origin, now_ms)
                    self._broadcast(u)
                return
            self._suspect(r, u.incarnation, u.origin, now_ms)
            self._broadcast(u)
        elif u.state is UpdateState.DEAD:
            if u.incarnation < r.incarnation or r.state in (MemberState.DOWN, MemberState.LEFT):
                return
            r.incarnation = u.incarnation
            self._set_state(r, MemberState.DOWN, now_ms)
            self._broadcast(u)
        else:  # LEFT
            if u.incarnation < r.incarnation or r.state is MemberState.LEFT:
                return
            r.incarnation = u.incarnation
            self._set_state(r, MemberState.LEFT, now_ms)
            self._broadcast(u)

    def _about_self(self, u: Update) -> None:
        if u.state is UpdateState.ALIVE:
            stale_life = u.incarnation > self.incarnation
        elif self._left:
            return
        else:
            stale_life = u.incarnation >= self.incarnation
        if stale_life:
            # Someone holds news of us at our incarnation or later: refute.
            self.incarnation = u.incarnation + 1
            self._broadcast(self._self_update(UpdateState.ALIVE))
            self.counters["refuted"] += 1
        elif u.state is not UpdateState.ALIVE:
            # Old news of our death still circulates: the sender missed our
            # refutation, so spread it again (no new incarnation needed).
            self._broadcast(self._self_update(UpdateState.ALIVE))

    def _suspect(self, r: MemberRecord, incarnation: int, origin: str, now_ms: int) -> None:
        if r.state is not MemberState.SUSPECT or incarnation != r.incarnation:
            r.incarnation = incarnation
            r.confirmers = set()
            r.suspect_start_ms = now_ms
            self._set_state(r, MemberState.SUSPECT, now_ms)
        r.confirmers.add(origin)
        n = self._cluster_size()
        timeout = self.config.suspicion_timeout_ms(n, len(r.confirmers) - 1)
        r.suspect_deadline_ms = r.suspect_start_ms + timeout

    def _add(self, address: str, inc: int, endpoints: tuple[str, ...], now_ms: int) -> bool:
        if len(self._members) >= self.config.max_members:
            self.counters["members_full"] += 1
            return False
        self._members[address] = MemberRecord(address, MemberState.UP, inc, endpoints, now_ms)
        self._live_n += 1
        self._live_sorted = None
        self._changes.append(MemberChange(address, None, MemberState.UP, inc, endpoints, now_ms))
        return True

    def _set_state(self, r: MemberRecord, state: MemberState, now_ms: int) -> None:
        if r.state is state:
            return
        prev, r.state, r.since_ms = r.state, state, now_ms
        self._live_n += _LIVE[state] - _LIVE[prev]
        self._live_sorted = None
        if state is MemberState.SUSPECT:
            self._suspects.add(r.address)
        else:
            self._suspects.discard(r.address)
            r.confirmers = set()
        self._changes.append(
            MemberChange(r.address, prev, state, r.incarnation, r.endpoints, now_ms)
        )

    def _cluster_size(self) -> int:
        return self._live_n + 1

    def _self_update(self, state: UpdateState) -> Update:
        return Update(state, self.address, self.incarnation, self.endpoints, self.address)

    def _broadcast(self, u: Update) -> None:
        self._queue.push(u)
