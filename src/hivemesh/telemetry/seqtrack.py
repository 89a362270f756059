"""Per-sender sequence tracking: de-duplication and gap reporting.

Theory of operation
-------------------
Every sender numbers its records 1, 2, 3... (see :mod:`.spool`). The collector
keeps, per sender, the set of sequence numbers it has *stored* as a sorted
list of closed, disjoint, non-adjacent ranges ``[(lo, hi), ...]``. Senders
deliver in order, so in steady state the list is one range ``[(1, n)]`` and
each new batch extends it; it grows only where records were truly lost.

* A record whose ``seq`` is already covered is a duplicate (a retransmission
  after a lost ack, a restarted sender): dropped, counted.
* :meth:`SeqTracker.gaps` lists the holes below the highest stored seq. A
  sender sends in order and only advances after an ack, so a hole below a
  stored seq means the records are gone (a deleted spool, a dropped record
  at a full spool): a *true loss*, reported, never silent.
* :meth:`SeqTracker.pending` is the range between the highest stored seq and
  the highest seq the sender announced (``hi``): records still waiting in the
  sender's spool, not lost (yet).

Pure and deterministic: no I/O, no clock. The state serialises to a small
JSON-able dict so the collector persists it in the same transaction as the
rows it describes.
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["SeqTracker"]


class SeqTracker:
    """The set of stored sequence numbers of one sender, as ranges."""

    __slots__ = ("_his", "_los", "announced_hi")

    def __init__(self) -> None:
        self._los: list[int] = []
        self._his: list[int] = []
        #: Highest seq the sender said it has assigned (0 if never said).
        self.announced_hi = 0

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self._los, seq) - 1
        return i >= 0 and seq <= self._his[i]

    @property
    def max_seq(self) -> int:
        """Highest stored seq (0 when none)."""
        return self._his[-1] if self._his else 0

    def add(self, seq: int) -> bool:
        """Mark ``seq`` stored; False if it already was (a duplicate)."""
        his, los = self._his, self._los
        if his and seq == his[-1] + 1:  # the common case: in-order append
            his[-1] = seq
            return True
        if not his or seq > his[-1] + 1:
            los.append(seq)
            his.append(seq)
            return True
        i = bisect.bisect_right(los, seq) - 1
        if i >= 0 and seq <= his[i]:
            return False
        join_left = i >= 0 and his[i] == seq - 1
        join_right = i + 1 < len(los) and los[i + 1] == seq + 1
        if join_left and join_right:
            his[i] = his[i + 1]
            del los[i + 1], his[i + 1]
        elif join_left:
            his[i] = seq
        elif join_right:
            los[i + 1] = seq
        else:
            los.insert(i + 1, seq)
            his.insert(i + 1, seq)
        return True

    def add_range(self, lo: int, hi: int) -> None:
        """Mark ``lo..hi`` stored; they must all be above :attr:`max_seq`."""
        if lo <= self.max_seq or hi < lo:
            raise ValueError(f"range {lo}..{hi} is not above {self.max_seq}")
        if self._his and lo == self._his[-1] + 1:
            self._his[-1] = hi
        else:
            self._los.append(lo)
            self._his.append(hi)

    def announce(self, hi: int) -> None:
        """Record that the sender has assigned every seq up to ``hi``."""
        self.announced_hi = max(self.announced_hi, hi)

    def gaps(self) -> list[tuple[int, int]]:
        """Missing ranges ``(lo, hi)`` below the highest stored seq: true losses."""
        out: list[tuple[int, int]] = []
        prev = 0
        # strict=False: other threads (a metrics endpoint) may read while the loop appends.
        for lo, hi in zip(self._los, self._his, strict=False):
            if lo > prev + 1:
                out.append((prev + 1, lo - 1))
            prev = hi
        return out

    def missing_count(self) -> int:
        """How many seqs the gaps cover."""
        return sum(hi - lo + 1 for lo, hi in self.gaps())

    def pending(self) -> tuple[int, int] | None:
        """Announced but not yet stored: ``(max_seq + 1, announced_hi)`` or None."""
        if self.announced_hi > self.max_seq:
            return (self.max_seq + 1, self.announced_hi)
        return None

    def stored_count(self) -> int:
        """How many distinct seqs are stored."""
        return sum(hi - lo + 1 for lo, hi in zip(self._los, self._his, strict=False))

    def to_state(self) -> dict[str, Any]:
        """A JSON-able snapshot (see :meth:`from_state`)."""
        return {
            "ranges": [[lo, hi] for lo, hi in zip(self._los, self._his, strict=True)],
            "hi": self.announced_hi,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SeqTracker:
        """Rebuild a tracker from :meth:`to_state` output."""
        t = cls()
        for lo, hi in state.get("ranges", []):
            t._los.append(int(lo))
            t._his.append(int(hi))
        t.announced_hi = int(state.get("hi", 0))
        return t
