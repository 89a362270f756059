"""An in-process journal for running planner roles without the node runtime.

:class:`LocalJournal` holds one shared, ordered list of real encoded events
(:func:`~hivemesh.core.event.encode_event`, hash-chained per author, HLC
stamped) and feeds every registered view. It is what the in-process swarm,
the tests and ``hivemesh bench plan`` use; the networked runtime replaces it
with the replicated journal, and roles do not notice the difference: they
only read a :class:`~hivemesh.core.plan.PlanView` and return events to append.

Clocks are injected (``clock_ms``), so tests can drive time by hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

from hivemesh.core.event import GENESIS, Event, encode_event
from hivemesh.core.hlc import HLC

__all__ = ["FeedWriter", "LocalJournal", "author_key"]


class _View(Protocol):
    def apply(self, event: Event) -> None: ...


def author_key(name: str) -> bytes:
    """A stable 32-byte author id for a named test/bench node (not a real key)."""
    return hashlib.blake2b(name.encode(), digest_size=32).digest()


class FeedWriter:
    """One author's feed head: assigns seq, prev hash and HLC to new events."""

    def __init__(self, author: bytes) -> None:
        self.author = author
        self.seq = 0
        self.prev = GENESIS
        self.clock = HLC()

    def observe(self, hlc: int, now_ms: int) -> None:
        """Advance this author's clock past a timestamp it has seen."""
        self.clock.observe(hlc, now_ms)

    def make(self, kind: str, body: Any, now_ms: int, *, hlc: int | None = None) -> Event:
        """Encode the next event of this feed (``hlc`` overrides the clock)."""
        stamp = self.clock.tick(now_ms) if hlc is None else hlc
        ev = encode_event(self.author, self.seq + 1, self.prev, stamp, kind, body)
        self.seq += 1
        self.prev = ev.id
        return ev


class LocalJournal:
    """A shared list of events fed to every view as they are appended."""

    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self.clock_ms = clock_ms
        self.events: list[Event] = []
        self._writers: dict[bytes, FeedWriter] = {}
        self._views: list[_View] = []

    def add_view(self, view: _View) -> None:
        """Register ``view`` and replay every event so far into it."""
        self._views.append(view)
        for ev in self.events:
            view.apply(ev)

    def writer(self, author: bytes) -> FeedWriter:
        """The feed writer of ``author`` (created on first use)."""
        w = self._writers.get(author)
        if w is None:
            w = self._writers[author] = FeedWriter(author)
        return w

    def append(self, author: bytes, kind: str, body: Any) -> Event:
        """Append one event by ``author`` and apply it to every view."""
        now = self.clock_ms()
        w = self.writer(author)
        if self.events:
            w.observe(self.events[-1].hlc, now)
        ev = w.make(kind, body, now)
        self.events.append(ev)
        for v in self._views:
            v.apply(ev)
        return ev
