"""``hivemesh bench rehydrate``: verified replay of a journal vs a raw SQLite scan.

Builds (untimed) a SQLite store of ``--events`` events from ``--authors``
feeds, in signed batches of 64..256 events with small msgpack bodies (context
updates, chat lines, tool results), then times, in the same run:

* baseline: ``SELECT raw FROM events ORDER BY author, seq``, touching every row;
* ours, twice: :func:`hivemesh.stores.replay.rehydrate` alone (decode, hash
  chain and signature checks of every event), and full rehydration: the same
  plus every event applied to the standard views (context, registers, names,
  blobs) as a node does at start-up. The goal is judged on the full figure.

Workload mix: 30% ``ctx.update`` (real loro updates, each coalescing 1-3
context writes, as a node flushes its pending writes), 5% ``reg.max``,
1% ``name.claim``, 44% chat lines, 20% tool results.

Both are reported in wall-clock time and in this process's CPU time: on a
shared machine the wall-clock figure drops with the load average (printed),
the CPU-time figure much less.

Goal: >= 200k verified events/s.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.journal import Journal
from hivemesh.core.views import ContextView, MaxRegisterView, NamesView, standard_views
from hivemesh.stores.replay import rehydrate
from hivemesh.stores.sqlite import SQLiteStore

DESCRIPTION = "verified replay of a 1M-event journal vs a raw SQLite scan"

GOAL_EVENTS_PER_S = 200_000
_WORDS = [
    "plan",
    "goal",
    "task",
    "claim",
    "result",
    "retry",
    "tool",
    "browser",
    "page",
    "token",
    "agent",
    "note",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hivemesh bench rehydrate``."""
    parser.add_argument("--events", type=int, default=1_000_000, help="journal size")
    parser.add_argument("--authors", type=int, default=8, help="number of feeds")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; best is kept")
    parser.add_argument("--seed", type=int, default=1, help="workload seed")


def _body(rng: random.Random, i: int, ctx: ContextView) -> tuple[str, Any]:
    """One event of the workload mix (see module docstring)."""
    r = rng.random()
    if r < 0.30:  # a real loro update coalescing 1-3 local context writes
        doc = ctx.context("agent")
        for _ in range(rng.randrange(1, 4)):
            if rng.random() < 0.7:
                doc[f"{rng.choice(_WORDS)}/{rng.randrange(64)}"] = " ".join(
                    rng.choices(_WORDS, k=rng.randrange(1, 6))
                )
            else:
                doc.list("notes").append(rng.choice(_WORDS))
        upd = ctx.pending_update()
        if upd is not None:  # None when the writes changed nothing
            return upd
    if r < 0.35:
        return MaxRegisterView.encode(f"fence/{rng.randrange(8)}", i)
    if r < 0.36:
        return NamesView.claim(f"{rng.choice(_WORDS)}-{rng.randrange(100)}")
    if r < 0.80:
        return "chat.line", {"role": "assistant", "text": " ".join(rng.choices(_WORDS, k=12))}
    return "tool.result", {"call": i, "ok": rng.random() < 0.9, "ms": rng.randrange(5000)}


def build_journal(path: Path, events: int, authors: int, seed: int) -> int:
    """Write ``events`` signed events from ``authors`` feeds into a new store at
    ``path``; returns the number of signed batches."""
    rng = random.Random(f"{seed}/journal")
    writers = [
        FeedWriter(Identity.from_seed(rng.randbytes(32)), Head(), HLC()) for _ in range(authors)
    ]
    ctxs = [ContextView(w.identity.public) for w in writers]
    now_ms = 1_800_000_000_000
    batches = 0
    written = 0
    with SQLiteStore(path) as store:
        while written < events:
            k = rng.randrange(authors)
            w = writers[k]
            n = min(rng.randrange(64, 257), events - written)
            for _ in range(n):
                now_ms += rng.randrange(3)
                kind, body = _body(rng, written, ctxs[k])
                w.append(kind, body, now_ms)
                written += 1
            sealed = w.seal()
            assert sealed is not None
            store.append(w.identity.public, sealed[0], sealed[1])
            batches += 1
    return batches


def _raw_scan(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        cur = db.execute("SELECT raw FROM events ORDER BY author, seq")
        total = 0
        while rows := cur.fetchmany(4096):
            for (raw,) in rows:
                total += len(raw)
        return total
    finally:
        db.close()


def _replay(path: Path, *, views: bool) -> int:
    with SQLiteStore(path) as store:
        if not views:
            return rehydrate(store).events
        journal = Journal(store)
        installed = standard_views(None)
        for view in installed:
            journal.add_view(view)
        n = rehydrate(store, apply=lambda evs: journal.apply_to_views(evs, replay=True)).events
        rejected = sum(sum(v.rejected.values()) for v in installed)
        if rejected:
            raise RuntimeError(f"views rejected {rejected} events of an honest journal")
        return n


def run(args: argparse.Namespace) -> BenchResult:
    """Build the journal, then time the raw scan and the verified replay."""
    n = int(args.events)
    with tempfile.TemporaryDirectory(prefix="hivemesh-bench-") as tmp:
        path = Path(tmp) / "journal.db"
        t0 = time.perf_counter()
        batches = build_journal(path, n, int(args.authors), int(args.seed))
        build_s = time.perf_counter() - t0
        _raw_scan(path)  # warm the page cache for both contenders
        raw_wall: list[float] = []
        raw_cpu: list[float] = []
        ours_wall: list[float] = []
        ours_cpu: list[float] = []
        full_wall: list[float] = []
        full_cpu: list[float] = []
        for _ in range(max(1, int(args.repeat))):
            w, c = time.perf_counter(), time.process_time()
            _raw_scan(path)
            raw_wall.append(time.perf_counter() - w)
            raw_cpu.append(time.process_time() - c)
            for views, walls, cpus in ((False, ours_wall, ours_cpu), (True, full_wall, full_cpu)):
                w, c = time.perf_counter(), time.process_time()
                replayed = _replay(path, views=views)
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
                if replayed != n:
                    raise RuntimeError(f"replayed {replayed} events, built {n}")
        size = path.stat().st_size
    goal = f">= {GOAL_EVENTS_PER_S:,} events/s"
    wall, cpu = n / min(ours_wall), n / min(ours_cpu)
    return BenchResult(
        name="rehydrate",
        metrics=[
            Metric(
                name="rehydrate: verify + views (CPU)",
                ours=n / min(full_cpu),
                baseline=n / min(raw_cpu),
                unit="events/s",
                baseline_name="raw SQLite scan",
                goal=goal,
                goal_met=n / min(full_cpu) >= GOAL_EVENTS_PER_S,
            ),
            Metric(
                name="rehydrate: verify + views (wall)",
                ours=n / min(full_wall),
                baseline=n / min(raw_wall),
                unit="events/s",
                baseline_name="raw SQLite scan",
            ),
            Metric(
                name="verified replay (wall clock)",
                ours=wall,
                baseline=n / min(raw_wall),
                unit="events/s",
                baseline_name="raw SQLite scan",
            ),
            Metric(
                name="verified replay (CPU time)",
                ours=cpu,
                baseline=n / min(raw_cpu),
                unit="events/s",
                baseline_name="raw SQLite scan",
            ),
        ],
        details={
            "events": n,
            "authors": int(args.authors),
            "signed_batches": batches,
            "db_bytes": size,
            "build_s": round(build_s, 2),
            "replay_s_best": round(min(ours_wall), 3),
            "raw_scan_s_best": round(min(raw_wall), 3),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        },
    )
