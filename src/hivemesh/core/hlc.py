"""Hybrid logical clock, packed into one integer.

An HLC timestamp is ``wall_ms << 16 | counter``: physical milliseconds in the
high bits, a logical counter in the low 16 bits. Packed this way, the HLC rules
collapse to integer ``max``:

* local event or send:  ``t = max(t + 1, now_ms << 16)``
* receive remote ``r``: ``t = max(t + 1, r + 1, now_ms << 16)``

so timestamps are strictly increasing on each node, exceed every timestamp the
node has seen (causality; up to the clock bound below), and stay close to
wall time when clocks are sane.
A counter that overflows 16 bits simply carries into the millisecond field.

Events are ordered by ``(hlc, author)``: a total order every replica agrees on.

The clock bound
---------------
A remote timestamp is *plausible* at physical time ``now_ms`` when its
milliseconds are at most ``now_ms + MAX_DRIFT_MS`` (:func:`horizon` is the
largest such HLC). Nothing a peer sends may push our clock past that bound:
:meth:`HLC.observe` clamps to it, the journal defers (never applies early) a
batch that carries a timestamp beyond it (:mod:`hivemesh.core.deferral`), and
:meth:`HLC.restore` -- rehydration from stored events, some of which an older
version may have accepted -- clamps to it too. So a trusted peer that stamps
an event ``2**63 - 1`` cannot stop anyone else from writing.
"""

from __future__ import annotations

__all__ = ["HLC", "LOGICAL_BITS", "MAX_DRIFT_MS", "hlc_ms", "horizon", "make_hlc"]

LOGICAL_BITS = 16

#: The clock bound: how far ahead of our physical clock a peer's timestamp may
#: be. Further ahead, its batch waits until our clock makes it plausible.
MAX_DRIFT_MS = 60_000


def make_hlc(wall_ms: int, counter: int = 0) -> int:
    """Pack a wall-clock millisecond and a counter into one HLC value."""
    return (wall_ms << LOGICAL_BITS) | counter


def hlc_ms(hlc: int) -> int:
    """The wall-clock milliseconds of an HLC value."""
    return hlc >> LOGICAL_BITS


def horizon(now_ms: int) -> int:
    """The largest HLC plausible at physical time ``now_ms`` (the clock bound)."""
    return ((now_ms + MAX_DRIFT_MS + 1) << LOGICAL_BITS) - 1


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
        """Advance past a received timestamp (max(local, remote) + 1), never
        beyond the clock bound."""
        bound = (now_ms + MAX_DRIFT_MS) << LOGICAL_BITS
        t = max(self.last + 1, min(remote, bound) + 1, now_ms << LOGICAL_BITS)
        self.last = t
        return t

    def restore(self, stored: int, now_ms: int) -> None:
        """Advance to a stored timestamp (rehydration), clamped to the clock
        bound: a far-future event held from an older version must not leave
        the clock where no event can follow it."""
        self.last = max(self.last, min(stored, (now_ms + MAX_DRIFT_MS) << LOGICAL_BITS))
