"""SQLiteStore checkpoints: off the append path, at idle, and bounded."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from hivemesh.stores import checkpoint as ckpt_mod
from hivemesh.stores.replay import rehydrate
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import make_batch, writer


def wal_frames(store: SQLiteStore) -> tuple[int, int]:
    """``(frames in the WAL, frames checkpointed)`` without checkpointing."""
    import sqlite3

    db = sqlite3.connect(store.path, isolation_level=None)
    try:
        row = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(row[1]), int(row[2])
    finally:
        db.close()


def wait_for(cond: object, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def test_auto_checkpoint_is_off_on_the_writer(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0


def test_idle_store_is_checkpointed_in_the_background(tmp_path: Path) -> None:
    rng = random.Random(3)
    with SQLiteStore(tmp_path / "s.db") as store:
        w = writer(0)
        for _ in range(20):
            events, sig = make_batch(w, 5, rng)
            store.append(w.identity.public, events, sig)
        ckpt = store._ckpt
        assert ckpt is not None
        wait_for(lambda: ckpt.checkpoints >= 1)
        log, done = wal_frames(store)
        assert log == done  # everything committed reached the main file
        assert ckpt.errors == 0
        assert store.heads()[w.identity.public][0] == 100


def test_size_wakes_the_checkpointer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt_mod, "CHECKPOINT_BYTES", 64 * 1024)
    monkeypatch.setattr(ckpt_mod, "CHECKPOINT_IDLE_S", 3600.0)  # never idle here
    rng = random.Random(5)
    with SQLiteStore(tmp_path / "s.db") as store:
        w = writer(2)
        for _ in range(40):
            events, sig = make_batch(w, 5, rng)
            store.append(w.identity.public, events, sig)
        ckpt = store._ckpt
        assert ckpt is not None
        wait_for(lambda: ckpt.checkpoints >= 1)


def test_writer_bounds_the_wal_when_the_checkpointer_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no background checkpoint at all (stuck, or never finishing under
    a writer that never pauses) ``append`` itself keeps the WAL bounded."""
    hard = 1024 * 1024
    monkeypatch.setattr(ckpt_mod, "CHECKPOINT_HARD_BYTES", hard)
    monkeypatch.setattr(ckpt_mod.Checkpointer, "_run", lambda self: None)
    rng = random.Random(4)
    path = tmp_path / "s.db"
    wal = Path(f"{path}-wal")
    biggest = 0
    with SQLiteStore(path) as store:
        w = writer(1)
        for _ in range(1500):
            events, sig = make_batch(w, 2, rng)
            store.append(w.identity.public, events, sig)
            biggest = max(biggest, wal.stat().st_size)
        # Each commit writes a few pages: unchecked, 1,500 of them grow the
        # WAL past 20 MB.
        assert store.sync_checkpoints >= 5
        assert biggest <= 2 * hard
    with SQLiteStore(path) as store:
        stats = rehydrate(store)
        assert stats.events == 3000
        store.check()
