"""A node's own feed: the durable mark and the write gate.

Theory of operation
-------------------
A node must never sign two different events at one seq of its own feed:
a peer that holds one counts the other as a fork and refuses everything the
node writes after it. The feed lives in the store, and a store can be
deleted, restored from an older copy or lose its last batches (a damaged
append log). A node that appended from there would fork, while its own
writes looked fine locally.

**The mark.** A small durable record kept apart from the store (beside the
key, :mod:`hivemesh.stores.feedmark`): the ``(seq, hash)`` of the newest own
event that was acknowledged to a caller or may have left the node. The node
saves it after an own batch is stored and *before* that batch is
acknowledged or pushed, and never serves an own event above it (a batch
that was neither -- an own observation while no peer was there -- is marked
when a peer first asks for it). So the mark is at or above every
acknowledged write and everything any peer holds of the feed; a crash
between storing and saving leaves the store ahead of the mark, which is
harmless (nothing above the mark left the node or was acknowledged). The
cost is one small write per sealed batch.

**The gate** (:class:`OwnFeedGate`) decides from its inputs -- the stored own
head, the mark, what peers report in their HAVE vectors and serve -- whether
the node may append. The rules, checked in this order:

=======================================================  ==============
the node's situation                                     state
=======================================================  ==============
a different, validly signed history of the feed exists   ``diverged``
(the store's event at the mark's seq is not the marked
one; a peer served our signature over other events)
no mark (its file and the store are gone): not one peer  ``recovering``
has said yet how much of the feed it holds
the store holds less than the mark                       ``recovering``
a peer reports more of the feed than the store holds     ``recovering``
(a data dir restored whole, mark included)
otherwise                                                ``writable``
=======================================================  ==============

While ``diverged`` nothing of the feed is served and an operator decides.
While ``recovering``, the node pulls its own feed like any other (the
replication protocol's HAVE/WANT, verified batch by batch) and appends
raise :class:`~hivemesh.errors.FeedRecovering` saying why; once the store
holds the feed up to the target it is ``writable`` again at once, the mark
is moved up to what was recovered, and the writer continues from there.
A claim stands until the claimant proves it by serving the events; a peer
that only claims (a liar) keeps the node recovering, visibly (the status
names the target and the reason), until an operator revokes it or accepts.

**The operator's way out** (:meth:`OwnFeedGate.accept_loss`, ``hivemesh
feed accept-loss``) when no reachable peer can supply the missing part:
the mark is reset to what the store holds and the node writes from there.
The lost seqs will be written again with other events: a peer that still
holds the lost events (offline now) will count a fork and refuse the node's
events from that seq on. The mark remembers the accepted range, so a peer
later found holding that other history is expected (counted
``own_feed_conflict_accepted``, its claims ignored, the feed no longer
pulled from it) rather than a new fault.

A node whose mark was never recorded (an older data dir) gets one from its
store (see :func:`hivemesh.stores.feedmark.open_mark`); a fresh key starts
with mark 0.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from typing import Any, NamedTuple, Protocol

from hivemesh.core.event import GENESIS, Event
from hivemesh.core.feed import Head
from hivemesh.errors import FeedDiverged, FeedRecovering, InvalidArgument, StoreError

__all__ = ["FeedState", "Mark", "MarkStore", "MemoryMarkStore", "OwnFeedGate"]

_HINT = (
    "writes are refused until then; if no peer can supply it, "
    "`hivemesh feed accept-loss` writes on from #{next} (a peer that still holds "
    "the lost events will then see a fork)"
)


class Mark(NamedTuple):
    """The durable high-water mark of a node's own feed (a tuple: one is
    made per sealed batch, so it must be cheap).

    ``seq``/``hash``: the newest own event that may have left the node.
    ``accepted_from``..``accepted_upto``: seqs whose loss an operator
    accepted (0 when never): another history there is expected.
    """

    seq: int = 0
    hash: bytes = GENESIS
    accepted_from: int = 0
    accepted_upto: int = 0


class MarkStore(Protocol):
    """Where the mark is kept (a file beside the key; memory in the simulator)."""

    def load(self) -> Mark | None:
        """The saved mark, or None when there is no usable one."""

    def save(self, mark: Mark) -> None:
        """Replace the mark; durable on return (as the store's appends are)."""


class MemoryMarkStore:
    """A :class:`MarkStore` in memory (tests; the simulator keeps it across a
    crash, like the disk)."""

    def __init__(self, mark: Mark | None = None) -> None:
        self.mark = mark
        self.saves = 0

    def load(self) -> Mark | None:
        """See :meth:`MarkStore.load`."""
        return self.mark

    def save(self, mark: Mark) -> None:
        """See :meth:`MarkStore.save`."""
        self.mark = mark
        self.saves += 1


class FeedState(Enum):
    """Whether a node may append to its own feed (module docs)."""

    WRITABLE = "writable"
    RECOVERING = "recovering"
    DIVERGED = "diverged"


class OwnFeedGate:
    """The write gate of one node's own feed (see the module docs).

    ``held`` is the stored own head and ``held_at_mark`` the hash of the
    stored own event at the mark's seq (None if the store does not reach it).
    Counters go to ``counters`` (the node's).
    """

    def __init__(
        self,
        marks: MarkStore,
        held: Head,
        held_at_mark: bytes | None,
        counters: Counter[str],
    ) -> None:
        self.marks = marks
        self.held = held
        self.counters = counters
        self.mark = marks.load()
        self._heard = False  # a peer reported how much of the feed it holds
        self._claimed = 0  # the most of the feed a peer reported holding
        self._claimant = ""
        self._conflicting: set[str] = set()  # peers holding another history
        self._diverged = ""
        self._diverged_from = 0
        mark = self.mark
        if mark is None:
            return
        if mark.seq and held.seq >= mark.seq and held_at_mark != mark.hash:
            self._diverge(
                f"the store holds a different event at #{mark.seq} than the one this "
                "node signed and may have sent (a store of another lineage)",
                1,
            )
        elif held.seq > mark.seq:  # stored, then crashed before the mark: never sent
            self._save(held)

    # -- state -------------------------------------------------------------------

    @property
    def state(self) -> FeedState:
        """The current :class:`FeedState`."""
        if self._diverged:
            return FeedState.DIVERGED
        target = self.target
        if target is None or self.held.seq < target:
            return FeedState.RECOVERING
        return FeedState.WRITABLE

    @property
    def writable(self) -> bool:
        """True when appends are allowed."""
        return self.state is FeedState.WRITABLE

    @property
    def target(self) -> int | None:
        """The seq the store must hold before the node writes (None: unknown
        until a peer reports)."""
        if self.mark is None and not self._heard:
            return None
        return max(self.mark.seq if self.mark else 0, self._claimed)

    @property
    def sendable(self) -> int:
        """The highest own seq that may leave the node: the mark, and nothing
        while the feed is diverged (one history must not spread further)."""
        if self._diverged:
            return 0
        return self.held.seq if self.mark is None else min(self.held.seq, self.mark.seq)

    def reason(self) -> str:
        """Why the node does not write (empty when it does), with what to do."""
        held, target, nxt = self.held.seq, self.target, self.held.seq + 1
        if self._diverged:
            return (
                f"own feed diverged: {self._diverged}; writes are refused: check which copy "
                "is right, then `hivemesh feed accept-loss` writes on from the store's "
                f"#{nxt} (peers holding the other history will see a fork)"
            )
        if target is None:
            why = (
                "own feed unknown: this node has no mark of how far its feed went (mark "
                f"and store gone?); the store holds #{held}: waiting for a peer to report "
                "how much of it it holds"
            )
        elif self.mark is not None and held < self.mark.seq:
            why = (
                f"own feed behind its mark: the store holds #{held}, but #{self.mark.seq} "
                "was written and may have been sent (store deleted, restored from an older "
                f"copy or damaged): recovering #{nxt}..#{target} from peers"
            )
        elif held < target:
            why = (
                f"own feed behind a peer: {self._claimant[:12]} reports #{target} of it, "
                f"the store holds #{held} (data dir restored whole?): recovering "
                f"#{nxt}..#{target} from peers"
            )
        else:
            return ""
        return f"{why}; {_HINT.format(next=nxt)}"

    def check(self) -> None:
        """Raise :class:`~hivemesh.errors.FeedRecovering` or
        :class:`~hivemesh.errors.FeedDiverged` unless the node may append."""
        mark, held = self.mark, self.held.seq  # the common case first: on every append
        if mark is not None and held >= mark.seq and held >= self._claimed and not self._diverged:
            return
        state = self.state
        if state is FeedState.WRITABLE:
            return
        if state is FeedState.DIVERGED:
            raise FeedDiverged(self.reason())
        raise FeedRecovering(self.reason())

    def status(self) -> dict[str, Any]:
        """What ``hivemesh status`` shows under ``own_feed``."""
        mark = self.mark
        return {
            "state": self.state.value,
            "held": self.held.seq,
            "mark": None if mark is None else mark.seq,
            "target": self.target,
            "reason": self.reason(),
            "accepted_loss": (
                None
                if mark is None or not mark.accepted_from
                else {"from": mark.accepted_from, "upto": mark.accepted_upto}
            ),
        }

    # -- inputs ------------------------------------------------------------------

    def stored(self, head: Head, *, mark: bool) -> None:
        """Our own batch up to ``head`` is stored. ``mark``: it is about to be
        acknowledged or sent, so save the mark first (raises what the mark
        store raises). An unmarked batch (an own observation, no peer to
        send it to) is marked when it is first served (:meth:`sending`)."""
        self.held = head
        if mark:
            self._save(head)

    def sending(self, seq: int) -> int:
        """A peer asks for our feed up to ``seq``: the highest seq that may
        be served, after moving the mark up to cover it (only up to the old
        mark if it cannot be saved; counted ``own_mark_failed``)."""
        if self.mark is not None and self.mark.seq < min(seq, self.held.seq) and self.writable:
            try:
                self._save(self.held)
            except StoreError:  # serve what the old mark covers
                self.counters["own_mark_failed"] += 1
        return self.sendable

    def report(self, peer: str, seq: int) -> bool:
        """``peer`` holds our feed up to ``seq`` (its HAVE). Returns False when
        the node should not pull its feed from ``peer`` (it served another
        history of it)."""
        if peer in self._conflicting:
            return False
        mark = self.mark
        if mark is not None and mark.accepted_from <= seq <= mark.accepted_upto:
            return True  # a seq whose loss was accepted: no news
        self._heard = True
        if seq > max(self.held.seq, self._claimed, mark.seq if mark else 0):
            self._claimed, self._claimant = seq, peer
        return True

    def recovered(self, events: list[Event]) -> bool:
        """Own ``events`` were pulled from a peer, verified and stored.
        Returns True if that made the node writable."""
        was = self.writable
        last = events[-1]
        self.held = Head(last.seq, last.id)
        mark = self.mark
        if (
            mark is not None
            and mark.seq
            and events[0].seq <= mark.seq <= last.seq
            and events[mark.seq - events[0].seq].id != mark.hash
        ):
            self._diverge(
                f"peers hold a different event at #{mark.seq} than the one this "
                "node's mark records (two copies of this key wrote?)",
                mark.seq,
            )
        if self._claimed <= self.held.seq:
            self._claimed, self._claimant = 0, ""
        now = self.writable
        if now and (mark is None or self.held.seq > mark.seq):
            self._save(self.held)  # recovered events have left the node: mark them
        return now and not was

    def conflict(self, peer: str, seq: int) -> None:
        """``peer`` served a batch validly signed by us that disagrees with our
        feed at ``seq``: our key signed two histories."""
        if peer in self._conflicting:
            return  # known already (and no longer asked for our feed)
        self._conflicting.add(peer)
        if self._claimant == peer:
            self._claimed, self._claimant = 0, ""
        mark = self.mark
        if mark is not None and mark.accepted_from and seq >= mark.accepted_from:
            self.counters["own_feed_conflict_accepted"] += 1
            return
        self.counters["own_feed_conflict"] += 1
        self._diverge(
            f"{peer[:12]} holds a different history of this feed, signed by this "
            f"node's key, from #{seq} at the latest (the feed was forked)",
            seq,
        )

    def accept_loss(self) -> dict[str, Any]:
        """The operator gives up on what the store lacks: write on from the
        store's head (module docs). Returns what was given up; raises
        :class:`~hivemesh.errors.InvalidArgument` when the feed is writable
        (there is nothing to give up)."""
        if self.writable:
            raise InvalidArgument("the own feed is writable: there is no loss to accept")
        held = self.held
        mark = self.mark
        lost_upto = max(held.seq, self._claimed, mark.seq if mark else 0)
        first = held.seq + 1  # the other history starts here, or where it was seen
        if self._diverged:
            first = min(first, self._diverged_from)
        new = Mark(held.seq, held.hash, first, max(lost_upto, first))
        self.marks.save(new)  # may raise: then nothing changed
        self.mark = new
        self._diverged, self._diverged_from = "", 0
        self._claimed, self._claimant = 0, ""
        self._heard = True
        self.counters["own_feed_loss_accepted"] += 1
        return {"held": held.seq, "lost_from": first, "lost_upto": lost_upto}

    # -- helpers -------------------------------------------------------------------

    def _save(self, head: Head) -> None:
        old = self.mark
        if old is None:
            mark = Mark(head.seq, head.hash)
        else:
            mark = Mark(head.seq, head.hash, old.accepted_from, old.accepted_upto)
        self.marks.save(mark)  # first: a mark that failed to save never counts
        self.mark = mark

    def _diverge(self, why: str, seq: int) -> None:
        if not self._diverged:
            self._diverged, self._diverged_from = why, seq
