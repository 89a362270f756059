"""SQLiteStore behaviour beyond agreement: settings, misuse, replay hooks, bench."""

from __future__ import annotations

import argparse
import hashlib
import random
import sqlite3
from pathlib import Path

import pytest

from hivemesh.bench import rehydrate as bench_rehydrate
from hivemesh.core.event import Event
from hivemesh.core.store import MemoryStore
from hivemesh.errors import InvalidArgument, StoreCorrupt, StoreError
from hivemesh.stores.replay import ReplayStats, rehydrate, verify_batches, verify_feeds
from hivemesh.stores.sqlite import APPLICATION_ID, SQLiteStore
from store_rows import count_events
from test_store_support import fill, make_batch, writer


def pragma(store: SQLiteStore, name: str) -> object:
    return store.db.execute(f"PRAGMA {name}").fetchone()[0]


@pytest.mark.parametrize(("durability", "sync"), [("process", 1), ("power", 2)])
def test_wal_and_synchronous_follow_durability(tmp_path: Path, durability: str, sync: int) -> None:
    with SQLiteStore(tmp_path / "s.db", durability=durability) as store:  # type: ignore[arg-type]
        assert pragma(store, "journal_mode") == "wal"
        assert pragma(store, "synchronous") == sync
        assert pragma(store, "application_id") == APPLICATION_ID


def test_bad_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        SQLiteStore(tmp_path / "s.db", durability="maybe")  # type: ignore[arg-type]


def test_creation_leaves_only_the_store(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "s.db").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_closed_store_raises_store_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.heads()


def test_append_misuse_is_invalid_argument_and_stores_nothing(tmp_path: Path) -> None:
    rng = random.Random(1)
    with SQLiteStore(tmp_path / "s.db") as store:
        w, other = writer(0), writer(1)
        events, sig = make_batch(w, 5, rng)
        with pytest.raises(InvalidArgument):
            store.append(w.identity.public, [], sig)
        with pytest.raises(InvalidArgument):
            store.append(other.identity.public, events, sig)  # wrong author
        with pytest.raises(InvalidArgument):
            store.append(w.identity.public, [events[0], events[2]], sig)  # hole
        with pytest.raises(InvalidArgument):
            store.append(w.identity.public, events[1:], sig)  # does not start at 1
        assert store.heads() == {}
        store.append(w.identity.public, events, sig)
        # a batch that continues the seq but not the hash chain
        forked = writer(0)
        forked.head = w.head.__class__(w.head.seq, b"\x01" * 32)
        bad, bad_sig = make_batch(forked, 2, rng)
        with pytest.raises(InvalidArgument, match="chain"):
            store.append(w.identity.public, bad, bad_sig)
        assert store.heads() == {w.identity.public: (5, events[-1].id)}


def test_blob_digest_is_checked_on_put(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        with pytest.raises(InvalidArgument):
            store.put_blob(b"\x00" * 32, b"data")
        d = hashlib.blake2b(b"data", digest_size=32).digest()
        store.put_blob(d, b"data")
        store.put_blob(d, b"data")  # idempotent
        assert store.get_blob(d) == b"data"


def test_second_connection_sees_committed_appends(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStore(path) as a, SQLiteStore(path) as b:
        fill(a, 2, 4)
        assert b.heads() == a.heads()
        assert [e.id for e in verify_feeds(b)] == [e.id for e in verify_feeds(a)]


def test_batches_end_at_signed_seqs_and_feed_the_hook(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        fill(store, 3, 12, seed=3)
        seen: list[list[Event]] = []
        stats = rehydrate(store, seen.append)
        for batch in seen:
            a = batch[0].author
            assert all(e.author == a for e in batch)
            assert [e.seq for e in batch] == list(range(batch[0].seq, batch[-1].seq + 1))
            assert store.signature(a, batch[-1].seq) is not None
        assert stats == ReplayStats(
            events=sum(len(b) for b in seen), authors=3, signatures=len(seen)
        )
        assert len(list(verify_batches(store))) == 12


def test_generic_replay_of_memory_store_catches_tampering() -> None:
    store = MemoryStore()
    fill(store, 2, 5)
    assert rehydrate(store).events > 0
    author = sorted(store.heads())[0]
    raws = store._events[author]
    raws[1] = raws[1][:-1] + bytes([raws[1][-1] ^ 1])
    with pytest.raises(StoreCorrupt, match=r"feed hm\w+ #"):
        rehydrate(store)


def test_quick_check_passes_on_a_clean_store(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        fill(store, 2, 5)
        store.check()


def test_store_created_by_hivemesh_is_plain_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        fill(store, 2, 5)
        n = sum(s for s, _ in store.heads().values())
    db = sqlite3.connect(path)
    try:
        assert count_events(db) == n
    finally:
        db.close()


def test_bench_rehydrate_runs_small() -> None:
    args = argparse.Namespace(events=3000, authors=3, repeat=1, seed=5, shared_updates=0)
    result = bench_rehydrate.run(args)
    assert [m.name for m in result.metrics] == [
        "rehydrate: verify + views (CPU)",
        "rehydrate: verify + views (wall)",
        "verified replay (wall clock)",
        "verified replay (CPU time)",
    ]
    for metric in result.metrics:
        assert metric.ours > 0 and metric.baseline is not None and metric.baseline > 0
    goal = result.metrics[0]
    assert goal.goal_met is (goal.ours >= bench_rehydrate.GOAL_EVENTS_PER_S)
    assert result.details["events"] == 3000


def test_missing_parent_dir_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="creat"):
        SQLiteStore(tmp_path / "nope" / "s.db")
    assert not (tmp_path / "nope").exists()


def test_concurrent_creation_yields_one_store(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "s.db"
    errors: list[BaseException] = []
    heads: list[object] = []

    def open_and_write(i: int) -> None:
        try:
            with SQLiteStore(path) as store:
                heads.append(store.feed_summary())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(heads) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_public_surface() -> None:
    import hivemesh.stores

    assert hivemesh.stores.__all__ == [
        "ReplayStats",
        "SQLiteStore",
        "load_identity",
        "load_or_create_identity",
        "rehydrate",
        "verify_batches",
        "verify_causal",
        "verify_feeds",
    ]


def _as_v1(path: Path) -> int:
    """Rewrite a closed store as schema v1 wrote it: one ``events`` row per
    event, no ``runs`` table; returns the events moved."""
    import msgpack

    db = sqlite3.connect(path, isolation_level=None)
    try:
        rows = []
        for author, last, blob in db.execute("SELECT author, seq, raws FROM runs").fetchall():
            raws = msgpack.unpackb(blob)
            rows += [(author, last - len(raws) + 1 + i, r) for i, r in enumerate(raws)]
        db.execute("BEGIN")
        db.executemany("INSERT INTO events (author, seq, raw) VALUES (?, ?, ?)", rows)
        db.execute("DROP TABLE runs")
        db.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
        db.execute("PRAGMA user_version = 1")
        db.execute("COMMIT")
    finally:
        db.close()
    return len(rows)


def test_a_v1_store_is_upgraded_and_its_event_rows_read_beside_new_runs(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    rng = random.Random(3)
    w = writer(0)
    old = [make_batch(w, n, rng) for n in (3, 5)]
    with SQLiteStore(path) as store:
        for events, sig in old:
            store.append(w.identity.public, events, sig)
    assert _as_v1(path) == 8
    with SQLiteStore(path) as store:  # upgraded in place: v1 rows stay, new batches are runs
        new, sig = make_batch(w, 4, rng)
        store.append(w.identity.public, new, sig)
        raws = [e.raw for events, _ in old for e in events] + [e.raw for e in new]
        assert store.read_range(w.identity.public, 1, 12) == raws
        assert store.read_range(w.identity.public, 7, 10) == raws[6:10]
        assert [r for rows in store.iter_feed_rows(w.identity.public, 5) for r in rows] == list(
            enumerate(raws, 1)
        )
        assert store.event_authors() == [w.identity.public]
        assert [e.raw for e in verify_feeds(store)] == raws
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (2,)
        assert db.execute("SELECT count(*) FROM events").fetchone() == (8,)
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    finally:
        db.close()


def test_a_run_that_does_not_decode_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        fill(store, 1, 3)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE runs SET raws = x'c1'")  # a byte msgpack never uses
    db.close()
    with SQLiteStore(path) as store, pytest.raises(StoreCorrupt, match="does not decode"):
        list(verify_feeds(store))


def test_a_creator_that_lost_the_race_opens_the_winners_store(tmp_path: Path) -> None:
    """A creator that saw no store, then finds the side files of the store a
    concurrent creator linked in and opened meanwhile, is not looking at a
    torn store (test_concurrent_creation_yields_one_store hit this ~1 run in
    30): it leaves that store alone and the caller opens it."""
    from hivemesh.stores.sqlite_file import create_file

    path = tmp_path / "s.db"
    with SQLiteStore(path) as winner:  # the winner's open store has its -shm
        assert Path(f"{path}-shm").exists()
        before = path.read_bytes()
        create_file(path)  # the loser, past its own "no store file" check
        assert path.read_bytes() == before
        with SQLiteStore(path) as loser:
            assert loser.feed_summary() == winner.feed_summary()


def test_side_files_without_their_store_are_still_refused(tmp_path: Path) -> None:
    from hivemesh.stores.sqlite_file import create_file

    path = tmp_path / "s.db"
    Path(f"{path}-wal").write_bytes(b"x" * 32)
    with pytest.raises(StoreCorrupt, match="no store file"):
        create_file(path)
    assert not path.exists()
