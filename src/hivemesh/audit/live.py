"""An :class:`~hivemesh.audit.view.AuditView` on a running node, with wake-ups.

The audit roles (supervisor, executors, reflector, observer) fold the
journal into one view each and sleep until it changes or a deadline passes;
:class:`LiveView` is that pairing. :meth:`LiveView.wait` never waits longer
than it is told, so every loop built on it is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hivemesh.audit.view import AuditView
from hivemesh.core.event import Event

__all__ = ["LiveView"]


class LiveView:
    """Feeds an :class:`AuditView` and wakes waiters on every event."""

    kinds = AuditView.kinds
    witnessed_kinds = AuditView.witnessed_kinds

    def __init__(self, view: AuditView | None = None) -> None:
        self.view = view or AuditView()
        self._waiters: set[asyncio.Event] = set()

    def apply(self, event: Event) -> None:
        """Fold ``event`` and wake everyone waiting."""
        self.view.apply(event)
        for w in self._waiters:
            w.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the next event; True if one came."""
        w = asyncio.Event()
        self._waiters.add(w)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout_s)):
                    await w.wait()
            return w.is_set()
        finally:
            self._waiters.discard(w)

    @classmethod
    def attach(cls, node: Any) -> LiveView:
        """A live view folded over ``node``'s journal (replayed first)."""
        live = cls()
        node.add_view(live)
        return live
