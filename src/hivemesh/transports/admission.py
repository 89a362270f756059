"""Which inbound handshakes may run when too many arrive at once, sans-IO.

Theory of operation
-------------------
A listener runs at most ``max_pending`` handshakes at a time. A connection
costs an attacker almost nothing: one that connects and then says nothing,
or sends half a handshake message, holds a slot until the handshake
deadline. If a full listener simply refused newcomers, a flood of such
connections would keep every legitimate peer out for deadline after
deadline (and the peer's dialler saw only "closed during the handshake").

The rule here instead: a newcomer is always admitted; when that would exceed
the bound, one pending handshake is **evicted**, and told ``busy`` (its
dialler backs off and retries). The victim is the handshake that has waited
longest for its peer -- the oldest *last progress*, where progress is being
accepted or receiving a complete handshake message -- chosen among the
sources (peer IP addresses) that hold the most pending handshakes:

* a connection that says nothing never progresses, so it is the first to go;
* a legitimate peer answers each handshake message within one round trip,
  so it is evicted only if ``max_pending`` newer connections arrive from
  sources at least as heavy as its own within that round trip;
* one flooding host only ever evicts its own connections once it holds more
  than any other source, so it cannot push out other hosts' handshakes.

No newcomer is made to wait behind the flood's deadlines. The object only
decides: the driver (:mod:`hivemesh.transports.tcp`) passes the time in,
closes what it is told to evict and counts it. Keys are any hashable the
driver picks; ``source`` is a string naming the peer's host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from hivemesh.errors import InvalidArgument

__all__ = ["HandshakeAdmission"]


@dataclass(slots=True)
class _Pending:
    source: str
    progress: float
    order: int


class HandshakeAdmission:
    """Admit inbound handshakes up to ``max_pending``, evicting as described above."""

    def __init__(self, max_pending: int) -> None:
        if max_pending < 1:
            raise InvalidArgument("max_pending must be at least 1")
        self.max_pending = max_pending
        self._pending: dict[Hashable, _Pending] = {}
        self._per_source: Counter[str] = Counter()
        self._order = 0
        #: Handshakes evicted so far.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def admit(self, key: Hashable, source: str, now: float) -> Hashable | None:
        """Admit a new handshake; return the key of the one to evict, if any.

        The evicted handshake is already forgotten here: the caller closes it.
        """
        if key in self._pending:
            raise InvalidArgument(f"handshake {key!r} is already pending")
        victim = None
        if len(self._pending) >= self.max_pending:
            victim = self._victim(source)
            self.finish(victim)
            self.evicted += 1
        self._order += 1
        self._pending[key] = _Pending(source, now, self._order)
        self._per_source[source] += 1
        return victim

    def progress(self, key: Hashable, now: float) -> None:
        """A complete handshake message arrived on ``key``."""
        pending = self._pending.get(key)
        if pending is not None:
            pending.progress = now

    def finish(self, key: Hashable) -> None:
        """``key`` is no longer pending (done, failed or evicted); idempotent."""
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        self._per_source[pending.source] -= 1
        if not self._per_source[pending.source]:
            del self._per_source[pending.source]

    def _victim(self, newcomer: str) -> Hashable:
        # The newcomer counts for its own source: a flood's next connection
        # evicts the flood's oldest one even when another source holds as many.
        def weight(source: str) -> int:
            return self._per_source[source] + (source == newcomer)

        heaviest = max(weight(s) for s in self._per_source)
        return min(
            (key for key, p in self._pending.items() if weight(p.source) == heaviest),
            key=lambda k: (self._pending[k].progress, self._pending[k].order),
        )
