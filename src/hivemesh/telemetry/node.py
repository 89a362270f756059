"""Thin wiring for a node: the sending side and the collector side.

Theory of operation
-------------------
:class:`NodeTelemetry` is what every node holds (``node.metrics`` is its
:attr:`~NodeTelemetry.metrics`): a spool file in the node's data dir, the
recording API over it, and a sender draining it through the ``deliver``
callable the runtime supplies (one acknowledged direct message to the node
named ``metrics-collector``, with a deadline, returning the reply dict).

:class:`CollectorNode` is what the node that holds the ``metrics-collector``
name runs: the DuckDB store in its data dir, the collector, the sinks named
in its config, and optionally the health-monitor role. The runtime routes each
direct message of ``{"type": "metrics", ...}`` to
:meth:`CollectorNode.handle_message` and sends the returned dict back as the
reply.

Nothing here is protocol: both classes only assemble the pieces and start or
stop their tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.telemetry.health import HealthMonitor, NodeStatus, Thresholds
from hivemesh.telemetry.recorder import Metrics
from hivemesh.telemetry.sender import Deliver, Sender
from hivemesh.telemetry.spool import Spool

if TYPE_CHECKING:  # the collector's side (DuckDB, Arrow, sinks) loads with a CollectorNode
    from hivemesh.telemetry.alerting import HealthService, WebhookNotifier

__all__ = ["COLLECTOR_NAME", "SPOOL_FILE", "STORE_FILE", "CollectorNode", "NodeTelemetry"]

#: ``spawn(name, coro)``: how a long-lived task is started (default: a plain task).
Spawn = Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]


def _create_task(name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro, name=f"hm-{name}")


#: The node name records are sent to.
COLLECTOR_NAME = "metrics-collector"
#: Spool file name inside a node's data dir.
SPOOL_FILE = "telemetry-spool.sqlite3"
#: Collector store file name inside the collector node's data dir.
STORE_FILE = "metrics.duckdb"


class NodeTelemetry:
    """Spool + recording API + sender for one node."""

    def __init__(
        self,
        data_dir: str | Path,
        deliver: Deliver,
        *,
        agent: str = "",
        max_records: int = 1_000_000,
        **sender_options: Any,
    ) -> None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        self.spool = Spool(Path(data_dir) / SPOOL_FILE, max_records=max_records)
        self.sender = Sender(self.spool, deliver, **sender_options)
        self.metrics = Metrics(self.spool, agent=agent, on_record=self._poke)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _poke(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # Records may come from worker threads (tools run there); the sender lives on the loop.
            loop.call_soon_threadsafe(self.sender.notify)

    async def start(self, spawn: Spawn | None = None) -> None:
        """Start the sender loop on the running event loop (through ``spawn``,
        e.g. a daemon's supervisor, if given)."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._task = (spawn or _create_task)("telemetry_sender", self.sender.run(self._stop))

    async def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Try to send what is waiting (up to ``flush_timeout_s``), then stop; the rest stays
        spooled for the next start."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        if flush_timeout_s > 0:
            await self.sender.flush(flush_timeout_s)
        self._loop = None
        self.spool.close()


class CollectorNode:
    """Store + collector + sinks + optional health monitor for the ``metrics-collector``."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        trusted: Callable[[str], bool] = lambda _a: True,
        sinks: Mapping[str, Any] | None = None,
        members: Callable[[], Sequence[NodeStatus]] | None = None,
        webhooks: Sequence[WebhookNotifier] = (),
        thresholds: Thresholds | None = None,
        health_interval_s: float = 10.0,
    ) -> None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        # Imported here: a node that only sends telemetry never loads DuckDB or Arrow.
        from hivemesh.telemetry.alerting import HealthService
        from hivemesh.telemetry.collector import Collector
        from hivemesh.telemetry.sinks import sinks_from_config
        from hivemesh.telemetry.store import MetricsStore

        self.store = MetricsStore(str(Path(data_dir) / STORE_FILE))
        self.collector = Collector(self.store)
        self.sinks = sinks_from_config(sinks or {}, self.collector)
        self.collector.sinks.extend(self.sinks)
        self._trusted = trusted
        self.health: HealthService | None = None
        if members is not None:
            monitor = HealthMonitor(thresholds or Thresholds())
            monitor.restore(self.store.alerts(active_only=True))
            self.health = HealthService(
                self.collector, monitor, webhooks, members=members, interval_s=health_interval_s
            )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def handle_message(self, sender_address: str, payload: Any) -> dict[str, Any]:
        """Ingest one ``metrics`` direct message (a batch, or hand-sent telemetry:
        see :mod:`.flat`); the returned dict is the reply."""
        return await self.collector.ingest(sender_address, payload, self._trusted(sender_address))

    async def start(self, spawn: Spawn | None = None) -> None:
        """Start the health-monitor role, if configured (through ``spawn``,
        e.g. a daemon's supervisor, if given)."""
        if self.health is not None:
            self._stop.clear()
            self._task = (spawn or _create_task)("telemetry_health", self.health.run(self._stop))

    async def stop(self) -> None:
        """Stop health checks, flush staged batches, close sinks and the store."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        await self.collector.drain()
        self.collector.close()
        for s in self.sinks:
            s.close()
        self.store.close()
