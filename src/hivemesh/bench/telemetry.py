"""``hivemesh bench telemetry``: many senders into one collector vs raw DuckDB inserts.

Setup: ``--senders`` spools (SQLite) are filled with a realistic mix of
records (LLM calls with model and token attributes, tool calls with
outcomes, counters). Then every sender drains its spool into one
:class:`~hivemesh.telemetry.collector.Collector` concurrently, through the
whole path: spool read, batch encoding, delivery, strict decoding and
validation, de-duplication, group commit into DuckDB, ack, spool delete.
Points/s stored is counted from the first send until every spool is empty
(every record acked, hence committed); the stored row count is checked.

Layouts: ``mesh`` (default) is the deployed path: the collector is a node
(``hivemesh up --collector``) and every sender is a real node with its own
identity, spool, listener and Noise channel to it; records travel as
columnar batches in acknowledged direct requests over the encrypted mesh
(:mod:`hivemesh.bench._telemetry_mesh`). The 50 sender nodes are hosted
``--per-process`` (default 10) to an OS process, so that 50 interpreters do
not fight over a 2-core machine; ``--per-process 1`` runs each as its own
``hivemesh up`` process. ``single`` runs senders and collector in one
process without the mesh (``--transport inproc`` calls ``ingest`` directly,
``tcp`` goes through a bare loopback protocol); ``split`` runs that collector
in its own process and the senders in another, over loopback TCP.

Baselines, same run, same rows: the same records, already as Python dicts,
turned into the store's columns and inserted into a fresh DuckDB table as
Arrow tables -- (1) in chunks of the collector's mean group-commit flush, the
best DuckDB does from Python: the goal is held against this one; (2) in the
batches the collector received (``--batch`` rows, or the daemon's 5,000 for
``mesh``; one insert each), which group commit beats. The ratios say what
the spool, the wire, validation and the protocol cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import shutil
import signal
import subprocess
import sys
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
    parser.add_argument(
        "--layout",
        choices=("mesh", "single", "split"),
        default="mesh",
        help="mesh (default): sender nodes and a collector node over the real mesh; "
        "single: one process, no mesh; split: collector and senders in two processes "
        "over a bare loopback TCP protocol",
    )
    parser.add_argument(
        "--transport", choices=("inproc", "tcp"), default="inproc", help="for --layout single"
    )
    parser.add_argument(
        "--per-process",
        type=int,
        default=10,
        help="for --layout mesh: sender nodes hosted per OS process (1: each its own "
        "hivemesh up process)",
    )
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
    c0 = time.process_time()  # this process, DuckDB's threads included
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
    _RAW_CPU_S.append(time.process_time() - c0)
    con.close()
    return dt


#: CPU seconds of each raw insert, in call order (read by :func:`run`).
_RAW_CPU_S: list[float] = []


def _line(proc: subprocess.Popen[str], prefix: str, timeout_s: float) -> str:
    assert proc.stdout is not None
    end = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while time.monotonic() < end:
            if sel.select(timeout=max(0.0, end - time.monotonic())):
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith(prefix):
                    return line.split(None, 1)[1].strip() if " " in line else ""
    finally:
        sel.close()
    raise RuntimeError(f"benchmark process gave no {prefix!r} line in {timeout_s}s")


def _split_run(tmp: Path, batch: int) -> tuple[float, int, int]:
    """Collector and senders in two processes over loopback TCP: (seconds, flushes, rows)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "hivemesh.telemetry.loopback"]
    col = subprocess.Popen(
        [*cmd, "collector", "--store", str(tmp / "collector.duckdb")],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    drain = None
    try:
        port = _line(col, "READY", 60)
        drain = subprocess.Popen(
            [*cmd, "drain", "--dir", str(tmp), "--port", port, "--batch", str(batch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        _line(drain, "READY", 60)
        assert drain.stdin is not None
        drain.stdin.write("GO\n")
        drain.stdin.flush()
        dt_s, ok = _line(drain, "DONE", 600).split()
        if ok != "1":
            raise RuntimeError("benchmark senders did not drain in time")
        col.send_signal(signal.SIGTERM)
        flushes, rows = _line(col, "STATS", 60).split()
        col.wait(timeout=60)
        return float(dt_s), int(flushes), int(rows)
    finally:
        for p in (drain, col):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _count(path: Path) -> int:
    from hivemesh.telemetry.store import MetricsStore

    store = MetricsStore(str(path), read_only=True)
    try:
        return store.count()
    finally:
        store.close()


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark and its raw-DuckDB baselines."""
    from hivemesh.telemetry.collector import Collector
    from hivemesh.telemetry.schema import MAX_BATCH_RECORDS
    from hivemesh.telemetry.spool import Spool
    from hivemesh.telemetry.store import MetricsStore

    ours_runs: list[float] = []
    raw_batch_runs: list[float] = []
    raw_flush_runs: list[float] = []
    mesh_runs: list[Any] = []
    raw_flush_cpu: list[float] = []
    # the mesh layout sends what the daemon sends: up to MAX_BATCH_RECORDS a message
    batch = MAX_BATCH_RECORDS if args.layout == "mesh" else args.batch
    load0 = os.getloadavg()[0]
    total = flushes = chunk = 0
    for _ in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="hm-bench-telemetry-"))
        try:
            all_recs: list[dict[str, Any]] = []
            spools = []
            if args.layout == "mesh":
                from hivemesh.bench._telemetry_mesh import mesh_run

                per = [_records(i, args.records) for i in range(args.senders)]
                all_recs = [r for recs in per for r in recs]
                total = len(all_recs)
                mr = mesh_run(tmp, per, per_process=args.per_process)
                dt, flushes, rows = mr.seconds, mr.flushes, mr.flushed_rows
                mesh_runs.append(mr)
                ours_runs.append(dt)
                chunk = max(1, rows // max(1, flushes))
                raw_batch_runs.append(_raw_insert(str(tmp / "raw1.duckdb"), all_recs, batch))
                raw_flush_runs.append(_raw_insert(str(tmp / "raw2.duckdb"), all_recs, chunk))
                raw_flush_cpu.append(_RAW_CPU_S[-1])
                continue
            for i in range(args.senders):
                recs = _records(i, args.records)
                all_recs.extend(recs)
                sp = Spool(tmp / f"sender-{i:03d}.spool")
                sp.append_many(recs)
                spools.append(sp)
            total = len(all_recs)
            if args.layout == "split":
                for sp in spools:
                    sp.close()
                dt, flushes, rows = _split_run(tmp, args.batch)
            else:
                store = MetricsStore(str(tmp / "collector.duckdb"))
                collector = Collector(store)
                dt = asyncio.run(_drain_all(spools, collector, args.batch, args.transport))
                collector.close()
                store.close()
                for sp in spools:
                    sp.close()
                flushes, rows = collector.flushes, collector.flushed_rows
            stored = _count(tmp / "collector.duckdb")
            if stored != total:
                raise RuntimeError(f"stored {stored} of {total} records")
            ours_runs.append(dt)
            chunk = max(1, rows // max(1, flushes))
            raw_batch_runs.append(_raw_insert(str(tmp / "raw1.duckdb"), all_recs, args.batch))
            raw_flush_runs.append(_raw_insert(str(tmp / "raw2.duckdb"), all_recs, chunk))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    ours = total / min(ours_runs)
    raw_batch = total / min(raw_batch_runs)
    raw_flush = total / min(raw_flush_runs)
    return BenchResult(
        name="telemetry",
        metrics=[
            Metric(
                name="points stored/s vs raw, flush-size",
                ours=ours,
                baseline=raw_flush,
                unit="pts/s",
                baseline_name=f"raw {chunk}-row",
                goal=">= 100k pts/s and >= 0.5x raw",
                goal_met=ours >= 100_000 and ours >= 0.5 * raw_flush,
            ),
            *_cpu_metric(mesh_runs, raw_flush_cpu, total),
            Metric(
                name="points stored/s vs raw, same batches",
                ours=ours,
                baseline=raw_batch,
                unit="pts/s",
                baseline_name=f"raw {batch}-row",
            ),
        ],
        details={
            "senders": args.senders,
            "records": total,
            "layout": args.layout,
            "transport": {"split": "tcp", "mesh": "mesh"}.get(args.layout, args.transport),
            "batch": f"daemon's (<= {batch} records, <= 192 KiB, columnar)"
            if args.layout == "mesh"
            else args.batch,
            "flushes": flushes,
            "mean_flush_rows": chunk,
            "repeat": f"best of {args.repeat} runs each",
            "ours_runs_pts_per_s": [round(total / d) for d in ours_runs],
            "raw_same_batches_runs_pts_per_s": [round(total / d) for d in raw_batch_runs],
            "raw_flush_size_runs_pts_per_s": [round(total / d) for d in raw_flush_runs],
            **_mesh_details(args, mesh_runs, total),
            "loadavg_1m_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
        },
    )


def _cpu_metric(runs: list[Any], raw_cpu: list[float], total: int) -> list[Metric]:
    """Points per CPU-second: less swayed by other load than the wall-clock figures."""
    if not runs or not raw_cpu:
        return []
    ours = max(
        total / max(1e-9, r.collector_cpu_s + r.senders_cpu_s - r.senders_idle_cores * r.seconds)
        for r in runs
    )
    return [
        Metric(
            name="points per CPU-second (collector + senders above idle) vs raw",
            ours=ours,
            baseline=total / min(raw_cpu),
            unit="pts/CPU-s",
            baseline_name="raw flush-size insert",
        )
    ]


def _mesh_details(args: argparse.Namespace, runs: list[Any], total: int) -> dict[str, Any]:
    if not runs:
        return {}
    return {
        "sender_nodes": args.senders,
        "sender_processes": runs[0].sender_processes,
        "hosting": (
            "one hivemesh up process per sender node"
            if args.per_process <= 1
            else f"{args.per_process} sender nodes per OS process (each a full node: own "
            "identity, spool, listener, Noise channel to the collector)"
        ),
        "collector_cpu_us_per_pt": [round(r.collector_cpu_s / total * 1e6, 2) for r in runs],
        "senders_cpu_us_per_pt": [round(r.senders_cpu_s / total * 1e6, 2) for r in runs],
        "senders_idle_cores": [round(r.senders_idle_cores, 3) for r in runs],
        "senders_cpu_us_per_pt_above_idle": [
            round((r.senders_cpu_s - r.senders_idle_cores * r.seconds) / total * 1e6, 2)
            for r in runs
        ],
    }
