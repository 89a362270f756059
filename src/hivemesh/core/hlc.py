"""Hybrid logical clock, packed into one integer.

An HLC timestamp is ``wall_ms << 16 | counter``: physical milliseconds in the
high bits, a logical counter in the low 16 bits. Packed this way, the HLC rules
collapse to integer ``max``:

* local event or send:  ``t = max(t + 1, now_ms << 16)``
* receive remote ``r``: ``t = max(t + 1, r + 1, now_ms << 16)``

so timestamps are strictly increasing on each node, exceed every timestamp the
node has seen (causality), and stay close to wall time when clocks are sane.
A counter that overflows 16 bits simply carries into the millisecond field.

Events are ordered by ``(hlc, author)``: a total order every replica agrees on.
"""

from __future__ import annotations

__all__ = ["HLC", "LOGICAL_BITS", "hlc_ms", "make_hlc"]

LOGICAL_BITS = 16

#: A remote timestamp further than this ahead of our wall clock is clamped
#: for the purpose of advancing our clock (it is still stored as sent).
MAX_DRIFT_MS = 60_000


def make_hlc(wall_ms: int, counter: int = 0) -> int:
    """Pack a wall-clock millisecond and a counter into one HLC value."""
    return (wall_ms << LOGICAL_BITS) | counter


def hlc_ms(hlc: int) -> int:
    """The wall-clock milliseconds of an HLC value."""
    return hlc >> LOGICAL_BITS


class HLC:
    """A node's hybrid logical clock. Time is always passed in."""

    __slots__ = ("last",)

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def tick(self, now_ms: int) -> int:
        """Timestamp a local event."""
        t = max(self.last + 1, now_ms << LOGICAL_BITS)
        self.last = t
        return t

    def observe(self, remote: int, now_ms: int) -> int:
        """Advance past a received timestamp (max(local, remote) + 1)."""
        bound = (now_ms + MAX_DRIFT_MS) << LOGICAL_BITS
        t = max(self.last + 1, min(remote, bound) + 1, now_ms << LOGICAL_BITS)
        self.last = t
        return t
