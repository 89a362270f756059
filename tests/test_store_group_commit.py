"""Write-behind group commit of replicated batches in :class:`SQLiteStore`.

Batches appended with ``durable=False`` (what the journal does for batches
received from peers) join one open transaction when ``write_behind`` is set;
our own (durable) appends, :meth:`SQLiteStore.sync`, the group limits and
``close`` commit it. A crash loses at most the open group, never a durable
append, and never leaves a half batch.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hivemesh.errors import InvalidArgument
from hivemesh.stores import sqlite as sqlite_mod
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import committed_heads, make_batch, writer


def test_grouped_batches_are_committed_by_sync(tmp_path: Path) -> None:
    rng = random.Random(1)
    w = writer(0)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        for _ in range(3):
            events, sig = make_batch(w, 4, rng)
            store.append(w.identity.public, events, sig, durable=False)
        assert store.pending == 3
        assert committed_heads(tmp_path / "s.db") == {}  # not committed yet
        store.sync()
        assert store.pending == 0
        assert committed_heads(tmp_path / "s.db") == {w.identity.public: 12}


def test_a_read_sees_pending_batches(tmp_path: Path) -> None:
    rng = random.Random(11)
    w = writer(0)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        events, sig = make_batch(w, 4, rng)
        store.append(w.identity.public, events, sig, durable=False)
        assert store.read_range(w.identity.public, 1, 4) == [e.raw for e in events]
        assert store.signature(w.identity.public, 4) == sig
        assert store.pending == 0  # a read commits the group first


def test_a_durable_append_commits_the_open_group(tmp_path: Path) -> None:
    rng = random.Random(2)
    peer, me = writer(0), writer(1)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        events, sig = make_batch(peer, 5, rng)
        store.append(peer.identity.public, events, sig, durable=False)
        events, sig = make_batch(me, 2, rng)
        store.append(me.identity.public, events, sig)  # durable: ours
        assert store.pending == 0
        committed = committed_heads(tmp_path / "s.db")
        assert committed == {peer.identity.public: 5, me.identity.public: 2}


def test_without_write_behind_every_append_commits(tmp_path: Path) -> None:
    rng = random.Random(3)
    w = writer(0)
    with SQLiteStore(tmp_path / "s.db") as store:
        events, sig = make_batch(w, 3, rng)
        store.append(w.identity.public, events, sig, durable=False)
        assert store.pending == 0
        assert committed_heads(tmp_path / "s.db") == {w.identity.public: 3}


def test_a_bad_batch_in_a_group_rolls_back_alone(tmp_path: Path) -> None:
    rng = random.Random(4)
    a, b = writer(0), writer(1)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        events, sig = make_batch(a, 3, rng)
        store.append(a.identity.public, events, sig, durable=False)
        make_batch(b, 2, rng)  # b's first batch is never stored ...
        events, sig = make_batch(b, 2, rng)
        with pytest.raises(InvalidArgument, match="continue the stored feed"):
            store.append(b.identity.public, events, sig, durable=False)  # ... so this has a hole
        assert store.pending == 1
        store.sync()
        assert committed_heads(tmp_path / "s.db") == {a.identity.public: 3}


def test_the_group_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "GROUP_MAX_APPENDS", 4)
    rng = random.Random(5)
    w = writer(0)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        for i in range(10):
            events, sig = make_batch(w, 1, rng)
            store.append(w.identity.public, events, sig, durable=False)
            assert store.pending == i % 4 + 1  # a full group commits before the next joins
        assert committed_heads(tmp_path / "s.db") == {w.identity.public: 8}


def test_close_commits_the_group(tmp_path: Path) -> None:
    rng = random.Random(6)
    w = writer(0)
    store = SQLiteStore(tmp_path / "s.db")
    store.write_behind = True
    events, sig = make_batch(w, 6, rng)
    store.append(w.identity.public, events, sig, durable=False)
    store.close()
    assert committed_heads(tmp_path / "s.db") == {w.identity.public: 6}


_CRASHER = """
import os, random, sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import committed_heads, make_batch, writer
rng = random.Random(7)
peer, me = writer(0), writer(1)
store = SQLiteStore(sys.argv[1])
store.write_behind = True
for _ in range(3):
    e, s = make_batch(peer, 2, rng)
    store.append(peer.identity.public, e, s, durable=False)
e, s = make_batch(me, 2, rng)
store.append(me.identity.public, e, s)          # commits the 3 grouped batches
e, s = make_batch(peer, 2, rng)
store.append(peer.identity.public, e, s, durable=False)  # left in the open group
os._exit(0)  # like kill -9: no close, no commit
"""


def test_a_crash_loses_only_the_open_group(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    tests_dir = str(Path(__file__).parent)
    src = str(Path(__file__).parent.parent / "src")
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, str(path), tests_dir, src],
        capture_output=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    with SQLiteStore(path) as store:
        heads = {a: seq for a, (seq, _h) in store.heads().items()}
        assert heads == {writer(0).identity.public: 6, writer(1).identity.public: 2}
        store.check()


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_a_group_stores_one_run_row_per_append(tmp_path: Path, rows: int) -> None:
    """A group commit stores each append as one ``runs`` row: every event
    reads back once, in order, whole ranges and ranges across runs alike."""
    rng = random.Random(rows)
    a, b = writer(0), writer(1)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        held: dict[bytes, list[bytes]] = {a.identity.public: [], b.identity.public: []}
        for w in (a, b, a):
            events, sig = make_batch(w, rows, rng)
            store.append(w.identity.public, events, sig, durable=False)
            held[w.identity.public] += [e.raw for e in events]
        store.sync()
        for author, raws in held.items():
            assert store.read_range(author, 1, len(raws)) == raws
            assert store.read_range(author, 2, len(raws) - 1) == raws[1:-1]
            assert [r for rs in store.iter_feed_rows(author, 4) for r in rs] == list(
                enumerate(raws, 1)
            )
        assert store.db.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
        assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert committed_heads(tmp_path / "s.db") == {
        a.identity.public: 2 * rows,
        b.identity.public: rows,
    }


def test_a_failing_run_insert_keeps_the_whole_group(tmp_path: Path) -> None:
    """A run refused by SQLite (here: its key is taken) rolls the whole group
    back and leaves it pending."""
    rng = random.Random(5)
    w = writer(0)
    with SQLiteStore(tmp_path / "s.db") as store:
        store.write_behind = True
        events, sig = make_batch(w, 8, rng)
        store.append(w.identity.public, events, sig, durable=False)
        store.db.execute(  # a stray row where the group's run goes
            "INSERT INTO runs (author, seq, raws) VALUES (?, ?, ?)",
            (w.identity.public, 8, b"stray"),
        )
        with pytest.raises(sqlite_mod.StoreError):
            store.sync()
        assert store.pending == 1
        assert committed_heads(tmp_path / "s.db") == {}
        store.db.execute("DELETE FROM runs WHERE raws = ?", (b"stray",))
        store.sync()
        assert store.read_range(w.identity.public, 1, 8) == [e.raw for e in events]
