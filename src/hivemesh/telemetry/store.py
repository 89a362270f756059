"""The collector's embedded analytics store (DuckDB).

Theory of operation
-------------------
One DuckDB file holds:

* ``metrics``: one row per stored record (see :data:`COLUMNS`), keyed by
  ``(sender, seq)`` (``id`` is set only for hand-sent records without a seq,
  which are de-duplicated by it); the GenAI
  attributes the queries need (model, tool, tokens, error type) are hoisted
  into columns, the rest kept as JSON text in ``attrs``;
* ``senders``: per sender the sequence-tracker state (stored ranges, the
  announced high seq), its last reported spool backlog and last contact;
* ``counters``: the collector's counters (accepted, duplicates, rejections by
  error code);
* ``alerts``: the health monitor's alerts, firing and resolved.

Rows arrive as columns and are inserted as one Arrow table per flush, in the
same transaction as the sender states that say they are stored: after a crash
the two always agree, which is what makes de-duplication across collector
restarts exact. Never row by row (DuckDB's ``executemany`` is ~100x slower).

DuckDB lets only one process open a file for writing; the CLI opens the file
read-only and must run while the collector is stopped (or on a copy).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.errors import InvalidArgument, StoreError
from hivemesh.stores.private import PRIVATE_FILE

__all__ = ["COLUMNS", "DICT_SCHEMA", "MetricsStore", "parse_since"]

#: Columns of the ``metrics`` table, in order, with their Arrow types.
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("sender", pa.string()),
    ("seq", pa.int64()),
    ("id", pa.string()),
    ("ts_ms", pa.int64()),
    ("recv_ms", pa.int64()),
    ("kind", pa.string()),
    ("name", pa.string()),
    ("value", pa.float64()),
    ("unit", pa.string()),
    ("agent", pa.string()),
    ("model", pa.string()),
    ("tool", pa.string()),
    ("operation", pa.string()),
    ("ok", pa.bool_()),
    ("error_type", pa.string()),
    ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("attrs", pa.string()),
)
_SCHEMA = pa.schema(list(COLUMNS))
#: :data:`COLUMNS` with every string column dictionary-encoded (int32 indices): how a
#: columnar batch arrives (:mod:`.columnar`) -- its few distinct strings are never
#: copied out per row; DuckDB inserts it into the same VARCHAR columns.
DICT_SCHEMA = pa.schema(
    [(n, pa.dictionary(pa.int32(), pa.string()) if t == pa.string() else t) for n, t in COLUMNS]
)
_DDL_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}
_SENDER_SCHEMA = pa.schema(
    [
        ("sender", pa.string()),
        ("state", pa.string()),
        ("backlog", pa.int64()),
        ("last_seen_ms", pa.int64()),
    ]
)
_BY = {
    "agent": ("agent", "TRUE"),
    "model": ("model", "kind = 'llm_call'"),
    "tool": ("tool", "kind = 'tool_call'"),
    "sender": ("sender", "TRUE"),
    "name": ("name", "TRUE"),
}
_SINCE_RE = re.compile(r"(\d+)(ms|s|m|h|d)\Z")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str) -> int:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"`` -> milliseconds."""
    m = _SINCE_RE.match(text.strip())
    if not m:
        raise InvalidArgument(f"bad duration {text!r} (use e.g. 30s, 15m, 1h, 2d)")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


class MetricsStore:
    """A DuckDB file (or ``":memory:"``) with the telemetry tables."""

    def __init__(self, path: str = ":memory:", *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        try:
            self._con = duckdb.connect(path, read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open metrics store {path}: {exc}") from exc
        # DuckDB creates its file and WAL by the umask and cannot open an
        # empty file made private first: each is made private once it exists.
        self._private: list[str] = [] if read_only or path == ":memory:" else [path, f"{path}.wal"]
        if not read_only:
            cols = ", ".join(f"{n} {_DDL_TYPES[t]}" for n, t in COLUMNS)
            self._con.execute(f"CREATE TABLE IF NOT EXISTS metrics({cols})")
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS senders(sender VARCHAR PRIMARY KEY, state VARCHAR,"
                " backlog BIGINT, last_seen_ms BIGINT)"
            )
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS counters(code VARCHAR PRIMARY KEY, n BIGINT)"
            )
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS alerts(key VARCHAR PRIMARY KEY, rule VARCHAR,"
                " subject VARCHAR, severity VARCHAR, status VARCHAR, summary VARCHAR,"
                " value DOUBLE, started_ms BIGINT, updated_ms BIGINT)"
            )
        self._keep_private()

    def _keep_private(self) -> None:
        """Mode 0600 for the store's files that exist (after each write: a
        checkpoint removes the WAL, the next write makes a new one)."""
        for name in self._private:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(name).st_mode & 0o077:
                    os.chmod(name, PRIVATE_FILE)

    # -- writing ---------------------------------------------------------------

    @staticmethod
    def table_from_rows(rows: Sequence[Sequence[Any]]) -> pa.Table:
        """Build the Arrow table of one flush from row tuples in :data:`COLUMNS` order."""
        cols = list(zip(*rows, strict=True))
        arrays = [pa.array(c, type=t) for c, (_, t) in zip(cols, COLUMNS, strict=True)]
        return pa.Table.from_arrays(arrays, schema=_SCHEMA)

    @staticmethod
    def batch_from_rows(rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
        """One Arrow record batch from row tuples in :data:`COLUMNS` order."""
        cols = list(zip(*rows, strict=True))
        arrays = [pa.array(c, type=t) for c, (_, t) in zip(cols, COLUMNS, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMA)

    @staticmethod
    def batch_from_columns(columns: Sequence[Sequence[Any]]) -> pa.RecordBatch:
        """One Arrow record batch from per-column lists in :data:`COLUMNS` order."""
        arrays = [pa.array(c, type=t) for c, (_, t) in zip(columns, COLUMNS, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMA)

    @staticmethod
    def table_from_batches(batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """Concatenate record batches into one table: zero-copy when they share a
        schema (:data:`COLUMNS` or :data:`DICT_SCHEMA`), else as plain strings."""
        if not batches:
            return _SCHEMA.empty_table()
        schema = batches[0].schema
        if any(b.schema != schema for b in batches):
            batches = [b if b.schema == _SCHEMA else b.cast(_SCHEMA) for b in batches]
            schema = _SCHEMA
        return pa.Table.from_batches(batches, schema=schema)

    @staticmethod
    def plain(table: pa.Table) -> pa.Table:
        """``table`` with plain (not dictionary-encoded) strings: :data:`COLUMNS`."""
        return table if table.schema == _SCHEMA else table.cast(_SCHEMA)

    @staticmethod
    def table_from_columns(columns: Mapping[str, Sequence[Any]]) -> pa.Table:
        """Build the Arrow table of one flush from per-column lists."""
        arrays = [pa.array(columns[name], type=t) for name, t in COLUMNS]
        return pa.Table.from_arrays(arrays, schema=_SCHEMA)

    def write(
        self,
        table: pa.Table | None,
        senders: Sequence[tuple[str, dict[str, Any], int, int]],
        counters: Mapping[str, int],
    ) -> None:
        """Insert ``table`` and upsert sender states and counters in one transaction.

        ``senders`` holds ``(sender, tracker_state, backlog, last_seen_ms)``.
        """
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            if table is not None and table.num_rows:
                con.register("_hm_rows", table)
                con.execute("INSERT INTO metrics SELECT * FROM _hm_rows")
                con.unregister("_hm_rows")
            if senders:
                st = pa.Table.from_pylist(
                    [
                        {"sender": s, "state": json.dumps(state), "backlog": b, "last_seen_ms": t}
                        for s, state, b, t in senders
                    ],
                    schema=_SENDER_SCHEMA,
                )
                con.register("_hm_senders", st)
                con.execute("INSERT OR REPLACE INTO senders SELECT * FROM _hm_senders")
                con.unregister("_hm_senders")
            if counters:
                ct = pa.table(
                    {"code": list(counters), "n": [int(v) for v in counters.values()]},
                    schema=pa.schema([("code", pa.string()), ("n", pa.int64())]),
                )
                con.register("_hm_counters", ct)
                con.execute("INSERT OR REPLACE INTO counters SELECT * FROM _hm_counters")
                con.unregister("_hm_counters")
            con.execute("COMMIT")
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise StoreError(f"metrics store write failed: {exc}") from exc
        finally:
            self._keep_private()

    def existing_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` are already stored (for records without a seq)."""
        if not ids:
            return set()
        t = pa.table({"id": list(ids)})
        self._con.register("_hm_ids", t)
        try:
            rows = self._con.execute(
                "SELECT DISTINCT m.id FROM metrics m JOIN _hm_ids i ON m.id = i.id"
            ).fetchall()
        finally:
            self._con.unregister("_hm_ids")
        return {r[0] for r in rows}

    def save_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Upsert alert rows (keys as in :meth:`alerts`)."""
        if not alerts:
            return
        fields: tuple[str, ...] = ("key", "rule", "subject", "severity", "status", "summary")
        fields += ("value",)
        fields += ("started_ms", "updated_ms")
        t = pa.Table.from_pylist([{f: a.get(f) for f in fields} for a in alerts])
        t = t.cast(
            pa.schema(
                [(f, pa.string()) for f in fields[:6]]
                + [("value", pa.float64()), ("started_ms", pa.int64()), ("updated_ms", pa.int64())]
            )
        )
        self._con.register("_hm_alerts", t)
        try:
            self._con.execute("INSERT OR REPLACE INTO alerts SELECT * FROM _hm_alerts")
        finally:
            self._con.unregister("_hm_alerts")
            self._keep_private()

    # -- reading ---------------------------------------------------------------

    def load_senders(self) -> list[tuple[str, dict[str, Any], int, int]]:
        """Every sender's ``(sender, tracker_state, backlog, last_seen_ms)``."""
        rows = self._con.execute(
            "SELECT sender, state, backlog, last_seen_ms FROM senders ORDER BY sender"
        ).fetchall()
        return [(s, json.loads(st), int(b or 0), int(t or 0)) for s, st, b, t in rows]

    def load_counters(self) -> dict[str, int]:
        """The persisted counters."""
        return {c: int(n) for c, n in self._con.execute("SELECT code, n FROM counters").fetchall()}

    def query(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run any SQL; return (column names, rows)."""
        try:
            cur = self._con.execute(sql, list(params))
            rows = cur.fetchall()
            names = [d[0] for d in (cur.description or [])]
        except duckdb.Error as exc:
            raise InvalidArgument(f"query failed: {exc}") from exc
        return names, rows

    def top(
        self, by: str = "agent", since_ms: int | None = None, now_ms: int = 0, limit: int = 20
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Calls, failures, failure rate, tokens and p50/p99 duration per ``by``.

        ``tokens`` is input plus output tokens, or the total a record carries
        when it does not split them (``gen_ai.usage.total_tokens``)."""
        if by not in _BY:
            raise InvalidArgument(f"--by must be one of {sorted(_BY)}")
        col, where = _BY[by]
        params: list[Any] = []
        if since_ms is not None:
            where += " AND ts_ms >= ?"
            params.append(now_ms - since_ms)
        return self.query(
            f"SELECT {col} AS {by}, count(*) AS records,"
            " count(*) FILTER (WHERE NOT ok) AS failures,"
            " round(count(*) FILTER (WHERE NOT ok) / count(*), 4) AS failure_rate,"
            " coalesce(sum(input_tokens), 0) AS input_tokens,"
            " coalesce(sum(output_tokens), 0) AS output_tokens,"
            " coalesce(sum(coalesce(input_tokens + output_tokens, input_tokens, output_tokens,"
            " TRY_CAST(json_extract_string(NULLIF(attrs, ''),"
            " '$.\"gen_ai.usage.total_tokens\"') AS BIGINT))), 0) AS tokens,"
            " round(quantile_cont(value, 0.5) FILTER (WHERE unit = 'ms'), 3) AS p50_ms,"
            " round(quantile_cont(value, 0.99) FILTER (WHERE unit = 'ms'), 3) AS p99_ms"
            f" FROM metrics WHERE {where} GROUP BY {col} ORDER BY records DESC, {by} LIMIT ?",
            [*params, limit],
        )

    def rates(
        self, by: str, window_ms: int, now_ms: int, kinds: Sequence[str]
    ) -> list[tuple[str, int, int, float | None]]:
        """``(key, records, failures, p99_ms)`` per ``by`` over the last ``window_ms``."""
        col, _ = _BY[by]
        kind_list = ", ".join("?" for _ in kinds)
        _, rows = self.query(
            f"SELECT {col}, count(*), count(*) FILTER (WHERE NOT ok),"
            " quantile_cont(value, 0.99) FILTER (WHERE unit = 'ms')"
            f" FROM metrics WHERE ts_ms >= ? AND kind IN ({kind_list}) AND {col} IS NOT NULL"
            f" AND {col} <> '' GROUP BY {col} ORDER BY {col}",
            [now_ms - window_ms, *kinds],
        )
        return [(str(k), int(n), int(f), p) for k, n, f, p in rows]

    def alerts(self, *, active_only: bool = False) -> list[dict[str, Any]]:
        """Alerts, newest first (``active_only``: firing ones)."""
        where = "WHERE status = 'firing'" if active_only else ""
        names, rows = self.query(f"SELECT * FROM alerts {where} ORDER BY updated_ms DESC, key")
        return [dict(zip(names, r, strict=True)) for r in rows]

    def count(self) -> int:
        """Rows in ``metrics``."""
        row = self._con.execute("SELECT count(*) FROM metrics").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Checkpoint and close."""
        try:
            if not self.read_only:
                self._con.execute("CHECKPOINT")
        finally:
            self._con.close()
