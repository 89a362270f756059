"""Sinks against real parts: a Prometheus server scraping our endpoint, an InfluxDB 1.x
server receiving line protocol, the OTLP/HTTP exporter posting protobuf to a local
receiver; ClickHouse against a local fake HTTP server (Debian's clickhouse is unusable).
"""

from __future__ import annotations

import http.server
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from hivemesh.errors import ConfigError  # noqa: E402
from hivemesh.telemetry.collector import Collector  # noqa: E402
from hivemesh.telemetry.sinks import sinks_from_config  # noqa: E402
from hivemesh.telemetry.sinks.clickhouse import ClickHouseSink, clickhouse_ddl  # noqa: E402
from hivemesh.telemetry.sinks.influxdb import InfluxDbSink  # noqa: E402
from hivemesh.telemetry.sinks.prometheus import PrometheusSink, collector_series  # noqa: E402
from hivemesh.telemetry.store import MetricsStore  # noqa: E402

NOW = 1_900_000_000_000


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = cond()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def sample_records() -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for i in range(30):
        recs.append(
            {"seq": len(recs) + 1, "ts_ms": NOW + i, "kind": "llm_call",
             "name": "gen_ai.client.operation.duration", "value": 100.0 + i, "unit": "ms",
             "agent": "planner one,two", "attrs": {"gen_ai.request.model": "gpt-x",
             "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10,
             "gen_ai.usage.output_tokens": 2}}
        )  # fmt: skip
    for i in range(20):
        attrs: dict[str, Any] = {"gen_ai.tool.name": "search"}
        if i % 4 == 0:
            attrs["error.type"] = "Timeout"
        recs.append(
            {"seq": len(recs) + 1, "ts_ms": NOW + 100 + i, "kind": "tool_call",
             "name": "gen_ai.tool.duration", "value": 7.0, "unit": "ms", "agent": "exec",
             "attrs": attrs}
        )  # fmt: skip
    recs.append({"seq": len(recs) + 1, "ts_ms": NOW + 200, "kind": "counter",
                 "name": "tasks.claimed", "value": 3.0, "agent": "exec"})  # fmt: skip
    recs.append({"seq": len(recs) + 1, "ts_ms": NOW + 201, "kind": "gauge",
                 "name": "queue.depth", "value": 9.0, "agent": "exec"})  # fmt: skip
    return recs


def ingest_all(sinks: list[Any], tmp_path: Path) -> Collector:
    c = Collector(MetricsStore(str(tmp_path / "m.duckdb")), sinks=sinks)
    ack = c.ingest_now("hm-sender-1", {"records": sample_records()}, True)
    assert ack["accepted"] == 52
    return c


# -- Prometheus ------------------------------------------------------------------------


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("prometheus binary not installed (Debian package 'prometheus'; "
                    "scripts/services.d/prometheus.sh installs it)")  # fmt: skip
    return path


def test_prometheus_server_scrapes_the_exposition_endpoint(
    tmp_path: Path, prometheus_bin: str
) -> None:
    sink = PrometheusSink()
    collector = ingest_all([sink], tmp_path)
    sink._extra = collector_series(collector)
    port = sink.serve("127.0.0.1", 0)
    prom_port = free_port()
    (tmp_path / "prom.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
        f"  - job_name: hivemesh\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp_path / 'prom.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{prom_port}"

    def query(q: str) -> list[dict[str, Any]]:
        status, body = http_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}")
        if status != 200:
            return []
        return list(json.loads(body)["data"]["result"])

    try:
        wait_for(lambda: http_get(f"{base}/-/ready")[0] == 200, 60, "prometheus ready")
        up = wait_for(lambda: query('up{job="hivemesh"} == 1'), 30, "a successful scrape")
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{port}"
        res = wait_for(lambda: query('hivemesh_gen_ai_tokens_total{type="input"}'), 30, "tokens")
        assert res[0]["metric"]["agent"] == "planner one,two" and res[0]["value"][1] == "300"
        res = query('hivemesh_calls_total{kind="tool_call",outcome="error"}')
        assert res[0]["value"][1] == "5"
        res = query("sum(hivemesh_duration_ms_count)")
        assert res[0]["value"][1] == "50"
        res = query('hivemesh_gauge{name="queue.depth"}')
        assert res[0]["value"][1] == "9"
        res = query('hivemesh_collector_events_total{event="accepted"}')
        assert res[0]["value"][1] == "52"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        sink.close()
        collector.close()


def test_prometheus_label_escaping_and_series_cap() -> None:
    sink = PrometheusSink(max_series=3)
    table = MetricsStore.table_from_rows(
        [("s", i, None, NOW, NOW, "counter", f"n{i}", 1.0, "", 'a"b\\c\nd', None, None, None,
          True, None, None, None, "") for i in range(1, 6)]
    )  # fmt: skip
    sink.submit(table)
    text = sink.render()
    assert 'agent="a\\"b\\\\c\\nd"' in text
    assert "hivemesh_prometheus_series_dropped_total 7.0" in text  # 10 wanted, 3 kept


# -- InfluxDB --------------------------------------------------------------------------


@pytest.fixture
def influxdb(tmp_path: Path) -> Iterator[str]:
    influxd = shutil.which("influxd")
    if influxd is None:
        pytest.skip("influxd not installed (Debian package 'influxdb'; "
                    "scripts/services.d/influxdb.sh installs it)")  # fmt: skip
    http_port, rpc_port = free_port(), free_port()
    d = tmp_path / "influx"
    conf = d / "influxdb.conf"
    d.mkdir()
    conf.write_text(
        f'reporting-disabled = true\nbind-address = "127.0.0.1:{rpc_port}"\n'
        f'[meta]\n  dir = "{d}/meta"\n[data]\n  dir = "{d}/data"\n  wal-dir = "{d}/wal"\n'
        f'[http]\n  bind-address = "127.0.0.1:{http_port}"\n  log-enabled = false\n'
        "[monitor]\n  store-enabled = false\n"
    )
    proc = subprocess.Popen([influxd, "-config", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_for(lambda: http_get(f"{base}/ping")[0] == 204, 60, "influxd /ping")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def influx_query(base: str, q: str, db: str = "") -> list[list[Any]]:
    params = {"q": q, **({"db": db} if db else {})}
    req = urllib.request.Request(f"{base}/query", data=urllib.parse.urlencode(params).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        res = json.loads(r.read())["results"][0]
    series = res.get("series") or []
    return [v for s in series for v in s["values"]]


def test_influxdb_receives_line_protocol(tmp_path: Path, influxdb: str) -> None:
    influx_query(influxdb, "CREATE DATABASE hm")
    sink = InfluxDbSink(influxdb, "hm", backoff_s=0.05)
    collector = ingest_all([sink], tmp_path)
    assert sink.wait_idle(30)
    assert sink.statistics().pushed_rows == 52 and sink.statistics().failed_tables == 0
    meas = '"gen_ai.client.operation.duration"'
    rows = influx_query(
        influxdb, f"SELECT count(value), sum(input_tokens) FROM {meas} GROUP BY agent", "hm"
    )
    assert [r[1:] for r in rows] == [[30, 300]]
    tags = influx_query(influxdb, f'SHOW TAG VALUES FROM {meas} WITH KEY = "agent"', "hm")
    assert tags == [["agent", "planner one,two"]]  # escaping survived the round trip
    failed = influx_query(
        influxdb, """SELECT count(value) FROM "gen_ai.tool.duration" WHERE ok = 'false'""", "hm"
    )
    assert failed[0][1] == 5
    collector.close()
    sink.close()


def test_influxdb_unreachable_is_kept_and_retried_until_close(tmp_path: Path) -> None:
    sink = InfluxDbSink(f"http://127.0.0.1:{free_port()}", "hm", max_attempts=2, backoff_s=0.01,
                        max_backoff_s=0.05, timeout_s=1.0)  # fmt: skip
    collector = ingest_all([sink], tmp_path)
    # unreachable is transient: the table is kept and retried past max_attempts, not given up
    wait_for(lambda: sink.statistics().retries >= 5, 30, "retries")
    st = sink.statistics()
    assert (st.failed_tables, st.dropped_tables, st.pushed_rows) == (0, 0, 0)
    assert "SinkUnavailable" in st.last_error
    assert collector.store.count() == 52  # the store is the record regardless
    collector.close()
    sink.close(timeout_s=0.2)
    assert sink.statistics().dropped_tables == 1  # closed while still failing: counted


def test_sink_refusal_is_permanent_after_max_attempts(tmp_path: Path) -> None:
    srv = _Http(lambda path, body: 400)
    try:
        sink = InfluxDbSink(srv.url, "hm", max_attempts=3, backoff_s=0.01)
        collector = ingest_all([sink], tmp_path)
        assert sink.wait_idle(30)
        st = sink.statistics()
        assert (st.failed_tables, st.retries, st.pushed_rows) == (1, 2, 0)
        assert "SinkRefused" in st.last_error
        collector.close()
        sink.close()
    finally:
        srv.close()


# -- ClickHouse (fake HTTP server) and OTLP (real exporter, local receiver) ------------------


class _Http:
    def __init__(self, handler: Callable[[str, bytes], int]) -> None:
        outer = self
        self.requests: list[tuple[str, bytes]] = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.requests.append((self.path, body))
                self.send_response(handler(self.path, body))
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_clickhouse_sink_posts_arrow_stream_and_retries(tmp_path: Path) -> None:
    calls = {"n": 0}

    def handler(path: str, body: bytes) -> int:
        calls["n"] += 1
        return 500 if calls["n"] == 1 else 200

    srv = _Http(handler)
    try:
        sink = ClickHouseSink(srv.url, "hm_metrics", backoff_s=0.01)
        collector = ingest_all([sink], tmp_path)
        assert sink.wait_idle(30)
        path, body = srv.requests[-1]
        q = urllib.parse.parse_qs(urllib.parse.urlparse(path).query)
        assert q["query"] == ["INSERT INTO hm_metrics FORMAT ArrowStream"]
        table = pa.ipc.open_stream(body).read_all()
        assert table.num_rows == 52 and sorted(set(table.column("seq").to_pylist())) == list(
            range(1, 53)
        )
        assert sink.statistics().retries == 1
        collector.close()
        sink.close()
    finally:
        srv.close()
    assert "ENGINE = MergeTree" in clickhouse_ddl("hm_metrics")


def test_otlp_exporter_posts_genai_metrics(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from hivemesh.telemetry.sinks.otlp import OtlpSink

    srv = _Http(lambda path, body: 200)
    try:
        sink = OtlpSink.http(srv.url, interval_s=3600)
        collector = ingest_all([sink], tmp_path)
        assert sink.wait_idle(30)
        sink.close()
        collector.close()
        assert srv.requests
        points: dict[str, float] = {}
        for path, body in srv.requests:
            assert path == "/v1/metrics"
            points = {}  # cumulative temporality: the last export holds the totals
            req = ExportMetricsServiceRequest()
            req.ParseFromString(body)
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.HasField("histogram"):
                            for dp in m.histogram.data_points:
                                attrs = {a.key: a.value.string_value for a in dp.attributes}
                                key = f"{m.name}|{attrs.get('gen_ai.token.type', '')}"
                                points[key] = points.get(key, 0) + dp.sum
        assert points["gen_ai.client.token.usage|input"] == 300
        assert points["gen_ai.client.token.usage|output"] == 60
        assert (
            abs(points["gen_ai.client.operation.duration|"] - (sum(range(100, 130)) + 140) / 1000)
            < 1e-6
        )
    finally:
        srv.close()


def test_sink_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        sinks_from_config({"kafka": {}})
    with pytest.raises(ConfigError):
        sinks_from_config({"influxdb": {}})
