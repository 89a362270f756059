"""``hivemesh bench rehydrate``: verified replay of a journal vs a raw SQLite scan.

Builds (untimed) a SQLite store of ``--events`` events from ``--authors``
feeds, in signed batches of 64..256 events with small msgpack bodies (context
updates, chat lines, tool results), then times, in the same run:

* baseline: every stored event's bytes read straight from SQLite, in author
  then seq order (the ``runs`` rows unpacked, one per stored batch);
* ours, twice: :func:`hivemesh.stores.replay.rehydrate` alone (decode, hash
  chain and signature checks of every event), and full rehydration: the same
  plus every event applied to the standard views (context, registers, names,
  blobs) as a node does at start-up. The goal is judged on the full figure.

Full rehydration replays in causal order and in the daemon's slices
(:func:`hivemesh.runtime.rehydration.replay_slices`), with the daemon's
checks: every hash chain and each feed's head signature (the other
signatures are audited off the event loop once the node is up; the
"verified replay" rows still check every signature), with the cyclic GC
paused as in the daemon.

**Shared document** (``--shared-updates``, default 100,000; 0 skips it):
5 authors interleaving writes on one context, each author catching up with
the others between its runs of writes (:mod:`hivemesh.bench._shared_history`),
stored in a data dir as if replicated. Measured in the same run:

* full rehydration (verify + every view, causal order) against a plain loro
  import of the same updates in causal order into one detached doc (goal
  >= 200k ev/s, and the ratio);
* restart to first answer on the control socket of a real ``hivemesh up``
  process on that data dir, without a view checkpoint and with one, beside
  the same on an empty data dir (goal <= 2 s); and restart until the node
  is up (views complete), both ways.

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
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loro import LoroDoc

from hivemesh.bench import BenchResult, Metric
from hivemesh.bench._shared_history import shared_history
from hivemesh.client.blocking import Client
from hivemesh.core.causal import causal_merge
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.journal import Journal
from hivemesh.core.views import ContextView, MaxRegisterView, NamesView, standard_views
from hivemesh.errors import HivemeshError
from hivemesh.runtime.rehydration import gc_paused, replay_slices
from hivemesh.stores.private import secure_data_dir
from hivemesh.stores.replay import rehydrate
from hivemesh.stores.sqlite import SQLiteStore

DESCRIPTION = "verified replay of a 1M-event journal vs a raw SQLite scan"

GOAL_EVENTS_PER_S = 200_000
GOAL_FIRST_ANSWER_S = 2.0
_START_TIMEOUT_S = 600.0
#: Events per signed batch in the shared-document workload, at least (a busy
#: node's group commit; the 1M journal's batches hold 64-256).
_SHARED_BATCH = 64
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
    parser.add_argument(
        "--shared-updates",
        type=int,
        default=100_000,
        help="updates of the 5-author shared-document workload (0: skip it)",
    )


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
    import msgpack

    db = sqlite3.connect(path)
    try:
        cur = db.execute("SELECT raws FROM runs ORDER BY author, seq")
        total = 0
        while rows := cur.fetchmany(64):
            for (blob,) in rows:
                for raw in msgpack.unpackb(blob):
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
        n = 0
        with gc_paused():  # as the daemon's replay
            for chunk in replay_slices(store):  # the daemon's order, slices and checks
                journal.apply_to_views(chunk, replay=True)
                n += len(chunk)
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
    shared: list[Metric] = []
    shared_details: dict[str, Any] = {}
    if int(args.shared_updates) > 0:
        shared, shared_details = _shared_document(int(args.shared_updates), int(args.seed))
    wall, cpu = n / min(ours_wall), n / min(ours_cpu)
    return BenchResult(
        name="rehydrate",
        metrics=[
            _rate_goal(
                "rehydrate: verify + views (CPU)",
                n / min(full_cpu),
                n / min(raw_cpu),
                "raw SQLite scan",
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
            *shared,
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
            **shared_details,
        },
    )


def _rate_goal(name: str, ours: float, baseline: float, baseline_name: str) -> Metric:
    """An events/s figure held to :data:`GOAL_EVENTS_PER_S`."""
    return Metric(
        name=name,
        ours=ours,
        baseline=baseline,
        unit="events/s",
        baseline_name=baseline_name,
        goal=f">= {GOAL_EVENTS_PER_S:,} events/s",
        goal_met=ours >= GOAL_EVENTS_PER_S,
    )


# -- the shared-document workload ------------------------------------------------


def _shared_document(updates: int, seed: int) -> tuple[list[Metric], dict[str, Any]]:
    """Build the 5-author data dir, then time replay and restarts (module docs)."""
    with tempfile.TemporaryDirectory(prefix="hivemesh-bench-") as tmp:
        data_dir = Path(tmp) / "node"
        secure_data_dir(data_dir)
        t0 = time.perf_counter()
        feeds: dict[bytes, list[Any]] = {}
        with SQLiteStore(data_dir / "store.db") as store:
            for author, events, sig in shared_history(updates, 5, seed, batch=_SHARED_BATCH):
                store.append(author, events, sig)
                feeds.setdefault(author, []).extend(events)
        build_s = time.perf_counter() - t0
        blobs = [  # the same updates in causal order, for the plain loro import
            ev.body["u"] for run in causal_merge(iter([f]) for f in feeds.values()) for ev in run
        ]
        n = len(blobs)
        loro_s, ours_s = [], []
        for _ in range(2):
            loro_s.append(_plain_loro(blobs))
            w = time.perf_counter()
            if _replay(data_dir / "store.db", views=True) != n:
                raise RuntimeError("shared-document replay lost events")
            ours_s.append(time.perf_counter() - w)
        empty = Path(tmp) / "empty"
        secure_data_dir(empty)
        fresh = _restart(empty)
        cold = _restart(data_dir)  # no checkpoint: replays everything, writes one
        warm = _restart(data_dir)  # from the checkpoint
    metrics = [
        _rate_goal(
            "shared doc (5 authors): rehydrate, verify + views",
            n / min(ours_s),
            n / min(loro_s),
            "plain loro import, causal order",
        ),
    ]
    for figure, what, goal in (
        ("first_answer_s", "restart to first control answer", True),
        ("up_s", "restart until up, views complete", False),
    ):
        for run, how in ((cold, "no checkpoint"), (warm, "checkpoint")):
            metrics.append(
                Metric(
                    name=f"shared doc: {what} ({how})",
                    ours=run[figure],
                    baseline=fresh[figure],
                    unit="s",
                    baseline_name="same, empty data dir",
                    higher_is_better=False,
                    goal=f"<= {GOAL_FIRST_ANSWER_S} s" if goal else "",
                    goal_met=run[figure] <= GOAL_FIRST_ANSWER_S if goal else None,
                )
            )
    details = {
        "shared_updates": n,
        "shared_build_s": round(build_s, 1),
        "shared_plain_loro_s": round(min(loro_s), 3),
        "shared_replay_s": round(min(ours_s), 3),
        "shared_restart_cold": cold,
        "shared_restart_checkpoint": warm,
        "shared_restart_empty": fresh,
    }
    return metrics, details


def _plain_loro(blobs: list[bytes]) -> float:
    t = time.perf_counter()
    doc = LoroDoc()  # type: ignore[no-untyped-call]
    doc.detach()
    for blob in blobs:
        doc.import_(blob)
    doc.checkout_to_latest()
    doc.get_deep_value()
    return time.perf_counter() - t


def _restart(data_dir: Path) -> dict[str, Any]:
    """Start ``hivemesh up`` on ``data_dir``: seconds to its first answer on
    the control socket and to being up; then stop it cleanly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["HIVEMESH_TRUST_MODE"] = "open"
    cmd = [sys.executable, "-m", "hivemesh", "up", "--json", "--data-dir", str(data_dir)]
    cmd += ["--listen", "127.0.0.1:0"]
    client = Client(data_dir, timeout_s=_START_TIMEOUT_S)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        first = up = 0.0
        deadline = t0 + _START_TIMEOUT_S
        while time.perf_counter() < deadline and proc.poll() is None:
            try:
                st = client.call("status", timeout_s=5.0)
            except HivemeshError:
                time.sleep(0.005)  # not listening yet
                continue
            now = time.perf_counter() - t0
            first = first or now
            if "rehydrating" not in st:
                up = now
                break
            time.sleep(0.05)  # answered: poll gently, the replay needs the CPU
        if not up:
            raise RuntimeError(f"hivemesh up on {data_dir} did not start")
        reh = st["journal"]["rehydration"]
        return {
            "first_answer_s": round(first, 3),
            "up_s": round(up, 3),
            "replay_s": reh["seconds"],
            "checkpoint": reh["checkpoint"],
            "ctx_imports": reh["ctx_imports"],
            "ctx_skipped": reh["ctx_skipped"],
        }
    finally:
        proc.send_signal(signal.SIGTERM)  # a clean stop writes the view checkpoint
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
