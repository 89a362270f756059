"""The majority barrier's rules (``sync.majority``), sans-IO.

Theory of operation
-------------------
A barrier asks the swarm's lease voters (the Peer's
:meth:`~hivemesh.core.lease_swarm.SwarmLeases.voters`: every proposer uses
the same set, so any two majorities of it intersect) for their journal's
version vector, with the direct request :data:`HEADS_KIND`;
:class:`Barrier` decides everything about the answers:

* an answer counts when it is a version vector (``{author hex: seq}``;
  malformed entries are dropped) and, with ``own_seq``, holds our feed at
  least that far -- otherwise the voter is asked again until the deadline;
* this node counts for itself when it is a voter; the barrier is reached
  once ``len(voters) // 2 + 1`` voters counted (any two majorities of the
  same voter set intersect);
* with ``pull``, the node must then hold every feed as far as the largest
  answer, except its own and those of authors it does not trust (it would
  never accept their events): :meth:`Barrier.missing` lists what it lacks.

A write confirmed by the own-seq half is therefore in the views of any node
after the pull half.

:class:`Majority` is the Peer's part that runs them (``sync.majority``) and
serves :data:`HEADS_KIND`:

* **Serving.** A request ``{}`` is answered at once with
  ``{"vv": {author hex: last seq}}``. One that names a feed and seq
  (``{"a": author_hex, "s": seq, "w": wait_ms}``) is held back until this
  node holds that feed up to ``s``, or ``w`` ms (at most
  :data:`MAX_HOLD_MS`) passed, so "do you have my write yet?" costs one round
  trip, not a polling loop.
* **Asking.** Every other voter is asked at once (with ``own_seq``: naming
  our feed, ``w`` up to a second), under the barrier's remaining time. A
  failed request is asked again :data:`RETRY_MS` later, an answer that does
  not hold ``own_seq`` yet at once, while more than :data:`RETRY_MS` are
  left; a voter that answers without a version vector (a node without the
  handler) is not asked again.
* **Deciding.** No majority by the deadline, or no voter left to ask:
  :class:`~hivemesh.errors.BackendUnavailable`. Reached: the reply, or with
  ``pull`` once nothing is :meth:`Barrier.missing` (checked after every
  input); still missing at the deadline:
  :class:`~hivemesh.errors.DeadlineExceeded`.

No I/O, no clock: the caller passes the time and what it got. Its outputs
are taken with :meth:`Majority.take`: requests to send, held answers to
send, and command replies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hivemesh.commands.sync import SyncMajorityReply
from hivemesh.core.effects import Reply
from hivemesh.errors import BackendUnavailable, DeadlineExceeded, HivemeshError, InvalidArgument

__all__ = ["HEADS_KIND", "MAX_HOLD_MS", "RETRY_MS", "Barrier", "Majority", "author_hex", "clean_vv"]

#: The direct-request kind every node answers with its version vector.
HEADS_KIND = "journal.heads"
#: The longest a node holds a heads answer back for a feed to catch up (ms).
MAX_HOLD_MS = 2000
#: A voter whose request failed is asked again this much later (ms); nobody
#: is asked with less than this left.
RETRY_MS = 50


def author_hex(x: object) -> bool:
    """A feed id as a peer sends it: 64 lowercase hex digits."""
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def clean_vv(answer: Any) -> dict[str, int] | None:
    """The version vector in a ``journal.heads`` answer, malformed entries
    dropped; None when the answer holds none (a node without the handler)."""
    vv = answer.get("vv") if isinstance(answer, dict) else None
    if not isinstance(vv, dict):
        return None
    return {a: s for a, s in vv.items() if author_hex(a) and type(s) is int}


class Barrier:
    """One ``sync.majority`` barrier over ``voters`` (see module docs)."""

    def __init__(self, voters: Iterable[str], me: str, me_hex: str, own_seq: int | None) -> None:
        self.voters = sorted(voters)
        self.majority = len(self.voters) // 2 + 1
        self.me_hex = me_hex
        self.own_seq = own_seq
        self.answered: list[str] = [me] if me in self.voters else []
        self.others = [v for v in self.voters if v != me]
        self.target: dict[str, int] = {}

    def holds_own(self, vv: dict[str, int]) -> bool:
        """Whether ``vv`` satisfies the own-seq half (else ask that voter again)."""
        return self.own_seq is None or vv.get(self.me_hex, 0) >= self.own_seq

    def answer(self, voter: str, vv: dict[str, int]) -> None:
        """``voter`` answered with ``vv``, which :meth:`holds_own`."""
        self.answered.append(voter)
        for a, s in vv.items():
            self.target[a] = max(self.target.get(a, 0), s)

    @property
    def reached(self) -> bool:
        """A majority counted."""
        return len(self.answered) >= self.majority

    def missing(
        self, held: Callable[[str], int], trusted: Callable[[bytes], bool] | None
    ) -> dict[str, int]:
        """Feeds (author hex -> seq) this node holds less of than the majority
        answered (``held(author_hex)`` -> its seq), its own and untrusted ones aside."""
        return {
            a: s
            for a, s in sorted(self.target.items())
            if a != self.me_hex and (trusted is None or trusted(bytes.fromhex(a))) and held(a) < s
        }


@dataclass(slots=True)
class _Held:
    """A heads answer held back until ``author`` reaches ``seq`` or ``until_ms``."""

    author: str
    seq: int
    until_ms: int


@dataclass(slots=True)
class _Run:
    """One ``sync.majority`` command under way."""

    barrier: Barrier
    pull: bool
    until_ms: int
    timeout_s: float
    asking: dict[int, str] = field(default_factory=dict)  # ask id -> voter
    retry: dict[str, int] = field(default_factory=dict)  # voter -> when to ask again


#: ``(ask id, voter, request body, timeout_ms)``: a heads request to send.
Ask = tuple[int, str, dict[str, Any], int]


class Majority:
    """A node's majority barriers and the heads it serves (module docs).

    ``held(author_hex)`` is how far this node holds a feed, ``vv()`` its
    version vector, ``trusted(author)`` whether it accepts an author's events.
    """

    def __init__(
        self,
        me: str,
        me_hex: str,
        held: Callable[[str], int],
        vv: Callable[[], dict[str, int]],
        trusted: Callable[[bytes], bool] | None,
    ) -> None:
        self.me, self.me_hex = me, me_hex
        self._held_seq, self._vv, self._trusted = held, vv, trusted
        self._runs: dict[int, _Run] = {}  # command rid -> its run
        self._holding: dict[int, _Held] = {}  # request key -> held answer
        self._asks: list[Ask] = []
        self._answers: list[tuple[int, dict[str, Any]]] = []
        self._replies: list[Reply] = []
        self._next_ask = 0

    @property
    def busy(self) -> bool:
        """Whether anything waits for an input or the time."""
        return bool(self._runs or self._holding or self._asks or self._answers or self._replies)

    # -- inputs ---------------------------------------------------------------------

    def start(
        self,
        rid: int,
        voters: Iterable[str],
        own_seq: int | None,
        pull: bool,
        timeout_s: float,
        now_ms: int,
    ) -> None:
        """Run a ``sync.majority`` command ``rid`` (its :class:`Reply` comes later)."""
        own = self._held_seq(self.me_hex)
        if own_seq is not None and own_seq > own:
            raise InvalidArgument(f"sync.majority: own_seq {own_seq} is past our feed ({own})")
        b = Barrier(voters, self.me, self.me_hex, own_seq)
        run = self._runs[rid] = _Run(b, pull, now_ms + int(timeout_s * 1000), timeout_s)
        for voter in b.others:
            self._ask(run, voter, now_ms)
        self.tick(now_ms)

    def serve(self, key: int, body: Any, now_ms: int) -> None:
        """Answer heads request ``key`` (module docs, Serving)."""
        if isinstance(body, dict) and author_hex(body.get("a")):
            seq, wait = body.get("s"), body.get("w")
            if isinstance(seq, int) and isinstance(wait, int) and self._held_seq(body["a"]) < seq:
                until = now_ms + min(max(wait, 0), MAX_HOLD_MS)
                self._holding[key] = _Held(body["a"], seq, until)
                return
        self._answers.append((key, {"vv": self._vv()}))

    def replied(self, ask: int, value: Any, failed: bool, now_ms: int) -> bool:
        """The heads request ``ask`` was answered (``value``) or ``failed``;
        False if it is not one of ours."""
        for rid, run in self._runs.items():
            voter = run.asking.pop(ask, None)
            if voter is None:
                continue
            b = run.barrier
            if failed:
                run.retry[voter] = now_ms + RETRY_MS
            elif (vv := clean_vv(value)) is not None:  # None: it cannot answer
                if b.holds_own(vv):
                    b.answer(voter, vv)
                else:
                    self._ask(run, voter, now_ms)
            self._decide(rid, run, now_ms)
            return True
        return ask < 0  # a finished run's late answer

    def tick(self, now_ms: int) -> None:
        """After every input: held answers due, retries due, runs decided."""
        for key in sorted(self._holding):
            h = self._holding[key]
            if self._held_seq(h.author) >= h.seq or h.until_ms <= now_ms:
                del self._holding[key]
                self._answers.append((key, {"vv": self._vv()}))
        for rid in sorted(self._runs):
            run = self._runs[rid]
            for voter, at in sorted(run.retry.items()):
                if at <= now_ms:
                    del run.retry[voter]
                    self._ask(run, voter, now_ms)
            self._decide(rid, run, now_ms)

    # -- outputs --------------------------------------------------------------------

    def take(self) -> tuple[list[Ask], list[tuple[int, dict[str, Any]]], list[Reply]]:
        """Requests to send, heads answers to send (by request key), command replies."""
        out = self._asks, self._answers, self._replies
        self._asks, self._answers, self._replies = [], [], []
        return out

    def next_deadline(self) -> int | None:
        """When :meth:`tick` must run next (None: only inputs matter)."""
        if not self._holding and not self._runs:
            return None
        times = [h.until_ms for h in self._holding.values()]
        for run in self._runs.values():
            times += [run.until_ms, *run.retry.values()]
        return min(times, default=None)

    # -- helpers --------------------------------------------------------------------

    def _ask(self, run: _Run, voter: str, now_ms: int) -> None:
        left = run.until_ms - now_ms
        if left <= RETRY_MS:
            return  # too late to ask: the voter does not count
        b = run.barrier
        body: dict[str, Any] = {}
        if b.own_seq is not None:
            body = {"a": b.me_hex, "s": b.own_seq, "w": min(left - RETRY_MS, 1000)}
        self._next_ask -= 1  # negative: never a command's rid
        run.asking[self._next_ask] = voter
        self._asks.append((self._next_ask, voter, body, left))

    def _decide(self, rid: int, run: _Run, now_ms: int) -> None:
        b = run.barrier
        error: HivemeshError | None = None
        if not b.reached:
            if now_ms < run.until_ms and (run.asking or run.retry):
                return
            error = BackendUnavailable(
                f"sync.majority: {len(b.answered)} of {len(b.voters)} voters answered "
                f"in {run.timeout_s}s (majority {b.majority})"
            )
        elif run.pull and (missing := b.missing(self._held_seq, self._trusted)):
            if now_ms < run.until_ms:
                return
            error = DeadlineExceeded(
                f"sync.majority: {len(missing)} feeds still behind the majority"
            )
        del self._runs[rid]
        if error is not None:
            self._replies.append(Reply(rid, error=error))
            return
        answered = sorted(b.answered)
        reply = SyncMajorityReply(voters=len(b.voters), majority=b.majority, answered=answered)
        self._replies.append(Reply(rid, reply))
