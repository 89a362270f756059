"""Optional mirrors of the collector's store: Prometheus, InfluxDB, ClickHouse, OTLP.

Each is enabled by configuration (:func:`sinks_from_config`)::

    {"prometheus": {"host": "127.0.0.1", "port": 9464},
     "influxdb":   {"url": "http://127.0.0.1:8086", "database": "hivemesh"},
     "clickhouse": {"url": "http://127.0.0.1:8123", "table": "hivemesh_metrics"},
     "otlp":       {"endpoint": "http://127.0.0.1:4318", "interval_s": 10}}

A node daemon takes the same from its config (``metrics_sinks``: a TOML
table ``[telemetry.metrics_sinks.prometheus]``, ``HIVEMESH_METRICS_SINKS``,
``hivemesh up --sink prometheus:port=9464``; see :mod:`hivemesh.config`),
checked by :func:`check_sink_config` when the config loads.

A sink receives every committed flush and must never block the collector:
the DuckDB store is the record, sinks are best-effort mirrors with counted
failures and drops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hivemesh.errors import ConfigError
from hivemesh.extras import missing

__all__ = ["SINK_OPTIONS", "check_sink_config", "sinks_from_config"]

#: Per sink: (the options it takes, the options it needs).
SINK_OPTIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "clickhouse": (frozenset({"url", "table"}), frozenset({"url"})),
    "influxdb": (frozenset({"url", "database"}), frozenset({"url"})),
    "otlp": (frozenset({"endpoint", "interval_s"}), frozenset({"endpoint"})),
    "prometheus": (frozenset({"host", "port"}), frozenset()),
}
_KNOWN = tuple(sorted(SINK_OPTIONS))
_NUMBERS = {("prometheus", "port"): int, ("otlp", "interval_s"): float}


def check_sink_config(cfg: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise :class:`ConfigError` for an unknown sink, an unknown or missing
    option, or an option that is not the number it must be (no I/O)."""
    for name, options in cfg.items():
        if name not in SINK_OPTIONS:
            raise ConfigError(f"unknown telemetry sink {name!r} (known: {list(_KNOWN)})")
        allowed, needed = SINK_OPTIONS[name]
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ConfigError(f"sink {name}: unknown options {unknown} (known: {sorted(allowed)})")
        missing = sorted(needed - set(options))
        if missing:
            raise ConfigError(f"sink {name}: missing options {missing}")
        for key, value in options.items():
            conv = _NUMBERS.get((name, key))
            if conv is None:
                continue
            try:
                number = conv(value)
            except (TypeError, ValueError):
                raise ConfigError(f"sink {name}: {key} must be a number, got {value!r}") from None
            if number < 0 or (key == "port" and number > 65535):
                raise ConfigError(f"sink {name}: {key} out of range: {value!r}")


def sinks_from_config(cfg: Mapping[str, Any], collector: Any = None) -> list[Any]:
    """Build the sinks named in ``cfg`` (unknown names or bad options raise ConfigError)."""
    check_sink_config(cfg)
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
    except ModuleNotFoundError as exc:  # an extra (collector, otlp) is not installed
        raise missing(exc, "a telemetry sink") from None
    return out
