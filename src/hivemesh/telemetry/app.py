"""Fleet telemetry as a daemon application: every node sends, one node collects.

Theory of operation
-------------------
:class:`TelemetryApp` plugs into the daemon through
:mod:`hivemesh.runtime.apps` (``daemon.app(TelemetryApp)``;
``hivemesh.Node.metrics`` is its :attr:`~TelemetryApp.metrics`): its status
section ``telemetry``, its commands ``metrics``, ``metrics.record`` and
``metrics.send``, and direct messages to the name ``metrics-collector``.

* **Sending (every node).** A :class:`~hivemesh.telemetry.node.NodeTelemetry`
  spools records in the data dir (``telemetry-spool.sqlite3``) and its sender
  delivers each batch (columnar, up to 5,000 records and 192 KiB: one direct
  message) as a request of kind ``metrics`` to the node *named*
  ``metrics-collector`` (``daemon.request(..., timeout_s=telemetry_timeout_s)``:
  an acknowledged direct message with retransmission, and the collector's ack
  dict as the reply). The name is resolved at every attempt, so whichever node
  holds it receives the records. No reply in time, no collector named yet, or
  ``ok: False``: the records stay spooled and the sender retries with backoff;
  the collector de-duplicates resends by ``(sender, seq)``. A node that holds
  the name but runs no collector answers so at once
  (:class:`~hivemesh.errors.NoHandler`): the sender's status says exactly
  that (``last_error_code`` ``no_handler``), not a timeout, and keeps the
  records until a collector takes the name. Stopping abandons a delivery in
  flight and flushes for at most a second: shutdown stays prompt, and what
  is not stored stays spooled.
* **Telemetry by hand.** A direct message to the *name* ``metrics-collector``
  (``hivemesh send-message metrics-collector --data '{...}'``,
  ``Node.send``) is not a plain message: :meth:`TelemetryApp.submit`
  sends it as a ``metrics`` request and returns only once the collector
  *stored* it (its ack), so "delivered" means stored. The collector maps
  flat shapes onto the schema (:mod:`hivemesh.telemetry.flat`); what it
  cannot map or refuses comes back as
  :class:`~hivemesh.telemetry.errors.TelemetryRefused` with the reason.
* **Heartbeat.** Every ``telemetry_heartbeat_s`` the node records the gauge
  :data:`HEARTBEAT` (value: its spool backlog). At the collector this is the
  node's "last heard" time and its backlog, which the health monitor uses.
* **Collecting (``collector = true`` / ``hivemesh up --collector``).** The node
  claims the name ``metrics-collector`` and runs a
  :class:`~hivemesh.telemetry.node.CollectorNode` (DuckDB store
  ``metrics.duckdb`` in the data dir, health monitor, and the sinks named in
  ``metrics_sinks``: Prometheus, InfluxDB, ClickHouse, OTLP). It answers ``metrics``
  requests with the collector's ack. Plain direct messages
  ``{"type": "metrics", ...}`` sent to the collector's *address* (not its
  name, which goes through :meth:`TelemetryApp.submit`) are ingested too,
  and acknowledged once the collector is done with them; their sender learns
  nothing of a refusal (it is logged and counted). Its own records skip the
  mesh and go straight to the local collector.
* **Trust.** A batch is accepted from a sender the daemon admits
  (``Daemon.authorize``) and, when ``metrics_senders`` lists addresses or
  names, only from those; anything else is refused (``untrusted_author``) and
  counted, as are malformed, oversized and unknown-field records.
* **Health.** The monitor sees membership (``up``/``suspect``/``down``; a
  member that ``left`` is not alerted on), the last heartbeat and the spool
  backlog each sender reported.
* **Local queries.** Control operations ``metrics.record`` (record on this
  node, ``hivemesh metrics record``; with ``wait_s`` it returns once the
  collector stored the records), ``metrics.send`` (start sending when configured ``telemetry =
  false``, which only spools) and ``metrics`` (``gaps``, ``senders``, ``stats``, ``query``, ``top``,
  ``alerts`` against the running collector's store, which DuckDB does not let
  a second process open) back ``hivemesh metrics ... --data-dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.commands import Record
from hivemesh.errors import (
    DeadlineExceeded,
    HivemeshError,
    InvalidArgument,
    LocalProtocolError,
    NoHandler,
)
from hivemesh.extras import missing
from hivemesh.runtime.supervise import reap
from hivemesh.telemetry.errors import SpoolFull, TelemetryRefused
from hivemesh.telemetry.health import NodeStatus, Thresholds
from hivemesh.telemetry.node import COLLECTOR_NAME, CollectorNode, NodeTelemetry
from hivemesh.telemetry.recorder import Metrics
from hivemesh.telemetry.schema import MAX_BATCH_RECORDS

if TYPE_CHECKING:
    from hivemesh.commands import Command, MetricsQuery
    from hivemesh.runtime.apps import AppHandler
    from hivemesh.runtime.daemon import Daemon

__all__ = ["BATCH_MAX_BYTES", "HEARTBEAT", "MESSAGE_KIND", "TelemetryApp", "usage_hook"]

log = logging.getLogger("hivemesh.telemetry.app")

#: Request kind (and plain message ``type``) of a metrics batch.
MESSAGE_KIND = "metrics"
#: The heartbeat gauge each node records (value: its spool backlog).
HEARTBEAT = "hivemesh.telemetry.spool_backlog"
#: Bytes of records per batch: well under the direct-message limit (256 KiB).
BATCH_MAX_BYTES = 192 * 1024

_STATES = {"up": "alive", "suspect": "suspect", "down": "dead"}


def _collector_node(*args: Any, **kwargs: Any) -> CollectorNode:
    """A :class:`CollectorNode`, or a :class:`ConfigError` naming the extra
    (``collector``: DuckDB and Arrow) when it is not installed."""
    try:
        return CollectorNode(*args, **kwargs)
    except ModuleNotFoundError as exc:
        raise missing(exc, "the metrics collector (--collector)") from None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def usage_hook(metrics: Metrics) -> Callable[[str, int, int, float, bool], None]:
    """An LLM provider ``on_usage`` callback that records every call in ``metrics``.

    ``hivemesh.llm.make_provider(config, on_usage=usage_hook(node.metrics))``.
    """

    def on_usage(model: str, input_tokens: int, output_tokens: int, ms: float, ok: bool) -> None:
        with contextlib.suppress(HivemeshError):  # a full spool is counted there
            metrics.llm_call(
                model=model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                latency_ms=ms,
                error_type=None if ok else "llm_error",
            )

    return on_usage


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class TelemetryApp:
    """The telemetry application of one daemon (see module docs and
    :class:`hivemesh.runtime.apps.App`)."""

    name = "telemetry"
    addressees = frozenset({COLLECTOR_NAME})

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        cfg = daemon.config
        self.node = NodeTelemetry(
            cfg.data_dir,
            self._deliver,
            agent=cfg.name or daemon.address[:12],
            batch_max=MAX_BATCH_RECORDS,  # columnar: ~25 B a record, well under the bytes cap
            batch_max_bytes=BATCH_MAX_BYTES,
            deliver_timeout_s=cfg.telemetry_timeout_s + 1.0,
            max_backoff_s=cfg.telemetry_max_backoff_s,
        )
        self.collector: CollectorNode | None = None
        if cfg.collector:
            hb_ms = int(cfg.telemetry_heartbeat_s * 1000)
            self.collector = _collector_node(
                cfg.data_dir,
                trusted=self.trusted,
                sinks=cfg.sinks(),
                members=self._members,
                thresholds=Thresholds(heartbeat_timeout_ms=max(3 * hb_ms, 3000)),
                health_interval_s=cfg.health_interval_s,
            )
        self._hb_task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def metrics(self) -> Metrics:
        """The recording API (``record``, ``count``, ``timer``, ``track_llm``, ...)."""
        return self.node.metrics

    async def start(self) -> None:
        """Start sending; on a collector, serve ``metrics`` and claim the name."""
        if self.collector is not None:
            self.d.messaging.on_message(MESSAGE_KIND, self._on_request)
            self.d.messaging.on_plain(MESSAGE_KIND, self._on_plain)
            await self.collector.start(self.d.supervisor.watch)
            if self.d.config.mesh is not None:  # broker mode: read the shared queue too
                from hivemesh.runtime.broker import start_telemetry_consumer

                start_telemetry_consumer(self.d, self.collector)
            if self.d.names.resolve(COLLECTOR_NAME) != self.d.address:
                await self.d.claim_name(COLLECTOR_NAME)
        if self.d.config.telemetry:
            await self.start_sending()

    async def start_sending(self) -> bool:
        """Start the sender and heartbeat (at start unless ``telemetry = false``;
        control op ``metrics.send``); False if already sending."""
        if self._hb_task is not None or self._stopped:
            return False
        await self.node.start(self.d.supervisor.watch)
        self._hb_task = self.d.supervisor.spawn("telemetry_heartbeat", self._heartbeat)
        return True

    async def stop(self) -> None:
        """Send what is spooled (briefly), then stop; the rest waits in the spool."""
        if self._stopped:
            return
        self._stopped = True
        if self._hb_task is not None:
            await reap([self._hb_task], "telemetry heartbeat")
        await self.node.stop(flush_timeout_s=1.0 if self._hb_task is not None else 0.0)
        if self.collector is not None:
            await self.collector.stop()

    # -- sending ---------------------------------------------------------------------

    async def _deliver(self, payload: bytes) -> Mapping[str, Any]:
        if self.collector is not None:  # we are the collector: no mesh hop
            return await self.collector.handle_message(self.d.address, payload)
        if self.d.config.mesh is not None:  # broker mode: the collectors' shared queue
            from hivemesh.runtime.broker import publish_telemetry

            return await publish_telemetry(self.d, payload)
        reply = await self._request(payload, self.d.config.telemetry_timeout_s)
        if not isinstance(reply, Mapping):
            raise LocalProtocolError(f"collector replied {type(reply).__name__}, not a map")
        return reply

    async def _request(self, body: Any, timeout_s: float) -> Any:
        address = self.d.resolve(COLLECTOR_NAME)
        try:
            return await self.d.request(address, MESSAGE_KIND, body, timeout_s=timeout_s)
        except NoHandler:
            names = ", ".join(n for n in self.d.names.names_of(address) if n != COLLECTOR_NAME)
            raise NoHandler(
                f"the node holding {COLLECTOR_NAME} ({address[:12]}{f', {names}' if names else ''})"
                " does not run a collector: start it with `hivemesh up --collector`"
            ) from None

    async def deliver(self, to: str, data: Any, *, timeout_s: float) -> dict[str, Any]:
        """A direct message to ``metrics-collector``: :meth:`submit`."""
        return await self.submit(data, timeout_s=timeout_s)

    async def submit(self, data: Any, *, timeout_s: float) -> dict[str, Any]:
        """Hand-sent telemetry for the collector: return once it is stored.

        ``data`` is a batch, a flat record or a list of them (see
        :mod:`hivemesh.telemetry.flat`). Raises :class:`TelemetryRefused` with
        the collector's reason when it stored none or only some of the
        records, :class:`NoHandler` when the name's holder runs no collector,
        and :class:`DeadlineExceeded` without an answer in ``timeout_s``.
        """
        t0 = time.perf_counter()
        if self.collector is not None:
            address = self.d.address
            ack = await self.collector.handle_message(address, data)
        else:
            address = self.d.resolve(COLLECTOR_NAME)
            ack = await self._request(data, timeout_s)
        if not isinstance(ack, Mapping):
            raise TelemetryRefused(f"{COLLECTOR_NAME} answered {type(ack).__name__}", "bad_ack")
        if ack.get("ok") is not True:
            reason = str(ack.get("error"))
            raise TelemetryRefused(
                f"{COLLECTOR_NAME} refused it: {reason}: {str(ack.get('detail', ''))[:200]}", reason
            )
        accepted, rejected = int(ack.get("accepted", 0)), int(ack.get("rejected", 0))
        if rejected:
            errors = [e for e in ack.get("errors", []) if isinstance(e, Mapping)]
            why = "; ".join(f"record {e.get('index')}: {e.get('error')}: {e.get('detail')}"
                            for e in errors[:3])  # fmt: skip
            raise TelemetryRefused(
                f"{COLLECTOR_NAME} stored {accepted} of {accepted + rejected} records and"
                f" refused {rejected}: {why}",
                str(errors[0].get("error")) if errors else "rejected",
            )
        return {
            "to": address,
            "stored": accepted,
            "duplicates": int(ack.get("duplicates", 0)),
            "rtt_ms": round((time.perf_counter() - t0) * 1000, 3),
        }

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(HivemeshError):
                self.metrics.gauge(HEARTBEAT, self.node.spool.backlog)
            await asyncio.sleep(self.d.config.telemetry_heartbeat_s)

    # -- collecting --------------------------------------------------------------------

    def trusted(self, address: str) -> bool:
        """May ``address`` report metrics here? (see module docs)"""
        if not self.d.authorize(address):
            return False
        allowed = self.d.config.metrics_senders
        if not allowed:
            return True
        for entry in allowed:
            with contextlib.suppress(HivemeshError):
                if self.d.resolve(entry) == address:
                    return True
        return False

    async def _on_request(self, sender: str, body: Any) -> dict[str, Any]:
        assert self.collector is not None
        # any type: the collector refuses what is not a batch (bytes or a map) and counts it
        return await self.collector.handle_message(sender, body)

    async def _on_plain(self, sender: str, data: Any) -> None:
        assert self.collector is not None
        ack = await self.collector.handle_message(sender, data)
        if not ack.get("ok"):
            log.info("hand-sent metrics from %s refused: %s", sender[:12], ack.get("error"))

    async def wait_stored(self, seq: int, timeout_s: float) -> None:
        """Return once the collector stored our records up to ``seq``; raise
        :class:`DeadlineExceeded` (saying why, when known) after ``timeout_s``."""
        if await self.node.sender.wait_stored(seq, timeout_s):
            return
        if self._hb_task is None:
            why = "sending is off (telemetry = false; control op metrics.send starts it)"
        else:
            why = f"last error: {self.node.sender.statistics().last_error or 'none yet'}"
        raise DeadlineExceeded(
            f"recorded and spooled (seq {seq}), but not stored by {COLLECTOR_NAME}"
            f" within {timeout_s}s; {why}"
        )

    def _members(self) -> list[NodeStatus]:
        assert self.collector is not None
        reports = {r.sender: r for r in self.collector.collector.senders()}
        out = []
        for address, m in sorted(self.d.peer.members_snapshot().items()):
            state = _STATES.get(m["state"])
            if state is None or address == self.d.address:
                continue
            r = reports.get(address)
            seen = max(r.last_seen_ms if r else 0, int(m["since_ms"]))
            out.append(
                NodeStatus(
                    address=address,
                    state=state,  # type: ignore[arg-type]
                    last_heartbeat_ms=seen,
                    name=",".join(self.d.names.names_of(address)),
                    spool_backlog=r.backlog if r else None,
                )
            )
        return out

    # -- commands, status and queries ---------------------------------------------------

    def commands(self) -> Mapping[type[Command], AppHandler]:
        """``metrics``, ``metrics.record`` and ``metrics.send``."""
        return {
            c.MetricsQuery: self._query_command,
            c.MetricsRecord: self.record,
            c.MetricsSend: self._send_command,
        }

    async def _query_command(self, req: c.MetricsQuery) -> Record:
        return Record(await self.query(req))

    async def _send_command(self, req: c.MetricsSend) -> c.MetricsSendReply:
        return c.MetricsSendReply(started=await self.start_sending())

    async def record(self, req: c.MetricsRecord) -> c.MetricsRecordReply:
        """Command ``metrics.record``: record ``count`` records here; with
        ``wait_s``, return once the collector stored them."""
        seqs = []
        for i in range(req.count):
            seq = self.metrics.record(
                req.name,
                req.value,
                kind=req.kind,
                unit=req.unit,
                agent=req.agent,
                attrs={**req.attrs, "i": i} if req.count > 1 else req.attrs,
            )
            if seq is None:
                raise SpoolFull("the telemetry spool is full: the record was dropped (counted)")
            seqs.append(seq)
        stored = None
        if req.wait_s is not None:
            await self.wait_stored(seqs[-1], req.wait_s)
            stored = True
        return c.MetricsRecordReply(
            recorded=req.count, first_seq=seqs[0], last_seq=seqs[-1], stored=stored
        )

    def status(self) -> dict[str, Any]:
        """The ``telemetry`` section of ``hivemesh status``."""
        spool = dataclasses.asdict(self.node.spool.statistics())
        sender = dataclasses.asdict(self.node.sender.statistics())
        out: dict[str, Any] = {
            "spool_backlog": spool["backlog"],
            "spool": spool,
            "sender": sender,
            "recorded": self.node.metrics.recorded,
            "collector": None,
        }
        if self.collector is not None:
            c = self.collector.collector
            out["collector"] = {
                "counters": c.statistics(),
                "flushes": c.flushes,
                "flushed_rows": c.flushed_rows,
                "senders": len(c.senders()),
                "gaps": sum(hi - lo + 1 for g in c.gaps().values() for lo, hi in g),
                "sinks": [type(sk).__name__ for sk in self.collector.sinks],
                # per push sink: pushed, failed, dropped tables, retries, last error
                "sink_stats": {
                    type(sk).__name__: dataclasses.asdict(st)
                    for sk in self.collector.sinks
                    if dataclasses.is_dataclass(st := getattr(sk, "statistics", lambda: None)())
                    and not isinstance(st, type)
                },
            }
        return out

    async def query(self, req: MetricsQuery) -> Any:
        """Answer one ``metrics`` command (see module docs)."""
        if self.collector is None:
            raise InvalidArgument("this node does not run the collector (hivemesh up --collector)")
        c = self.collector.collector
        what = req.what
        if what == "stats":
            return self.status()["collector"]
        if what in ("gaps", "senders"):
            reports = [dataclasses.asdict(r) for r in c.senders()]
            return [r for r in reports if r["gaps"]] if what == "gaps" else reports
        if what == "alerts":
            active = not req.all
            return await c.call_store(lambda s: s.alerts(active_only=active))
        if what == "query":
            sql = req.sql or ""
            names, rows = await c.call_store(lambda s: s.query(sql))
        else:
            by, since, limit = req.by, req.since_ms, req.limit
            names, rows = await c.call_store(lambda s: s.top(by, since, _now_ms(), limit))
        return {"columns": names, "rows": [[_plain(v) for v in r] for r in rows]}
