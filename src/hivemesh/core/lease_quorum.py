"""Sans-IO quorum leases: leaderless, majority-acknowledged, fencing-token monotonic.

Theory of operation
-------------------
N *voters* each keep, per resource, a slot ``(max_token, token, holder,
expiry_ms)``; ``expiry_ms`` is on the voter's own clock. A *proposer* (any
node acting for a client) runs each operation against all voters and decides
on a majority ``M = N // 2 + 1``:

``acquire(resource, holder, ttl_ms)``
    1. *prepare*: ask every voter for ``max_token`` and whether it sees an
       unexpired lease. As soon as ``M`` voters report "free", pick
       ``token = max(max_token of every reply) + 1``; if more than ``N - M``
       report "held", fail (no voter was changed). A voter that is down can
       leave the answers split: a lease granted by a bare majority whose
       holder's own voter then crashed (``kill -9`` of the holder's node) is
       "held" at ``M - 1`` live voters and "free" at the rest, and neither
       rule fires until the TTL runs out. So, in addition: once every voter
       has been asked and one more retransmission interval passed, a prepare
       that ``M`` voters answered, at least one of them "held", fails
       (busy) instead of waiting for the silent voters until the deadline.
       Failing a prepare is always safe (nothing was written); it answers
       "held" for a lease that is held.
    2. *accept*: send ``(token, holder, ttl_ms)``. A voter accepts only if its
       slot is free or expired *on its own clock* and ``token > max_token``;
       it then stores ``expiry = now + ttl_ms``. ``M`` acks grant the lease.
       If a majority becomes impossible the acquire fails and the proposer
       sends a best-effort abort (a release of that token) to every voter.

``renew`` extends the expiry at voters still holding exactly ``(token,
holder)`` unexpired; ``release`` clears it there. Both need ``M`` acks.
``show`` is a majority read: the highest-token unexpired lease any of ``M``
replies reports (a majority-granted lease is always seen; a partial one may be).

Why tokens never go backwards: a grant's token was accepted by a majority;
any later prepare reads a majority, which intersects it, so it sees at least
that token and proposes a larger one. Two proposers racing with the same
token cannot both win: a voter accepts a given token at most once, and two
majorities intersect. Why two holders never overlap: a new grant needs a
voter in the previous grant's (or last renewal's) majority to see that lease
expired on its clock, i.e. ``ttl_ms`` after it accepted, which is after the
holder sent its request; the holder believes the lease only until
``invoke + ttl_ms * (1 - drift) - margin`` on *its* clock. So clocks need not
be synchronised: safety assumes only that clock *rates* differ by less than
the drift ratio (1 % in :mod:`hivemesh.leases`), and that process pauses are
caught by fencing tokens.

Outcomes: ``ok``; ``fail`` (not done; ``partial`` marks a failed acquire or
renew that some voter may have applied -- it is not granted, but those voters
may refuse others until it expires or the abort sent for it lands -- and a
release that some voters applied);
``unknown`` when the deadline passes first (a lossy network, a partition,
crashed voters).

The voter's side -- its slot table, what it keeps on disk and the *token
reserve* that spares most acquires a disk sync -- is
:mod:`hivemesh.core.lease_voter`; :class:`Voter` is re-exported here.

Shape (aioquic-style): ``Voter.receive(msg, now_ms) -> reply``;
``Proposer.start(op, now_ms) -> rid``, ``Proposer.receive(voter, msg,
now_ms)``, ``Proposer.outbox()``, ``Proposer.events()``,
``Proposer.next_deadline()``, ``Proposer.handle_timer(now_ms)``. Messages are
plain lists of ints and strs (msgpack-able). No I/O, clock or randomness here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from hivemesh.core.lease_voter import ACCEPT, PREPARE, RELEASE, RENEW, Voter
from hivemesh.core.lease_voter import REPLY as _REPLY
from hivemesh.core.lease_voter import check_int as _int
from hivemesh.core.lease_voter import check_str as _str
from hivemesh.errors import BackendUnavailable, DecodeError, InvalidArgument

__all__ = [
    "Acquire",
    "Outcome",
    "Proposer",
    "Release",
    "Renew",
    "Show",
    "Voter",
]

Status = Literal["ok", "fail", "unknown"]


# -- proposer -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acquire:
    """Acquire ``resource`` for ``holder`` for ``ttl_ms``."""

    resource: str
    holder: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend the lease ``(resource, holder, token)`` to ``ttl_ms`` from now."""

    resource: str
    holder: str
    token: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    """Release the lease ``(resource, holder, token)``."""

    resource: str
    holder: str
    token: int


@dataclass(frozen=True, slots=True)
class Show:
    """Read who holds ``resource`` (a majority read; changes nothing)."""

    resource: str


Op = Acquire | Renew | Release | Show


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of one operation started with :meth:`Proposer.start`."""

    rid: int
    op: Op
    status: Status
    token: int | None
    started_ms: int
    finished_ms: int
    partial: bool = False
    holder: str = ""  # Show: the holder seen ("" if free)
    remaining_ms: int = 0  # Show: its smallest remaining time among the replies


@dataclass(frozen=True, slots=True)
class _Reply:
    ok: bool = False  # accept/renew/release verdict
    max_token: int = 0  # prepare: the voter's highest token
    holder: str = ""  # prepare: live holder ("" free, "?" quarantined)
    remaining_ms: int = 0  # prepare: the live lease's remaining time
    token: int = 0  # prepare: the live lease's token


@dataclass
class _Pending:
    rid: int
    op: Op
    phase: str
    started_ms: int
    deadline_ms: int
    retransmit_at_ms: int
    replies: dict[str, _Reply] = field(default_factory=dict)
    token: int | None = None
    internal: bool = False
    attempt: str = ""  # an abort: release only this acquire attempt's grant
    orig: int = 0  # the caller's rid when a fast acquire fell back (rid is new then)
    fast: bool = False  # a fast acquire: accept without prepare, any refusal falls back
    asked_all_ms: int | None = None  # when every voter had been asked in this phase


class Proposer:
    """Runs lease operations against a fixed set of voters. One per node is enough."""

    def __init__(
        self,
        voters: Sequence[str],
        *,
        timeout_ms: int = 1000,
        retransmit_ms: int = 50,
        max_pending: int = 10_000,
        proposer_id: str = "",
        fanout: int = 0,
        fast_acquire: bool = False,
    ) -> None:
        ids = sorted(set(voters))
        if not ids or len(ids) != len(voters):
            raise InvalidArgument("voters must be a non-empty list of distinct ids")
        if timeout_ms <= 0 or retransmit_ms <= 0:
            raise InvalidArgument("timeout_ms and retransmit_ms must be positive")
        self.voters = ids
        self.majority = len(ids) // 2 + 1
        self.timeout_ms = timeout_ms
        self.retransmit_ms = retransmit_ms
        self.max_pending = max_pending
        #: unique per proposer (a node id, or random): names acquire attempts and
        #: requests so an abort can never release another attempt's grant
        self.proposer_id = _str(proposer_id, 128)
        #: voters contacted first in each phase (0: all). Thrifty mode: with
        #: ``fanout = majority`` only a majority is asked; silent voters and
        #: the rest are asked at the first retransmission. Fewer messages, same
        #: safety (decisions still need a majority of replies).
        self.fanout = fanout if 0 < fanout < len(ids) else 0
        self._preferred: list[str] = list(ids)
        #: Fast acquire: when this proposer knows a resource's highest token
        #: (it ran operations on it), an acquire goes straight to the accept
        #: phase with ``known + 1``. Safe by the voters' own checks (free on
        #: their clock, token above their max, a majority); the prepare phase
        #: only picks a token. Any refusal: abort this attempt, fall back to
        #: prepare + accept under a new request id.
        self.fast_acquire = fast_acquire
        self._known: dict[str, int] = {}
        self._alias: dict[int, int] = {}
        self._next_rid = 1
        self._pending: dict[int, _Pending] = {}
        self._outbox: list[tuple[str, list[object]]] = []
        self._events: list[Outcome] = []
        #: counts of stale/duplicate/malformed replies, by name
        self.counters: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # -- inputs -----------------------------------------------------------------

    def prefer(self, order: Sequence[str]) -> None:
        """Voters to contact first in thrifty mode (e.g. self, then live peers).

        Unknown ids are ignored; voters not named keep their sorted order after.
        """
        named = [v for v in order if v in self.voters]
        self._preferred = list(dict.fromkeys(named + self.voters))

    def start(self, op: Op, now_ms: int, *, timeout_ms: int | None = None) -> int:
        """Begin ``op``; returns its request id (echoed in its Outcome).

        ``timeout_ms`` (default: the proposer's) is this operation's deadline:
        pass the caller's own deadline so the protocol gives up when the caller
        does, and nothing it does lands after the caller saw "unknown".
        Raises BackendUnavailable when ``max_pending`` operations are already
        in flight (backpressure: the queue of operations is bounded).
        """
        if len(self._pending) >= self.max_pending:
            self._count("overloaded")
            raise BackendUnavailable(f"{len(self._pending)} lease operations already in flight")
        rid = self._next_rid
        self._next_rid += 1
        phase = {Acquire: PREPARE, Show: PREPARE, Renew: RENEW, Release: RELEASE}[type(op)]
        deadline = now_ms + (self.timeout_ms if timeout_ms is None else max(1, timeout_ms))
        p = _Pending(rid, op, phase, now_ms, deadline, now_ms)
        if isinstance(op, Renew | Release):
            p.token = op.token
        elif isinstance(op, Acquire) and self.fast_acquire and op.resource in self._known:
            p.phase, p.fast, p.token = ACCEPT, True, self._known[op.resource] + 1
            self._count("fast_acquire")
        self._pending[rid] = p
        self._send_phase(p, now_ms)
        return rid

    def cancel(self, rid: int, now_ms: int) -> None:
        """Give up on ``rid`` now (its caller stopped waiting): no Outcome is emitted.

        A cancelled acquire that had reached its accept phase is aborted (a
        best-effort release of its token), like one that timed out.
        """
        p = self._pending.get(self._alias.pop(rid, rid))
        if p is None or p.internal:
            return
        del self._pending[p.rid]
        if p.phase == ACCEPT:
            self._abort(p, now_ms)

    def receive(self, voter: str, msg: Sequence[object], now_ms: int) -> None:
        """Handle a voter's reply. Raises DecodeError on garbage; ignores stale replies."""
        if not isinstance(msg, list | tuple) or len(msg) < 3:
            raise DecodeError("lease reply must be a list [kind, rid, ...]")
        kind, rid = msg[0], _int(msg[1])
        if voter not in self.voters:
            self._count("unknown_voter")
            return
        p = self._pending.get(rid)
        if p is None or kind != _REPLY[p.phase]:
            self._count("stale_reply")
            return
        if kind == _REPLY[PREPARE]:
            if len(msg) < 6:
                raise DecodeError("prepare reply too short")
            reply = _Reply(False, _int(msg[2]), _str(msg[3]), _int(msg[4]), _int(msg[5]))
        else:
            if not isinstance(msg[2], bool):
                raise DecodeError("reply verdict must be a bool")
            reply = _Reply(ok=msg[2])
        if voter in p.replies:
            self._count("duplicate_reply")
            return
        p.replies[voter] = reply
        self._advance(p, now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Retransmit to silent voters; end operations whose deadline passed."""
        for rid in sorted(self._pending):
            p = self._pending[rid]
            if now_ms >= p.deadline_ms:
                self._finish(p, "unknown", now_ms)
                if p.phase == ACCEPT:
                    self._abort(p, now_ms)
            elif now_ms >= p.retransmit_at_ms:
                if self._held_at_a_majority(p, now_ms):
                    self._finish(p, "fail", now_ms)
                    self._count("prepare_held_early")
                    continue
                self._send_phase(p, now_ms, only_silent=True)

    # -- outputs ----------------------------------------------------------------

    def outbox(self) -> list[tuple[str, list[object]]]:
        """Messages to send, as ``(voter_id, message)``; clears the outbox."""
        out, self._outbox = self._outbox, []
        return out

    def events(self) -> list[Outcome]:
        """Finished operations since the last call; clears them."""
        out, self._events = self._events, []
        return out

    def next_deadline(self) -> int | None:
        """When to call :meth:`handle_timer` next (None: nothing pending)."""
        if not self._pending:
            return None
        return min(min(p.retransmit_at_ms, p.deadline_ms) for p in self._pending.values())

    def pending(self) -> int:
        """Operations in flight (including internal aborts)."""
        return len(self._pending)

    # -- internals --------------------------------------------------------------

    def _message(self, p: _Pending) -> list[object]:
        op = p.op
        if p.phase == PREPARE:
            return [PREPARE, p.rid, op.resource]
        if p.phase == ACCEPT:
            assert isinstance(op, Acquire) and p.token is not None
            attempt = f"{self.proposer_id}/{p.rid}"
            return [ACCEPT, p.rid, op.resource, p.token, op.holder, op.ttl_ms, attempt]
        if p.phase == RENEW:
            assert isinstance(op, Renew)
            return [RENEW, p.rid, op.resource, op.token, op.holder, op.ttl_ms]
        assert isinstance(op, Release) and p.token is not None
        req = f"{self.proposer_id}/{p.rid}"
        return [RELEASE, p.rid, op.resource, p.token, op.holder, req, p.attempt]

    def _send_phase(self, p: _Pending, now_ms: int, only_silent: bool = False) -> None:
        msg = self._message(p)
        targets = self.voters
        if self.fanout and not only_silent:
            targets = self._preferred[: self.fanout]
        for v in targets:
            if not (only_silent and v in p.replies):
                self._outbox.append((v, list(msg)))
        if p.asked_all_ms is None and targets is self.voters:
            p.asked_all_ms = now_ms
        p.retransmit_at_ms = now_ms + self.retransmit_ms

    def _held_at_a_majority(self, p: _Pending, now_ms: int) -> bool:
        """A prepare answered by a majority, some "held", no free majority,
        and the silent voters had a full retransmission interval after being
        asked: stop waiting for them (see module docs)."""
        if p.phase != PREPARE or not isinstance(p.op, Acquire) or p.asked_all_ms is None:
            return False
        if now_ms < p.asked_all_ms + self.retransmit_ms or len(p.replies) < self.majority:
            return False
        # Only when a free majority needs every silent voter free: with more
        # free ones within reach (a stale grant at a minority, replies lost),
        # keep asking (the simulator's seed 1410 of ``--campaign ci``).
        free = sum(1 for r in p.replies.values() if r.holder == "")
        silent = len(self.voters) - len(p.replies)
        if free + silent > self.majority:
            return False
        return any(r.holder != "" for r in p.replies.values())

    def _finish(
        self,
        p: _Pending,
        status: Status,
        now_ms: int,
        partial: bool = False,
        holder: str = "",
        remaining_ms: int = 0,
    ) -> None:
        del self._pending[p.rid]
        self._alias.pop(p.orig, None)
        if not p.internal:
            token = p.token if status == "ok" or isinstance(p.op, Renew | Release) else None
            if token is not None and status == "ok":
                self._learn(p.op.resource, token)
            self._events.append(
                Outcome(
                    p.orig or p.rid,
                    p.op,
                    status,
                    token,
                    p.started_ms,
                    now_ms,
                    partial,
                    holder,
                    remaining_ms,
                )
            )

    def _learn(self, resource: str, token: int) -> None:
        if not self.fast_acquire:
            return
        if resource not in self._known and len(self._known) >= self.max_pending:
            self._known.clear()  # bounded: forget, the next acquire just prepares
        self._known[resource] = max(self._known.get(resource, 0), token)

    def _fall_back(self, p: _Pending, now_ms: int) -> None:
        """A fast acquire was refused somewhere: abort it, run prepare + accept."""
        self._count("fast_fallback")
        self._abort(p, now_ms)  # names the fast attempt (old rid): only its grants
        del self._pending[p.rid]
        self._known.pop(p.op.resource, None)
        rid = self._next_rid
        self._next_rid += 1
        p.orig = p.orig or p.rid
        p.rid, p.phase, p.fast, p.token, p.replies = rid, PREPARE, False, None, {}
        p.asked_all_ms = None
        self._pending[rid] = p
        self._alias[p.orig] = rid
        self._send_phase(p, now_ms)

    def _abort(self, p: _Pending, now_ms: int) -> None:
        """Best effort: clear a failed acquire's partial acceptances."""
        assert isinstance(p.op, Acquire) and p.token is not None
        rid = self._next_rid
        self._next_rid += 1
        a = _Pending(
            rid,
            Release(p.op.resource, p.op.holder, p.token),
            RELEASE,
            now_ms,
            now_ms + self.timeout_ms,
            now_ms,
            token=p.token,
            internal=True,
            attempt=f"{self.proposer_id}/{p.rid}",
        )
        self._pending[rid] = a
        self._send_phase(a, now_ms)

    def _advance(self, p: _Pending, now_ms: int) -> None:
        n, m = len(self.voters), self.majority
        if isinstance(p.op, Show):
            if len(p.replies) >= m:
                seen = [r for r in p.replies.values() if r.holder not in ("", "?")]
                if not seen:
                    self._finish(p, "ok", now_ms)
                    return
                top = max(seen, key=lambda r: r.token)
                left = min(
                    r.remaining_ms for r in seen if (r.token, r.holder) == (top.token, top.holder)
                )
                p.token = top.token
                self._finish(p, "ok", now_ms, holder=top.holder, remaining_ms=left)
            return
        if p.phase == PREPARE:
            free = [r for r in p.replies.values() if r.holder == ""]
            held = len(p.replies) - len(free)
            if held > n - m:
                self._finish(p, "fail", now_ms)
            elif len(free) >= m:
                p.token = max(r.max_token for r in p.replies.values()) + 1
                self._learn(p.op.resource, p.token - 1)
                p.phase = ACCEPT
                p.replies, p.asked_all_ms = {}, None
                self._send_phase(p, now_ms)
            return
        yes = sum(1 for r in p.replies.values() if r.ok)
        no = len(p.replies) - yes
        if p.internal:
            if len(p.replies) == n:
                self._finish(p, "ok", now_ms)
        elif p.fast and no > 0 and yes < m:
            self._fall_back(p, now_ms)
        elif yes >= m:
            self._finish(p, "ok", now_ms)
        elif no > n - m:
            # A write some voter may have applied (it acked, or has not answered
            # yet) is a *partial* failure: it may hold the resource until expiry.
            # A release that some voters applied is partial too (a takeover can
            # race the release's retransmissions to the others).
            partial = yes > 0 or (p.phase in (ACCEPT, RENEW) and len(p.replies) < n)
            self._finish(p, "fail", now_ms, partial=partial)
            if p.phase == ACCEPT and partial:
                self._abort(p, now_ms)
