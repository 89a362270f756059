"""Prometheus exposition endpoint (text format 0.0.4) over the collected records.

Theory of operation
-------------------
:class:`PrometheusSink` aggregates every committed table with Arrow
``group_by`` (no per-row Python) into cumulative series:

* ``hivemesh_records_total{kind,name,agent}`` -- records stored;
* ``hivemesh_calls_total{kind,agent,model,tool,outcome}`` -- LLM calls, tool
  calls and tasks by outcome (``ok``/``error``);
* ``hivemesh_gen_ai_tokens_total{agent,model,type}`` -- ``gen_ai.usage``
  input/output tokens;
* ``hivemesh_duration_ms`` -- histogram of durations (records in ms) by
  ``kind`` and ``agent``;
* ``hivemesh_counter_total{name,agent}`` / ``hivemesh_gauge{name,agent}`` --
  user counters (summed) and gauges (last value);

plus, through ``extra``, the collector's own counters and per-sender backlog
and missing-record gauges. Label values are escaped per the text format; the
number of series is capped (``max_series``; overflow counted in
``hivemesh_prometheus_series_dropped_total``). :meth:`serve` starts a small
threaded HTTP server (stdlib) answering ``GET /metrics``; bind it to
loopback unless you mean otherwise.
"""

from __future__ import annotations

import bisect
import http.server
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

__all__ = ["BUCKETS_MS", "PrometheusSink"]

#: Histogram bucket upper bounds for ``hivemesh_duration_ms``.
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000)

Labels = tuple[tuple[str, str], ...]
_HELP = {
    "hivemesh_records_total": ("counter", "Metric records stored by the collector."),
    "hivemesh_calls_total": ("counter", "LLM calls, tool calls and tasks by outcome."),
    "hivemesh_gen_ai_tokens_total": ("counter", "GenAI token usage (gen_ai.usage.*)."),
    "hivemesh_duration_ms": ("histogram", "Durations of LLM calls, tool calls, tasks, timers."),
    "hivemesh_counter_total": ("counter", "User counters recorded with metrics.count()."),
    "hivemesh_gauge": ("gauge", "User gauges recorded with metrics.gauge() (last value)."),
    "hivemesh_prometheus_series_dropped_total": ("counter", "Series not kept (cap)."),
}


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _fmt(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels) + "}"


class PrometheusSink:
    """Cumulative series over committed rows, exposed as ``/metrics``."""

    def __init__(
        self,
        *,
        max_series: int = 20_000,
        extra: Callable[[], Iterable[tuple[str, str, Labels, float]]] | None = None,
    ) -> None:
        self.max_series = max_series
        self._extra = extra
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Labels], float] = {}
        self._gauges: dict[tuple[str, Labels], float] = {}
        self._hist: dict[Labels, list[float]] = {}  # bucket counts..., +Inf count, sum
        self._dropped = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- aggregation -----------------------------------------------------------

    def _room(self, store: dict[Any, Any], key: Any) -> bool:
        if key in store:
            return True
        if len(self._counters) + len(self._gauges) + len(self._hist) >= self.max_series:
            self._dropped += 1
            return False
        return True

    def _add(self, name: str, labels: Labels, v: float) -> None:
        key = (name, labels)
        if self._room(self._counters, key):
            self._counters[key] = self._counters.get(key, 0.0) + v

    def submit(self, table: pa.Table) -> None:
        """Fold one committed table into the series."""
        fill: dict[str, Any] = {c: "" for c in ("kind", "name", "agent", "model", "tool", "unit")}
        fill.update(ok=True, value=0.0, input_tokens=0, output_tokens=0)
        t = pa.table({c: pc.fill_null(table.column(c), v) for c, v in fill.items()})
        recs = t.group_by(["kind", "name", "agent"]).aggregate([("value", "count")])
        calls_t = t.filter(pc.is_in(t.column("kind"), pa.array(["llm_call", "tool_call", "task"])))
        calls = calls_t.group_by(["kind", "agent", "model", "tool", "ok"]).aggregate(
            [("value", "count"), ("input_tokens", "sum"), ("output_tokens", "sum")]
        )
        counters = (
            t.filter(pc.equal(t.column("kind"), "counter"))
            .group_by(["name", "agent"])
            .aggregate([("value", "sum")])
        )
        gauges = (
            t.filter(pc.equal(t.column("kind"), "gauge"))
            .group_by(["name", "agent"], use_threads=False)
            .aggregate([("value", "last")])
        )
        durs = t.filter(pc.equal(t.column("unit"), "ms"))
        dur_rows = list(
            zip(
                durs.column("kind").to_pylist(),
                durs.column("agent").to_pylist(),
                durs.column("value").to_pylist(),
                strict=True,
            )
        )
        with self._lock:
            lab: Labels
            for r in recs.to_pylist():
                lab = (("agent", r["agent"]), ("kind", r["kind"]), ("name", r["name"]))
                self._add("hivemesh_records_total", lab, r["value_count"])
            for r in calls.to_pylist():
                outcome = "ok" if r["ok"] else "error"
                lab = (("agent", r["agent"]), ("kind", r["kind"]), ("model", r["model"]),
                       ("outcome", outcome), ("tool", r["tool"]))  # fmt: skip
                self._add("hivemesh_calls_total", lab, r["value_count"])
                if r["kind"] == "llm_call":
                    for typ in ("input", "output"):
                        n = r[f"{typ}_tokens_sum"] or 0
                        tl = (("agent", r["agent"]), ("model", r["model"]), ("type", typ))
                        self._add("hivemesh_gen_ai_tokens_total", tl, float(n))
            for r in counters.to_pylist():
                lab = (("agent", r["agent"]), ("name", r["name"]))
                self._add("hivemesh_counter_total", lab, r["value_sum"])
            for r in gauges.to_pylist():
                key = ("hivemesh_gauge", (("agent", r["agent"]), ("name", r["name"])))
                if self._room(self._gauges, key):
                    self._gauges[key] = r["value_last"]
            for kind, agent, v in dur_rows:
                hl = (("agent", agent), ("kind", kind))
                h = self._hist.get(hl)
                if h is None:
                    if not self._room(self._hist, hl):
                        continue
                    h = self._hist[hl] = [0.0] * (len(BUCKETS_MS) + 2)
                h[bisect.bisect_left(BUCKETS_MS, v)] += 1
                h[-1] += v

    # -- exposition --------------------------------------------------------------

    def render(self) -> str:
        """The exposition text (format 0.0.4)."""
        series: dict[str, list[str]] = {}
        with self._lock:
            for (name, lab), v in sorted(self._counters.items()):
                series.setdefault(name, []).append(f"{name}{_fmt(lab)} {v!r}")
            for (name, lab), v in sorted(self._gauges.items()):
                series.setdefault(name, []).append(f"{name}{_fmt(lab)} {v!r}")
            hist_lines: list[str] = []
            for lab, h in sorted(self._hist.items()):
                cum = 0.0
                for i, le in enumerate((*BUCKETS_MS, None)):
                    cum += h[i]
                    le_s = "+Inf" if le is None else str(le)
                    hist_lines.append(
                        f"hivemesh_duration_ms_bucket{_fmt((*lab, ('le', le_s)))} {cum!r}"
                    )
                hist_lines.append(f"hivemesh_duration_ms_sum{_fmt(lab)} {h[-1]!r}")
                hist_lines.append(f"hivemesh_duration_ms_count{_fmt(lab)} {cum!r}")
            if hist_lines:
                series["hivemesh_duration_ms"] = hist_lines
            series["hivemesh_prometheus_series_dropped_total"] = [
                f"hivemesh_prometheus_series_dropped_total {float(self._dropped)!r}"
            ]
        extra_help: dict[str, tuple[str, str]] = {}
        if self._extra is not None:
            for name, typ, lab, v in sorted(self._extra()):
                extra_help[name] = (typ, name.replace("_", " "))
                series.setdefault(name, []).append(f"{name}{_fmt(lab)} {float(v)!r}")
        out: list[str] = []
        for name in sorted(series):
            typ, text = _HELP.get(name) or extra_help[name]
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {typ}")
            out.extend(series[name])
        return "\n".join(out) + "\n"

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start ``GET /metrics`` on a daemon thread; return the bound port."""
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = sink.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="hm-prometheus", daemon=True
        ).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop the HTTP server."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def collector_series(collector: Any) -> Callable[[], list[tuple[str, str, Labels, float]]]:
    """An ``extra`` source with the collector's counters and per-sender figures."""

    def series() -> list[tuple[str, str, Labels, float]]:
        out: list[tuple[str, str, Labels, float]] = []
        for code, n in sorted(collector.statistics().items()):
            out.append(("hivemesh_collector_events_total", "counter", (("event", code),), float(n)))
        for r in collector.senders():
            lab = (("sender", r.sender),)
            out.append(("hivemesh_sender_backlog", "gauge", lab, float(r.backlog)))
            missing = float(sum(hi - lo + 1 for lo, hi in r.gaps))
            out.append(("hivemesh_sender_missing_records", "gauge", lab, missing))
        return out

    return series
