"""The append log: our own batches durable with one write, committed later.

With ``append_log`` and ``write_behind`` set (as the daemon sets them), a
durable append is written to ``<store>-appends`` and joins the pending group;
``sync`` commits it and empties the log; opening the store after a crash
commits what the log holds. A second process opening a live writer's store
leaves its log alone.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hivemesh.errors import InvalidArgument, StoreError
from hivemesh.stores import appendlog as appendlog_mod
from hivemesh.stores import sqlite as sqlite_mod
from hivemesh.stores.appendlog import LOG_SUFFIX, encode_record, read_records
from hivemesh.stores.replay import rehydrate
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import FailingCommits, committed_heads, make_batch, writer

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def _logging_store(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    store.write_behind = store.append_log = True
    return store


def _log(path: Path) -> Path:
    return Path(f"{path}{LOG_SUFFIX}")


def test_a_logged_append_is_committed_by_the_next_sync(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(1), writer(0)
    with _logging_store(path) as store:
        events, sig = make_batch(me, 4, rng)
        store.append(me.identity.public, events, sig)  # durable: ours
        assert store.pending == 1 and committed_heads(path) == {}
        scan = read_records(_log(path).read_bytes())
        assert [r.raws for r in scan.records] == [[e.raw for e in events]]
        store.sync()
        assert committed_heads(path) == {me.identity.public: 4}
        assert _log(path).stat().st_size == 0  # emptied once committed
    assert not _log(path).exists()  # a clean close removes it


_CRASHER = """
import os, random, sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import FailingCommits, committed_heads, make_batch, writer
rng = random.Random(7)
me, peer = writer(0), writer(1)
store = SQLiteStore(sys.argv[1])
store.write_behind = store.append_log = True
e, s = make_batch(me, 3, rng)
store.append(me.identity.public, e, s)
store.sync()                                   # committed, log emptied
for _ in range(2):
    e, s = make_batch(me, 2, rng)
    store.append(me.identity.public, e, s)     # acknowledged: in the log only
e, s = make_batch(peer, 2, rng)
store.append(peer.identity.public, e, s, durable=False)  # a peer's: may be lost
os._exit(0)  # like kill -9: no close, no commit
"""


def test_a_crash_keeps_every_logged_append(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, str(path), TESTS, SRC],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert committed_heads(path) == {writer(0).identity.public: 3}
    with SQLiteStore(path) as store:
        assert store.log_recovered == 2 and store.log_torn_bytes == 0
        heads = {a: seq for a, (seq, _h) in store.heads().items()}
        assert heads == {writer(0).identity.public: 7}  # the peer's open group is gone
        assert store.signature(writer(0).identity.public, 7) is not None
        assert rehydrate(store).events == 7
    assert not _log(path).exists()


def test_a_torn_last_record_is_cut_off_and_counted(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(2), writer(0)
    SQLiteStore(path).close()
    first, sig1 = make_batch(me, 2, rng)
    second, sig2 = make_batch(me, 2, rng)
    whole = encode_record(me.identity.public, sig1, [e.raw for e in first])
    torn = encode_record(me.identity.public, sig2, [e.raw for e in second])[:-5]
    _log(path).write_bytes(whole + torn)
    with SQLiteStore(path) as store:
        assert store.log_recovered == 1 and store.log_torn_bytes == len(torn)
        assert store.heads()[me.identity.public][0] == 2


def test_records_already_committed_are_skipped(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(3), writer(0)
    with _logging_store(path) as store:
        events, sig = make_batch(me, 3, rng)
        store.append(me.identity.public, events, sig)
        leftover = _log(path).read_bytes()  # as if we died after the commit
        store.sync()
    _log(path).write_bytes(leftover)
    with SQLiteStore(path) as store:
        assert store.log_recovered == 0
        assert store.heads()[me.identity.public][0] == 3
    assert not _log(path).exists()


def test_a_record_that_does_not_fit_the_store_is_set_aside(tmp_path: Path) -> None:
    """Only a power loss that rolled the store back can leave such a record:
    the store opens at what it holds and the log is kept for inspection."""
    path, rng, me = tmp_path / "s.db", random.Random(4), writer(0)
    SQLiteStore(path).close()
    make_batch(me, 2, rng)  # never stored: the logged batch below has a hole
    events, sig = make_batch(me, 2, rng)
    record = encode_record(me.identity.public, sig, [e.raw for e in events])
    _log(path).write_bytes(record)
    with SQLiteStore(path) as store:
        assert store.log_orphaned == 1 and store.log_recovered == 0
        assert store.heads() == {}
    assert not _log(path).exists()
    assert Path(f"{_log(path)}.orphaned").read_bytes() == record


def test_a_logged_event_that_differs_from_the_stored_one_is_set_aside(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(8), writer(0)
    with SQLiteStore(path) as store:
        events, sig = make_batch(me, 2, rng)
        store.append(me.identity.public, events, sig)
    other, other_sig = make_batch(writer(0), 2, random.Random(9))  # same seqs, other events
    assert other[-1].raw != events[-1].raw
    _log(path).write_bytes(encode_record(me.identity.public, other_sig, [e.raw for e in other]))
    with SQLiteStore(path) as store:
        assert store.log_orphaned == 1
        assert store.read_range(me.identity.public, 1, 2) == [e.raw for e in events]


def test_a_second_opener_leaves_a_live_writers_log_alone(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(5), writer(0)
    with _logging_store(path) as live:
        events, sig = make_batch(me, 2, rng)
        live.append(me.identity.public, events, sig)
        with SQLiteStore(path) as reader:
            assert reader.log_recovered == 0 and reader.heads() == {}
        assert _log(path).stat().st_size > 0  # still the live writer's
        live.sync()
        assert committed_heads(path) == {me.identity.public: 2}


@pytest.mark.parametrize("via", ["sync", "a full group"])
def test_a_failed_commit_keeps_logged_appends_and_no_new_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """Logged batches stay pending for the next try; an append whose full
    group failed to commit first raises without taking its batch."""
    if via == "a full group":
        monkeypatch.setattr(sqlite_mod, "GROUP_MAX_APPENDS", 1)
    path, rng, me = tmp_path / "s.db", random.Random(6), writer(0)
    with _logging_store(path) as store:
        real = store.db
        first, sig1 = make_batch(me, 2, rng)
        store.append(me.identity.public, first, sig1)  # logged, pending
        second, sig2 = make_batch(me, 1, rng)
        store._db = FailingCommits(real, failures=1)  # type: ignore[assignment]
        with pytest.raises(StoreError):
            if via == "sync":
                store.sync()
            else:
                store.append(me.identity.public, second, sig2)
        assert store.pending == 1 and _log(path).stat().st_size > 0
        store._db = real
        store.append(me.identity.public, second, sig2)  # continues the feed (or is retried)
        store.sync()
        assert committed_heads(path) == {me.identity.public: 3}


def test_a_batch_over_the_record_limit_is_refused_before_it_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(appendlog_mod, "_MAX_PAYLOAD", 100)
    path, rng, me = tmp_path / "s.db", random.Random(11), writer(0)
    with _logging_store(path) as store:
        events, sig = make_batch(me, 2, rng)
        with pytest.raises(InvalidArgument, match="record limit"):
            store.append(me.identity.public, events, sig)
        assert store.pending == 0 and store.heads() == {}


def test_a_log_write_that_fails_is_a_store_error_and_changes_nothing(tmp_path: Path) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(7), writer(0)
    with _logging_store(path) as store:
        events, sig = make_batch(me, 2, rng)
        _log(path).mkdir()  # the log cannot be opened for writing
        with pytest.raises(StoreError, match="append log"):
            store.append(me.identity.public, events, sig)
        assert store.pending == 0
        os.rmdir(_log(path))
        store.append(me.identity.public, events, sig)  # the same batch, now accepted
        store.sync()
        assert committed_heads(path) == {me.identity.public: 2}


def test_a_close_whose_commit_fails_still_closes_and_the_next_open_recovers(
    tmp_path: Path,
) -> None:
    path, rng, me = tmp_path / "s.db", random.Random(12), writer(0)
    store = _logging_store(path)
    real = store.db
    events, sig = make_batch(me, 2, rng)
    store.append(me.identity.public, events, sig)
    store._db = FailingCommits(real, failures=1)  # type: ignore[assignment]
    with pytest.raises(StoreError):
        store.close()
    with pytest.raises(StoreError, match="closed"):
        store.heads()
    assert read_records(_log(path).read_bytes()).records  # kept for the next open
    with SQLiteStore(path) as again:
        assert again.log_recovered == 1 and again.heads()[me.identity.public][0] == 2
