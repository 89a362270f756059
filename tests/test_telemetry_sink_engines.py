"""The push sinks against real engines, with their exact request bodies.

* ClickHouse: chdb (ClickHouse in-process, from PyPI) executes what the sink
  POSTs -- the DDL it sends and the ``INSERT ... FORMAT ArrowStream`` with its
  Arrow body -- behind a small HTTP front that speaks ClickHouse's HTTP
  interface (the SQL is the ``query`` parameter followed by the body; errors
  are answered like ClickHouse does: ``Code: N. DB::Exception: ...`` with the
  code in ``X-ClickHouse-Exception-Code`` and 404 for an unknown table). The
  rows read back from the engine must equal the rows the collector stored.
* InfluxDB: the real server on 127.0.0.1:8086 (scripts/services.d starts it
  in CI), into a database that does not exist when the first rows are sent.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from hivemesh.telemetry.collector import Collector  # noqa: E402
from hivemesh.telemetry.sinks.clickhouse import ClickHouseSink  # noqa: E402
from hivemesh.telemetry.sinks.influxdb import InfluxDbSink  # noqa: E402
from hivemesh.telemetry.store import COLUMNS, MetricsStore  # noqa: E402

NOW = 1_900_000_000_000
INFLUX = "http://127.0.0.1:8086"


def records(n: int, first_seq: int = 1) -> list[dict[str, Any]]:
    """A mix of every kind, nulls, attributes, escapes and non-ASCII text."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        seq = first_seq + i
        # four records in each millisecond: InfluxDB must still keep every one
        r: dict[str, Any] = {"seq": seq, "ts_ms": NOW + seq // 4, "value": float(seq) / 4}
        if i % 3 == 0:
            r |= {"kind": "llm_call", "name": "gen_ai.client.operation.duration", "unit": "ms",
                  "agent": "planner, one=1", "attrs": {"gen_ai.request.model": "gpt-x",
                  "gen_ai.usage.input_tokens": seq, "gen_ai.usage.output_tokens": 2,
                  "gen_ai.operation.name": "chat", "temperature": 0.5}}  # fmt: skip
        elif i % 3 == 1:
            attrs: dict[str, Any] = {"gen_ai.tool.name": "search", "note": 'é "q" \\'}
            if i % 4 == 1:
                attrs["error.type"] = "Timeout"
            r |= {"kind": "tool_call", "name": "gen_ai.tool.duration", "unit": "ms",
                  "agent": "exec", "attrs": attrs}  # fmt: skip
        else:
            r |= {"kind": "counter", "name": "tasks.claimed", "agent": ""}
        out.append(r)
    return out


def store_rows(collector: Collector) -> list[dict[str, Any]]:
    names, rows = collector.store.query("SELECT * FROM metrics ORDER BY sender, seq")
    return [dict(zip(names, r, strict=True)) for r in rows]


# -- ClickHouse through chdb -------------------------------------------------------------

_INSERT = re.compile(r"(?is)\s*(INSERT\s+INTO\s+\S+(?:\s*\([^)]*\))?)\s+FORMAT\s+(\w+)\s*\Z")
_CODE = re.compile(r"Code: (\d+)\.")


class ChdbHttp:
    """ClickHouse's HTTP interface (POST) in front of a chdb session."""

    def __init__(self, path: Path) -> None:
        from chdb import session

        self.session = session.Session(str(path))
        self.lock = threading.Lock()
        self.requests: list[tuple[str, bytes, int]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                status, answer = outer.execute(query.get("query", [""])[0], body)
                outer.requests.append((self.path, body, status))
                self.send_response(status)
                m = _CODE.search(answer.decode(errors="replace"))
                if m:
                    self.send_header("X-ClickHouse-Exception-Code", m.group(1))
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def execute(self, query: str, body: bytes) -> tuple[int, bytes]:
        """Run ``query`` + ``body`` the way ClickHouse's HTTP handler does."""
        with self.lock:
            try:
                m = _INSERT.match(query) if query else None
                if m is not None:  # the body is data in the named input format
                    with self.session.send_insert(m.group(1), m.group(2)) as ins:
                        ins.append(body)
                        ins.finish()
                else:  # the SQL is the query parameter followed by the body
                    self.session.query(query + body.decode())
            except Exception as exc:
                text = str(exc).encode()
                code = _CODE.search(str(exc))
                return (404 if code and code.group(1) in ("60", "81") else 500), text
        return 200, b""

    def table(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            got = self.session.query(f"SELECT * FROM {name} ORDER BY sender, seq", "ArrowTable")
        rows: list[dict[str, Any]] = got.to_pylist()
        return rows

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.session.close()


@pytest.fixture
def chdb_http(tmp_path: Path) -> Iterator[ChdbHttp]:
    pytest.importorskip("chdb", reason="pip install chdb (the test extra)")
    srv = ChdbHttp(tmp_path / "ch")
    try:
        yield srv
    finally:
        srv.close()


def test_clickhouse_sink_bodies_run_on_a_real_engine(tmp_path: Path, chdb_http: ChdbHttp) -> None:
    # The table does not exist yet: the sink creates it with its own DDL, then inserts.
    sink = ClickHouseSink(chdb_http.url, "hm_metrics", backoff_s=0.01, max_attempts=3)
    collector = Collector(MetricsStore(str(tmp_path / "m.duckdb")), sinks=[sink])
    try:
        for sender, first in (("hm-a", 1), ("hm-b", 1), ("hm-a", 61)):
            ack = collector.ingest_now(sender, {"records": records(60, first)}, True)
            assert ack["accepted"] == 60, ack
        # a hand-sent record: no seq, an id, nulls in most columns
        ack = collector.ingest_now(
            "hm-c", {"records": [{"name": "x", "value": 1, "id": "h1"}]}, True
        )
        assert ack["accepted"] == 1
        assert sink.wait_idle(60)
        errors = [(p, b[:300], s) for p, b, s in chdb_http.requests if s != 200]
        st = sink.statistics()
        assert (st.failed_tables, st.pushed_rows) == (0, 181), (st, errors)
        got = chdb_http.table("hm_metrics")
        want = store_rows(collector)
        assert len(got) == len(want) == 181
        assert [n for n, _ in COLUMNS] == list(got[0])
        assert got == want
    finally:
        collector.close()
        sink.close()


def test_clickhouse_sink_recreates_a_dropped_table(tmp_path: Path, chdb_http: ChdbHttp) -> None:
    sink = ClickHouseSink(chdb_http.url, "hm_metrics", backoff_s=0.01, max_attempts=3)
    collector = Collector(MetricsStore(str(tmp_path / "m.duckdb")), sinks=[sink])
    try:
        collector.ingest_now("hm-a", {"records": records(10)}, True)
        assert sink.wait_idle(60)
        chdb_http.execute("DROP TABLE hm_metrics", b"")
        collector.ingest_now("hm-a", {"records": records(10, 11)}, True)
        assert sink.wait_idle(60)
        assert sink.statistics().failed_tables == 0
        assert [r["seq"] for r in chdb_http.table("hm_metrics")] == list(range(11, 21))
    finally:
        collector.close()
        sink.close()


# -- InfluxDB (the server on 127.0.0.1:8086) ---------------------------------------------


def influx(q: str, db: str = "") -> list[list[Any]]:
    params = {"q": q, **({"db": db} if db else {})}
    req = urllib.request.Request(f"{INFLUX}/query", data=urllib.parse.urlencode(params).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        res = json.loads(r.read())["results"][0]
    assert "error" not in res, res
    series = res.get("series") or []
    return [v for s in series for v in s.get("values", [])]


@pytest.fixture
def influx_db() -> Iterator[str]:
    try:
        with urllib.request.urlopen(f"{INFLUX}/ping", timeout=5) as r:
            assert r.status == 204
    except (OSError, urllib.error.URLError) as exc:
        pytest.fail(f"InfluxDB is not running on {INFLUX} (scripts/services.sh starts it): {exc}")
    db = f"hm_test_{uuid.uuid4().hex[:12]}"
    assert [db] not in influx("SHOW DATABASES")
    try:
        yield db
    finally:
        influx(f'DROP DATABASE "{db}"')


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < end:
        last = cond()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def test_influxdb_database_missing_at_first_write_loses_nothing(
    tmp_path: Path, influx_db: str
) -> None:
    sink = InfluxDbSink(INFLUX, influx_db, backoff_s=0.05)
    collector = Collector(MetricsStore(str(tmp_path / "m.duckdb")), sinks=[sink])
    try:
        for first in range(1, 301, 100):
            assert collector.ingest_now("hm-a", {"records": records(100, first)}, True)["ok"]
        assert sink.wait_idle(60)
        st = sink.statistics()
        assert (st.failed_tables, st.dropped_tables, st.pushed_rows) == (0, 0, 300), st
        counts = influx('SELECT count("value") FROM /.*/ GROUP BY *', influx_db)
        assert sum(c[1] for c in counts) == 300
        (row,) = influx('SELECT sum("input_tokens") FROM "gen_ai.client.operation.duration"',
                        influx_db)  # fmt: skip
        assert row[1] == collector.store.query("SELECT sum(input_tokens) FROM metrics")[1][0][0]
    finally:
        collector.close()
        sink.close()
