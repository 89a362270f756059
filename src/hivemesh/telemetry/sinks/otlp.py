"""OpenTelemetry sink: records become OTel metrics through ``opentelemetry-sdk``.

Theory of operation
-------------------
Each committed table is replayed, on the sink's worker thread, into SDK
instruments named by the GenAI semantic conventions:

* ``gen_ai.client.operation.duration`` (histogram, seconds) for LLM calls and
  tool calls, with ``gen_ai.operation.name``, ``gen_ai.request.model``,
  ``gen_ai.tool.name`` and ``error.type``;
* ``gen_ai.client.token.usage`` (histogram, ``{token}``) with
  ``gen_ai.token.type`` = ``input`` / ``output``;
* ``hivemesh.task.duration`` (histogram, seconds), ``hivemesh.counter``
  (counter) and ``hivemesh.gauge`` (gauge) keyed by ``hivemesh.metric.name``.

Every point also carries ``hivemesh.agent`` and ``hivemesh.sender``. The SDK's
metric reader aggregates and exports: :meth:`OtlpSink.http` wires the OTLP/HTTP
exporter (``opentelemetry-exporter-otlp-proto-http``) to an OpenTelemetry
collector; tests pass an in-process reader. Our store keeps durations in ms;
the conversion to seconds happens here.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.telemetry.sinks._worker import PushSink

__all__ = ["OtlpSink"]


class OtlpSink(PushSink):
    """Replays committed rows into OpenTelemetry SDK instruments."""

    name = "otlp"

    def __init__(self, meter_provider: Any, **kw: float | int) -> None:
        self.provider = meter_provider
        meter = meter_provider.get_meter("hivemesh.telemetry")
        self._op = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens used"
        )
        self._task = meter.create_histogram("hivemesh.task.duration", unit="s")
        self._counter = meter.create_counter("hivemesh.counter")
        self._gauge = meter.create_gauge("hivemesh.gauge")
        super().__init__(**kw)  # type: ignore[arg-type]

    @classmethod
    def http(cls, endpoint: str, *, interval_s: float = 10.0, timeout_s: float = 5.0,
             service_name: str = "hivemesh-collector") -> OtlpSink:  # fmt: skip
        """A sink exporting over OTLP/HTTP to ``endpoint`` (e.g. ``http://127.0.0.1:4318``)."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        exporter = OTLPMetricExporter(
            endpoint=f"{endpoint.rstrip('/')}/v1/metrics", timeout=timeout_s
        )
        reader = PeriodicExportingMetricReader(
            exporter,
            export_interval_millis=interval_s * 1000,
            export_timeout_millis=timeout_s * 1000,
        )
        provider = MeterProvider(
            metric_readers=[reader], resource=Resource.create({"service.name": service_name})
        )
        return cls(provider)

    def push(self, table: pa.Table) -> None:
        """Record every row of ``table`` into the instruments."""
        cols = {n: table.column(n).to_pylist() for n in table.column_names}
        for i in range(table.num_rows):
            kind = cols["kind"][i]
            base: dict[str, Any] = {"hivemesh.agent": cols["agent"][i] or "",
                                    "hivemesh.sender": cols["sender"][i]}  # fmt: skip
            value = cols["value"][i]
            if kind in ("llm_call", "tool_call"):
                attrs = dict(base)
                for col, key in (("operation", "gen_ai.operation.name"),
                                 ("model", "gen_ai.request.model"),
                                 ("tool", "gen_ai.tool.name"),
                                 ("error_type", "error.type")):  # fmt: skip
                    if cols[col][i]:
                        attrs[key] = cols[col][i]
                self._op.record(value / 1000.0, attrs)
                if kind == "llm_call":
                    for typ in ("input", "output"):
                        n = cols[f"{typ}_tokens"][i]
                        if n is not None:
                            self._tokens.record(n, {**attrs, "gen_ai.token.type": typ})
            elif kind == "task":
                attrs = dict(base)
                if cols["error_type"][i]:
                    attrs["error.type"] = cols["error_type"][i]
                self._task.record(value / 1000.0, attrs)
            elif kind == "counter":
                if value >= 0:
                    self._counter.add(value, {**base, "hivemesh.metric.name": cols["name"][i]})
            else:
                self._gauge.set(value, {**base, "hivemesh.metric.name": cols["name"][i]})

    def close(self, timeout_s: float = 5.0) -> None:
        """Finish queued work, flush the exporter and shut the provider down."""
        super().close(timeout_s)
        self.provider.force_flush(int(timeout_s * 1000))
        self.provider.shutdown()
