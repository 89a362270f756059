"""InfluxDB 1.x sink: line protocol over HTTP (``POST /write?db=..&precision=ns``).

Theory of operation
-------------------
Each committed table becomes one request body of line-protocol lines, one per
record::

    gen_ai.client.operation.duration,agent=planner,kind=llm_call,model=gpt-4o,ok=true,\
sender=hm3k... value=812.5,input_tokens=1200i,output_tokens=85i 1764405000123001021

The measurement is the record name; low-cardinality columns (kind, agent,
model, tool, operation, ok, sender) are tags, numbers are fields. InfluxDB
keeps one point per measurement, tag set and timestamp (a second write
*replaces* the first), and one sender easily makes several records with the
same tags in one millisecond: so the timestamp is the record's ``ts_ms`` in
nanoseconds plus a tie-break below the millisecond -- its ``seq`` modulo a
million (or a CRC of its ``id`` when it has no seq) -- which keeps every
record of a sender apart while it reads as the same millisecond. Escaping
follows the line-protocol rules (commas, spaces and ``=`` in tags; commas and
spaces in measurements). InfluxDB answers 204 on success; anything else is a
failure the worker retries (see :mod:`._worker`).

A database that does not exist yet (``404 database not found``) is created
(``CREATE DATABASE``, idempotent in InfluxDB 1.x) and the same body written
again at once. If it cannot be created (no admin rights), the table stays
queued and is retried until an operator creates the database: no row sent
before the database exists is lost.
"""

from __future__ import annotations

import urllib.parse
import zlib

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.telemetry.errors import SinkUnavailable
from hivemesh.telemetry.sinks._worker import PushSink, check_status, http_post

__all__ = ["InfluxDbSink", "to_line_protocol"]

_NS_PER_MS = 1_000_000
_TAGS = ("agent", "kind", "model", "ok", "operation", "sender", "tool")  # sorted, as Influx likes
_MEAS_ESC = str.maketrans({",": r"\,", " ": r"\ ", "\n": " "})
_TAG_ESC = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\=", "\n": " "})


def to_line_protocol(table: pa.Table) -> bytes:
    """The line-protocol body for a table of store rows."""
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    out: list[str] = []
    for i in range(table.num_rows):
        tags = []
        for t in _TAGS:
            v = cols[t][i]
            if v is None or v == "":
                continue
            sv = ("true" if v else "false") if t == "ok" else str(v)
            tags.append(f"{t}={sv.translate(_TAG_ESC)}")
        fields = [f"value={float(cols['value'][i])!r}"]
        for f in ("input_tokens", "output_tokens"):
            v = cols[f][i]
            if v is not None:
                fields.append(f"{f}={int(v)}i")
        meas = str(cols["name"][i]).translate(_MEAS_ESC)
        head = f"{meas},{','.join(tags)}" if tags else meas
        seq, rid = cols["seq"][i], cols["id"][i]
        tie = seq if seq is not None else zlib.crc32(str(rid).encode()) if rid else 0
        ts_ns = int(cols["ts_ms"][i]) * _NS_PER_MS + tie % _NS_PER_MS
        out.append(f"{head} {','.join(fields)} {ts_ns}")
    return ("\n".join(out) + "\n").encode()


class InfluxDbSink(PushSink):
    """Mirrors committed rows into an InfluxDB 1.x database."""

    name = "influxdb"

    def __init__(self, url: str, database: str, **kw: float | int) -> None:
        base = url.rstrip("/")
        query = urllib.parse.urlencode({"db": database, "precision": "ns"})
        self.database = database
        self.write_url = f"{base}/write?{query}"
        self.query_url = f"{base}/query"
        #: How many times this sink created its database.
        self.created = 0
        super().__init__(**kw)  # type: ignore[arg-type]

    def push(self, table: pa.Table) -> None:
        """POST the table as line protocol (creating the database if it is
        missing); raise unless InfluxDB answers 204."""
        body = to_line_protocol(table)
        status, answer = http_post(self.write_url, body, "text/plain", self.timeout_s)
        if status == 404 and b"database not found" in answer:
            self.create_database()
            status, answer = http_post(self.write_url, body, "text/plain", self.timeout_s)
        check_status("influxdb", status, 204, answer)

    def create_database(self) -> None:
        """``CREATE DATABASE`` (a no-op when it exists); raise SinkUnavailable on failure."""
        name = self.database.replace("\\", "\\\\").replace('"', '\\"')
        form = urllib.parse.urlencode({"q": f'CREATE DATABASE "{name}"'}).encode()
        status, answer = http_post(
            self.query_url, form, "application/x-www-form-urlencoded", self.timeout_s
        )
        if status != 200 or b'"error"' in answer:
            text = answer[:200].decode("utf-8", "replace")
            raise SinkUnavailable(
                f"influxdb database {self.database!r} does not exist and creating it failed"
                f" ({status}: {text}); the rows wait until it exists"
            )
        self.created += 1
