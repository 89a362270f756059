"""The daemon's side of its own feed's write gate: log, first writes, ops.

The core decides (:mod:`hivemesh.core.ownfeed`: the mark, the gate, the
recovery); this module only makes it visible and acts on its changes:

* every change of the gate's state is logged (a warning while the node
  refuses writes, with the reason and what to do), and so is an append log
  the store found damaged at start (its acknowledged batches are covered
  by the mark: the gate refuses writes until they are recovered);
* the appends a node makes when it starts a new life -- releasing the claims
  of its previous life, announcing its endpoint, claiming its configured
  name -- wait until the feed takes writes (:meth:`OwnFeedWatch.check`);
* the commands ``feed.status`` and ``feed.accept_loss`` (the operator's
  documented way on when no peer can supply the missing part; it needs
  ``confirm: true`` and is logged as a warning) are handled in
  :mod:`hivemesh.runtime.handlers`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from hivemesh.core.identity import short
from hivemesh.core.ownfeed import FeedState
from hivemesh.errors import HivemeshError
from hivemesh.runtime.clock import now_ms

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["OwnFeedWatch"]

log = logging.getLogger("hivemesh.runtime.ownfeed")


class OwnFeedWatch:
    """Watches one daemon's own-feed gate (see module docs).

    ``first_writes(now_ms)`` is the daemon's new-life appends; it runs once,
    as soon as the feed takes writes (at start, or when it is recovered).
    """

    def __init__(
        self,
        daemon: Daemon,
        first_writes: Callable[[int], None],
        *,
        log_torn_bytes: int = 0,
        log_orphaned: int = 0,
    ) -> None:
        self.daemon = daemon
        self._first_writes: Callable[[int], None] | None = first_writes
        self.state = daemon.node.feed_gate.state
        if log_torn_bytes or log_orphaned:  # a damaged append log: never only a counter
            log.warning(
                "node %s: the store's append log was damaged (%d bytes torn off, %d "
                "records set aside); own feed %s at #%d, mark #%s",
                short(daemon.address),
                log_torn_bytes,
                log_orphaned,
                self.state.value,
                daemon.node.feed_gate.held.seq,
                daemon.node.feed_gate.status()["mark"],
            )
        if self.state is not FeedState.WRITABLE:
            self._warn()

    def start(self, t: int) -> None:
        """At start: the first writes now if the feed takes them (errors
        propagate: the daemon does not start)."""
        if self.state is FeedState.WRITABLE and self._first_writes is not None:
            first, self._first_writes = self._first_writes, None
            first(t)

    def check(self) -> None:
        """After input: log a change of state; run the first writes once the
        feed is writable (a failure is logged and counted, never raised)."""
        gate = self.daemon.node.feed_gate
        state = gate.state
        if state is self.state:
            return
        self.state = state
        if state is not FeedState.WRITABLE:
            self._warn()
            return
        log.warning(
            "node %s: own feed recovered up to #%d: writes resume",
            short(self.daemon.address),
            gate.held.seq,
        )
        self.daemon.counters["own_feed_recovered"] += 1
        if self._first_writes is not None:
            first, self._first_writes = self._first_writes, None
            try:
                first(now_ms())
            except HivemeshError:
                self.daemon.counters["first_writes_failed"] += 1
                log.exception("appends of the node's new life failed")

    def _warn(self) -> None:
        gate = self.daemon.node.feed_gate
        log.warning("node %s refuses writes: %s", short(self.daemon.address), gate.reason())
