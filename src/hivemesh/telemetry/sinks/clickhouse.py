"""ClickHouse sink over its HTTP interface, as Arrow (``FORMAT ArrowStream``).

Theory of operation
-------------------
Each committed table is serialised once, in C++, to an Arrow IPC stream and
POSTed as ``INSERT INTO <table> FORMAT ArrowStream``: no per-row Python work,
and ClickHouse maps the columns by name. :func:`clickhouse_ddl` gives a
matching ``MergeTree`` table definition. A 200 answer is success; anything else
is retried by the worker (see :mod:`._worker`).

(Tested against a local fake HTTP server that decodes the Arrow stream:
Debian's clickhouse-server package is from 2018 and unusable here.)
"""

from __future__ import annotations

import re
import urllib.parse

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.errors import InvalidArgument
from hivemesh.telemetry.sinks._worker import PushSink, http_post
from hivemesh.telemetry.store import COLUMNS

__all__ = ["ClickHouseSink", "clickhouse_ddl", "to_arrow_stream"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")
_CH_TYPES = {
    pa.string(): "Nullable(String)",
    pa.int64(): "Nullable(Int64)",
    pa.float64(): "Float64",
    pa.bool_(): "Bool",
}


def clickhouse_ddl(table: str = "hivemesh_metrics") -> str:
    """``CREATE TABLE`` for the store's columns in ClickHouse."""
    if not _IDENT.match(table):
        raise InvalidArgument(f"bad ClickHouse table name {table!r}")
    cols = ",\n  ".join(f"{n} {_CH_TYPES[t]}" for n, t in COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (\n  {cols}\n) ENGINE = MergeTree"
        " ORDER BY (sender, ts_ms)"
    )


def to_arrow_stream(table: pa.Table) -> bytes:
    """The table as Arrow IPC stream bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


class ClickHouseSink(PushSink):
    """Mirrors committed rows into a ClickHouse table over HTTP."""

    name = "clickhouse"

    def __init__(
        self, url: str, table: str = "hivemesh_metrics", *, user: str = "", **kw: float | int
    ) -> None:
        if not _IDENT.match(table):
            raise InvalidArgument(f"bad ClickHouse table name {table!r}")
        params = {"query": f"INSERT INTO {table} FORMAT ArrowStream"}
        if user:
            params["user"] = user
        self.insert_url = f"{url.rstrip('/')}/?{urllib.parse.urlencode(params)}"
        super().__init__(**kw)  # type: ignore[arg-type]

    def push(self, table: pa.Table) -> None:
        """POST the table; raise unless ClickHouse answers 200."""
        status, body = http_post(
            self.insert_url, to_arrow_stream(table), "application/octet-stream", self.timeout_s
        )
        if status != 200:
            raise RuntimeError(f"clickhouse answered {status}: {body[:200]!r}")
