"""Helpers shared by the store tests (no tests here): signed feeds on demand."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.store import FeedStore
from hivemesh.stores.sqlite import SQLiteStore

NOW_MS = 1_800_000_000_000


class FailingCommits:
    """Wraps a store's connection: its next ``failures`` COMMITs fail like a full disk."""

    def __init__(self, db: sqlite3.Connection, failures: int) -> None:
        self._db, self.failures = db, failures

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def committed_heads(path: Path) -> dict[bytes, int]:
    """What a second connection (another process after a crash) sees committed."""
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT author, last_seq FROM feeds").fetchall())
    finally:
        db.close()


def writer(n: int) -> FeedWriter:
    """A fresh feed writer for the deterministic identity number ``n``."""
    return FeedWriter(Identity.from_seed(bytes([n + 1]) * 32), Head(), HLC())


def make_batch(w: FeedWriter, size: int, rng: random.Random) -> tuple[list[Event], bytes]:
    """Append ``size`` small events to ``w`` and seal them."""
    for _ in range(size):
        i = w.head.seq + 1
        if rng.random() < 0.5:
            w.append("ctx.update", {"key": f"k{rng.randrange(9)}", "value": i}, NOW_MS + i)
        else:
            w.append("chat.line", {"text": "hello " * rng.randrange(1, 6)}, NOW_MS + i)
    sealed = w.seal()
    assert sealed is not None
    return sealed


def fill(store: FeedStore, authors: int, batches: int, seed: int = 0) -> list[FeedWriter]:
    """Append ``batches`` signed batches spread over ``authors`` feeds."""
    rng = random.Random(seed)
    writers = [writer(i) for i in range(authors)]
    for _ in range(batches):
        w = rng.choice(writers)
        events, sig = make_batch(w, rng.randrange(1, 40), rng)
        store.append(w.identity.public, events, sig)
    return writers


def build_store(path: Path, authors: int = 3, batches: int = 30, seed: int = 0) -> None:
    """A closed, fully checkpointed SQLite store at ``path``."""
    with SQLiteStore(path) as store:
        fill(store, authors, batches, seed)
