"""ClickHouse sink over its HTTP interface, as Arrow (``FORMAT ArrowStream``).

Theory of operation
-------------------
Each committed table is serialised once, in C++, to an Arrow IPC stream and
POSTed as ``INSERT INTO <table> FORMAT ArrowStream``: no per-row Python work,
and ClickHouse maps the columns by name. A 200 answer is success; anything
else is retried by the worker (see :mod:`._worker`).

The table is created by the sink itself: before its first insert, and again
whenever ClickHouse answers that the table is unknown (``Code: 60``), it
POSTs :func:`clickhouse_ddl` (``CREATE TABLE IF NOT EXISTS``, a
``MergeTree`` ordered by ``(sender, ts_ms)``; the key columns and the
columns the store never leaves empty are not ``Nullable``). With
``create=False`` it only inserts, and an unknown table keeps the rows queued
until an operator creates it.

Both request bodies are checked against a real ClickHouse engine (chdb,
in-process ClickHouse) in ``tests/test_telemetry_sink_engines.py``.
"""

from __future__ import annotations

import re
import urllib.parse

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.errors import InvalidArgument
from hivemesh.telemetry.sinks._worker import PushSink, check_status, http_post
from hivemesh.telemetry.store import COLUMNS

__all__ = ["ClickHouseSink", "clickhouse_ddl", "to_arrow_stream"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")
_CH_TYPES = {
    pa.string(): "String",
    pa.int64(): "Int64",
    pa.float64(): "Float64",
    pa.bool_(): "Bool",
}
#: Columns every stored row fills (the sort key among them): not ``Nullable``.
_NOT_NULL = frozenset({"sender", "ts_ms", "recv_ms", "kind", "name", "value", "unit", "ok"})
_UNKNOWN_TABLE = re.compile(rb"Code: 60\b|UNKNOWN_TABLE")


def _check_table(table: str) -> str:
    if not _IDENT.match(table):
        raise InvalidArgument(f"bad ClickHouse table name {table!r}")
    return table


def clickhouse_ddl(table: str = "hivemesh_metrics") -> str:
    """``CREATE TABLE IF NOT EXISTS`` for the store's columns in ClickHouse."""
    cols = ",\n  ".join(
        f"{n} {_CH_TYPES[t] if n in _NOT_NULL else f'Nullable({_CH_TYPES[t]})'}" for n, t in COLUMNS
    )
    return (
        f"CREATE TABLE IF NOT EXISTS {_check_table(table)} (\n  {cols}\n) ENGINE = MergeTree"
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
        self,
        url: str,
        table: str = "hivemesh_metrics",
        *,
        user: str = "",
        create: bool = True,
        **kw: float | int,
    ) -> None:
        self.table = _check_table(table)
        base = f"{url.rstrip('/')}/"
        params = {"user": user} if user else {}
        self.ddl_url = f"{base}?{urllib.parse.urlencode(params)}" if params else base
        params = {"query": f"INSERT INTO {table} FORMAT ArrowStream", **params}
        self.insert_url = f"{base}?{urllib.parse.urlencode(params)}"
        self.create = create
        self._table_known = not create
        super().__init__(**kw)  # type: ignore[arg-type]

    def push(self, table: pa.Table) -> None:
        """POST the table (creating the ClickHouse table first if needed);
        raise unless ClickHouse answers 200."""
        if not self._table_known:
            self.create_table()
        body = to_arrow_stream(table)
        status, answer = http_post(self.insert_url, body, "application/octet-stream",
                                   self.timeout_s)  # fmt: skip
        if status != 200 and self.create and _UNKNOWN_TABLE.search(answer):
            self.create_table()  # dropped meanwhile
            status, answer = http_post(self.insert_url, body, "application/octet-stream",
                                       self.timeout_s)  # fmt: skip
        check_status("clickhouse", status, 200, answer)

    def create_table(self) -> None:
        """POST :func:`clickhouse_ddl` (idempotent); raise on failure."""
        status, answer = http_post(
            self.ddl_url, clickhouse_ddl(self.table).encode(), "text/plain", self.timeout_s
        )
        check_status("clickhouse", status, 200, answer)
        self._table_known = True
