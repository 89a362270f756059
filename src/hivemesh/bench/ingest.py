"""``hivemesh bench ingest``: verify + apply + persist, events/s on one core.

Signed batches from several authors are pre-encoded as the EVENTS frames a
node receives from its peers. Timed: a core :class:`~hivemesh.core.node.Node`
with a real SQLite store (WAL) and the standard views takes every frame
through ``receive``: frame decode, event decode, hash chain, one Ed25519
verify per batch, an atomic SQLite append, view application and the event
feed to subscribers.

Baseline, in the same run: verifying one Ed25519 signature per event (what a
per-event-signature design costs before it stores or applies anything).

The goal is judged on CPU time (the work is single-threaded, so events per
CPU-second is the one-core rate even when other processes load the
machine); wall-clock figures are printed beside it with the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node
from hivemesh.core.store import FeedStore, MemoryStore

DESCRIPTION = "verify+apply+persist events/s vs per-event Ed25519 verification"
#: Where the writers' clocks start (one millisecond per event from there).
_EPOCH_MS = 1_700_000_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--authors", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256, help="events per signed batch")
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")


def build_frames(events: int, authors: int, batch: int, seed: int = 1) -> list[bytes]:
    """Pre-encoded EVENTS frames, round-robin across authors."""
    rng = random.Random(seed)
    writers = [
        FeedWriter(Identity.from_seed(rng.randbytes(32)), Head(), HLC()) for _ in range(authors)
    ]
    frames: list[bytes] = []
    per_author = events // authors
    now = _EPOCH_MS
    for start in range(0, per_author, batch):
        for w in writers:
            for i in range(start, min(per_author, start + batch)):
                now += 1
                body = {"agent": "planner-3", "step": i, "text": f"observation {i} " * 3}
                w.append("app.note", body, now)
            sealed = w.seal()
            assert sealed is not None
            evs, sig = sealed
            frames.append(
                encode_frame(FrameType.EVENTS, w.identity.public, [e.raw for e in evs], sig, 0)
            )
    return frames


def _open_store(kind: str, tmp: Path) -> FeedStore:
    if kind == "memory":
        return MemoryStore()
    from hivemesh.stores.sqlite import SQLiteStore

    store: FeedStore = SQLiteStore(tmp / "ingest.db")
    return store


def _standard_views(node: Node) -> None:
    try:
        from hivemesh.core.views import standard_views
    except ImportError:  # views not built into this tree
        return
    for view in standard_views(node.identity.public):
        node.add_view(view)


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    frames = build_frames(args.events, args.authors, args.batch)
    total = (args.events // args.authors) * args.authors
    with tempfile.TemporaryDirectory() as d:
        store = _open_store(args.store, Path(d))
        node = Node(Identity.from_seed(b"\x07" * 32), store, random.Random(7), now_ms=0)
        _standard_views(node)
        # Received after they were written: within the receiver's clock bound.
        received_ms = _EPOCH_MS + args.events + 1
        t0, c0 = time.perf_counter(), time.process_time()
        for i, frame in enumerate(frames):
            node.receive("hmpeer", frame, received_ms + i)
            node.events()
        ours_s, ours_cpu = time.perf_counter() - t0, time.process_time() - c0
        held = node.journal.total_events
        errors = {k: v for k, v in node.counters.items() if k not in ("events_in",)}
        store.close()
    # Baseline: one Ed25519 verify per event.
    key = Ed25519PrivateKey.from_private_bytes(b"\x09" * 32)
    pub = key.public_key()
    msgs = [f"event {i}".encode() * 8 for i in range(min(total, 20_000))]
    sigs = [key.sign(m) for m in msgs]
    t0, c0 = time.perf_counter(), time.process_time()
    for m, s in zip(msgs, sigs, strict=True):
        pub.verify(s, m)
    base_s, base_cpu = time.perf_counter() - t0, time.process_time() - c0
    cpu, base_c = held / ours_cpu, len(msgs) / base_cpu
    return BenchResult(
        "ingest",
        [
            Metric(
                "ingest events/s per CPU-second",
                cpu,
                base_c,
                "ev/s",
                "per-event Ed25519 verify",
                goal=">= 100k ev/s",
                goal_met=cpu >= 100_000 and held == total,
            ),
            Metric(
                "ingest events/s wall clock",
                held / ours_s,
                len(msgs) / base_s,
                "ev/s",
                "per-event Ed25519 verify",
            ),
        ],
        {
            "events": total,
            "stored": held,
            "batch": args.batch,
            "authors": args.authors,
            "store": args.store,
            "counters": errors,
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
    )
