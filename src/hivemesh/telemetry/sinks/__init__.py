"""Optional mirrors of the collector's store: Prometheus, InfluxDB, ClickHouse, OTLP.

Each is enabled by configuration (:func:`sinks_from_config`)::

    {"prometheus": {"host": "127.0.0.1", "port": 9464},
     "influxdb":   {"url": "http://127.0.0.1:8086", "database": "hivemesh"},
     "clickhouse": {"url": "http://127.0.0.1:8123", "table": "hivemesh_metrics"},
     "otlp":       {"endpoint": "http://127.0.0.1:4318", "interval_s": 10}}

A sink receives every committed flush and must never block the collector:
the DuckDB store is the record, sinks are best-effort mirrors with counted
failures and drops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hivemesh.errors import ConfigError

__all__ = ["sinks_from_config"]

_KNOWN = ("clickhouse", "influxdb", "otlp", "prometheus")


def sinks_from_config(cfg: Mapping[str, Any], collector: Any = None) -> list[Any]:
    """Build the sinks named in ``cfg`` (unknown names or bad options raise ConfigError)."""
    unknown = sorted(set(cfg) - set(_KNOWN))
    if unknown:
        raise ConfigError(f"unknown telemetry sinks: {unknown} (known: {list(_KNOWN)})")
    out: list[Any] = []
    try:
        if "prometheus" in cfg:
            from hivemesh.telemetry.sinks.prometheus import PrometheusSink, collector_series

            c = dict(cfg["prometheus"])
            p = PrometheusSink(extra=collector_series(collector) if collector else None)
            p.serve(c.get("host", "127.0.0.1"), int(c.get("port", 9464)))
            out.append(p)
        if "influxdb" in cfg:
            from hivemesh.telemetry.sinks.influxdb import InfluxDbSink

            c = dict(cfg["influxdb"])
            out.append(InfluxDbSink(c["url"], c.get("database", "hivemesh")))
        if "clickhouse" in cfg:
            from hivemesh.telemetry.sinks.clickhouse import ClickHouseSink

            c = dict(cfg["clickhouse"])
            out.append(ClickHouseSink(c["url"], c.get("table", "hivemesh_metrics")))
        if "otlp" in cfg:
            from hivemesh.telemetry.sinks.otlp import OtlpSink

            c = dict(cfg["otlp"])
            out.append(OtlpSink.http(c["endpoint"], interval_s=float(c.get("interval_s", 10))))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad telemetry sink config: {exc}") from exc
    return out
