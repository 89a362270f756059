"""The dashboard's fan-out: the latest value of each section, and one bounded
queue per browser.

Theory of operation
-------------------
The page is a set of named **sections** (``peers``, ``plan``, ``audit``...),
each a JSON value. :meth:`Hub.publish` stores a section's new value and, if
it changed, puts ``{"section", "data", "version"}`` on every subscriber's
queue. A browser's event stream (:mod:`hivemesh.faces.dashboard.server`)
opens a :class:`Subscriber`, sends the whole :meth:`Hub.snapshot` first and
then the updates as they come.

Every queue is bounded (``queue_max`` updates). A browser that does not keep
up -- its queue is full when an update comes -- is **dropped**: its queue
is emptied, it gets an end marker, its stream closes, and the drop is
counted (``dashboard_client_slow``). The browser reconnects by itself and
starts again from a fresh snapshot, so a slow client costs the hub at most
``queue_max`` updates of memory and never holds up the others. At most
``max_clients`` streams are open at once; one more is refused
(:class:`~hivemesh.errors.PeerBusy`, HTTP 503) and counted.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from hivemesh.errors import PeerBusy
from hivemesh.faces.dashboard.errors import DashboardClientSlow

__all__ = ["Hub", "Subscriber"]


class Subscriber:
    """One browser's stream: a bounded queue of updates (``None`` ends it)."""

    def __init__(self, queue_max: int) -> None:
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(queue_max)
        self.dropped = False

    def offer(self, update: dict[str, Any]) -> bool:
        """Queue ``update``; False (and the stream ends) if the queue is full."""
        if self.dropped:
            return False
        try:
            self.queue.put_nowait(update)
        except asyncio.QueueFull:
            self.dropped = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return False
        return True


class Hub:
    """The sections and their subscribers (see module docs)."""

    def __init__(self, *, queue_max: int = 256, max_clients: int = 32) -> None:
        self.queue_max = queue_max
        self.max_clients = max_clients
        self.sections: dict[str, Any] = {}
        self.versions: dict[str, int] = {}
        self._encoded: dict[str, str] = {}
        self._subs: list[Subscriber] = []
        #: clients opened, dropped as slow, refused; updates published
        self.counters: Counter[str] = Counter()

    def publish(self, section: str, data: Any) -> bool:
        """Set ``section`` to ``data``; True if it changed (then it is sent)."""
        encoded = json.dumps(data, sort_keys=True, default=str)
        if self._encoded.get(section) == encoded:
            return False
        self._encoded[section] = encoded
        self.sections[section] = data
        version = self.versions.get(section, 0) + 1
        self.versions[section] = version
        self.counters["updates"] += 1
        update = {"section": section, "data": data, "version": version}
        for sub in self._subs:
            if not sub.dropped and not sub.offer(update):
                self.counters[DashboardClientSlow.code] += 1
        return True

    def snapshot(self) -> dict[str, Any]:
        """Every section's latest value and version."""
        return {"sections": dict(self.sections), "versions": dict(self.versions)}

    def subscribe(self) -> Subscriber:
        """A new stream; :class:`PeerBusy` when ``max_clients`` are open."""
        if len(self._subs) >= self.max_clients:
            self.counters["clients_refused"] += 1
            raise PeerBusy(f"the dashboard already serves {self.max_clients} live pages")
        sub = Subscriber(self.queue_max)
        self._subs.append(sub)
        self.counters["clients_opened"] += 1
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """The stream ended (the browser left, or was dropped). A dropped
        subscriber keeps its slot until then: a browser that stopped reading
        counts against ``max_clients`` until its stream is closed."""
        if sub in self._subs:
            self._subs.remove(sub)

    @property
    def clients(self) -> int:
        """Streams open now (dropped ones included until they close)."""
        return len(self._subs)
