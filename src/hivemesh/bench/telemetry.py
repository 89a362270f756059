"""``hivemesh bench telemetry``: many senders into one collector vs raw DuckDB inserts.

Setup: ``--senders`` spools (SQLite) are filled with a realistic mix of
records (LLM calls with model and token attributes, tool calls with
outcomes, counters). Then every sender drains its spool into one
:class:`~hivemesh.telemetry.collector.Collector` concurrently, through the
whole path: spool read, batch encoding, delivery (in-process call or the
loopback TCP transport), strict decoding and validation, de-duplication, group
commit into DuckDB, ack, spool delete. Points/s stored is counted from the
first send until every spool is empty (every record acked, so committed).

Baseline, same run, same rows: the same records, already as Python dicts,
turned into the store's columns and inserted into a fresh DuckDB table as
Arrow tables in chunks of the collector's mean flush size. That is the
cheapest way to get those rows into DuckDB from Python; the ratio says what
the spool, the wire format, validation and the protocol cost.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric

DESCRIPTION = "50 senders into one collector: points/s stored vs raw DuckDB batch insert"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Benchmark options."""
    parser.add_argument("--senders", type=int, default=50)
    parser.add_argument("--records", type=int, default=4000, help="records per sender")
    parser.add_argument("--batch", type=int, default=1000, help="records per delivered batch")
    parser.add_argument("--transport", choices=("inproc", "tcp"), default="inproc")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; best is kept")


def _records(sender: int, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ts = 1_764_000_000_000
    for i in range(n):
        r = i % 10
        if r < 5:
            rec: dict[str, Any] = {
                "ts_ms": ts + i, "kind": "llm_call", "name": "gen_ai.client.operation.duration",
                "value": 100.0 + (i * 7919) % 900, "unit": "ms", "agent": f"agent-{sender % 8}",
                "attrs": {
                    "gen_ai.request.model": ("gpt-4o-mini", "llama-3-8b", "claude-haiku")[i % 3],
                    "gen_ai.operation.name": "chat",
                    "gen_ai.usage.input_tokens": 200 + i % 1000,
                    "gen_ai.usage.output_tokens": 20 + i % 300,
                },
            }  # fmt: skip
        elif r < 8:
            rec = {
                "ts_ms": ts + i, "kind": "tool_call", "name": "gen_ai.tool.duration",
                "value": 5.0 + i % 50, "unit": "ms", "agent": f"agent-{sender % 8}",
                "attrs": {"gen_ai.tool.name": ("search", "browser", "python")[i % 3],
                          "gen_ai.operation.name": "execute_tool"},
            }  # fmt: skip
            if i % 17 == 0:
                rec["attrs"]["error.type"] = "TimeoutError"
        else:
            rec = {"ts_ms": ts + i, "kind": "counter", "name": "hivemesh.tasks.claimed",
                   "value": 1.0, "agent": f"agent-{sender % 8}"}  # fmt: skip
        out.append(rec)
    return out


async def _drain_all(spools: list[Any], collector: Any, batch: int, transport: str) -> float:
    from hivemesh.telemetry.loopback import TcpDeliver, serve_collector
    from hivemesh.telemetry.sender import Sender

    server = None
    delivers: list[Any] = []
    if transport == "tcp":
        server = await serve_collector(collector, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        delivers = [TcpDeliver("127.0.0.1", port, f"sender-{i}") for i in range(len(spools))]
    else:
        for i in range(len(spools)):

            async def deliver(payload: bytes, _name: str = f"sender-{i}") -> Mapping[str, Any]:
                ack: Mapping[str, Any] = await collector.ingest(_name, payload, True)
                return ack

            delivers.append(deliver)
    senders = [Sender(sp, d, batch_max=batch) for sp, d in zip(spools, delivers, strict=True)]
    t0 = time.perf_counter()
    ok = await asyncio.gather(*(s.flush(300) for s in senders))
    dt = time.perf_counter() - t0
    if server is not None:
        for d in delivers:
            d.close()
        server.close()
        await server.wait_closed()
    if not all(ok):
        raise RuntimeError("benchmark senders did not drain in time")
    return dt


def _raw_insert(path: str, recs: list[dict[str, Any]], chunk: int) -> float:
    import duckdb
    import pyarrow as pa  # type: ignore[import-untyped]

    from hivemesh.telemetry.store import COLUMNS

    names = [n for n, _ in COLUMNS]
    schema = pa.schema(list(COLUMNS))
    con = duckdb.connect(path)
    types = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE",
             pa.bool_(): "BOOLEAN"}  # fmt: skip
    con.execute("CREATE TABLE metrics(" + ", ".join(f"{n} {types[t]}" for n, t in COLUMNS) + ")")
    t0 = time.perf_counter()
    for start in range(0, len(recs), chunk):
        cols: dict[str, list[Any]] = {n: [] for n in names}
        for j, r in enumerate(recs[start : start + chunk]):
            a = r.get("attrs", {})
            cols["sender"].append("raw")
            cols["seq"].append(start + j + 1)
            cols["id"].append(None)
            cols["ts_ms"].append(r["ts_ms"])
            cols["recv_ms"].append(r["ts_ms"])
            cols["kind"].append(r["kind"])
            cols["name"].append(r["name"])
            cols["value"].append(r["value"])
            cols["unit"].append(r.get("unit", ""))
            cols["agent"].append(r.get("agent", ""))
            cols["model"].append(a.get("gen_ai.request.model"))
            cols["tool"].append(a.get("gen_ai.tool.name"))
            cols["operation"].append(a.get("gen_ai.operation.name"))
            cols["ok"].append("error.type" not in a)
            cols["error_type"].append(a.get("error.type"))
            cols["input_tokens"].append(a.get("gen_ai.usage.input_tokens"))
            cols["output_tokens"].append(a.get("gen_ai.usage.output_tokens"))
            cols["attrs"].append("")
        tbl = pa.Table.from_arrays([pa.array(cols[n], type=t) for n, t in COLUMNS], schema=schema)
        con.register("_raw", tbl)
        con.execute("INSERT INTO metrics SELECT * FROM _raw")
        con.unregister("_raw")
    dt = time.perf_counter() - t0
    con.close()
    return dt


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark and its raw-DuckDB baseline."""
    from hivemesh.telemetry.collector import Collector
    from hivemesh.telemetry.spool import Spool
    from hivemesh.telemetry.store import MetricsStore

    ours_runs: list[float] = []
    raw_runs: list[float] = []
    spool_runs: list[float] = []
    total = flushes = chunk = 0
    for rep in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="hm-bench-telemetry-"))
        try:
            all_recs: list[dict[str, Any]] = []
            spools = []
            t0 = time.perf_counter()
            for i in range(args.senders):
                recs = _records(i, args.records)
                all_recs.extend(recs)
                sp = Spool(tmp / f"s{i}.spool")
                sp.append_many(recs)
                spools.append(sp)
            spool_runs.append(time.perf_counter() - t0)
            total = len(all_recs)
            store = MetricsStore(str(tmp / "collector.duckdb"))
            collector = Collector(store)
            ours_runs.append(asyncio.run(_drain_all(spools, collector, args.batch, args.transport)))
            collector.close()
            stored = store.count()
            if stored != total:
                raise RuntimeError(f"run {rep}: stored {stored} of {total} records")
            store.close()
            for sp in spools:
                sp.close()
            flushes = collector.flushes
            chunk = max(1, collector.flushed_rows // max(1, collector.flushes))
            raw_runs.append(_raw_insert(str(tmp / "raw.duckdb"), all_recs, chunk))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    dt, raw_dt, spool_dt = min(ours_runs), min(raw_runs), min(spool_runs)
    ours = total / dt
    raw = total / raw_dt
    return BenchResult(
        name="telemetry",
        metrics=[
            Metric(
                name="points stored/s (end to end)",
                ours=ours,
                baseline=raw,
                unit="pts/s",
                baseline_name="raw duckdb",
                goal=">= 100k pts/s and >= 0.5x raw",
                goal_met=ours >= 100_000 and ours >= 0.5 * raw,
            )
        ],
        details={
            "senders": args.senders,
            "records": total,
            "transport": args.transport,
            "batch": args.batch,
            "flushes": flushes,
            "repeat": f"best of {args.repeat} runs each",
            "ours_runs_pts_per_s": [round(total / d) for d in ours_runs],
            "raw_runs_pts_per_s": [round(total / d) for d in raw_runs],
            "mean_flush_rows": chunk,
            "spool_append_pts_per_s": round(total / spool_dt),
        },
    )
