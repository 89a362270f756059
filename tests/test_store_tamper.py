"""Torn and tampered store files are detected with a clear StoreCorrupt.

Every mutation below ends in exactly one of two ways: a
:class:`~hivemesh.errors.StoreCorrupt` that names the file, or (for byte
overwrites that land in unused space) a replay identical to the original.
Anything else -- another exception, or different data accepted -- fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import unpack
from hivemesh.core.event import encode_event
from hivemesh.errors import StoreCorrupt, StoreError
from hivemesh.stores.replay import verify_feeds
from hivemesh.stores.sqlite import SQLiteStore
from store_rows import delete_event, event_raw, renumber_run, set_event_raw
from test_store_support import build_store

Snapshot = tuple[list[bytes], dict[bytes, tuple[int, bytes]], list[list[int]]]
FEED_RE = re.compile(r"feed hm[a-z2-7]{10} #(\d+): ")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "store.db"
    build_store(path, authors=3, batches=30, seed=7)
    return path


def snapshot(path: Path) -> Snapshot:
    """Everything a replay of ``path`` yields (raises StoreCorrupt if torn)."""
    with SQLiteStore(path) as store:
        ids = [e.id for e in verify_feeds(store)]
        heads = store.heads()
        sigs = [store.signed_seqs(a) for a in sorted(heads)]
    return ids, heads, sigs


def mutated(pristine: Path, tmp: Path, mutate: Callable[[Path], None]) -> Path:
    path = tmp / "store.db"
    for side in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        side.unlink(missing_ok=True)
    shutil.copyfile(pristine, path)
    mutate(path)
    return path


def sql(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """Tamper with the file behind the store's back."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for stmt, args in statements:
            db.execute(stmt, args)
    finally:
        db.close()


def expect_corrupt(path: Path) -> StoreCorrupt:
    with pytest.raises(StoreCorrupt) as info:
        snapshot(path)
    assert str(path) in str(info.value)
    return info.value


def feed_row(path: Path, offset_from_end: int) -> tuple[bytes, int, bytes, int]:
    """(author, seq, raw, last_seq) of a row of the longest feed."""
    db = sqlite3.connect(path)
    try:
        author, last = db.execute(
            "SELECT author, last_seq FROM feeds ORDER BY last_seq DESC LIMIT 1"
        ).fetchone()
        seq = last - offset_from_end
        raw = event_raw(db, author, seq)
    finally:
        db.close()
    return author, seq, raw, last


def test_pristine_store_verifies(pristine: Path) -> None:
    ids, heads, sigs = snapshot(pristine)
    assert len(ids) == sum(seq for seq, _ in heads.values()) > 100
    assert len(heads) == 3 and sum(len(s) for s in sigs) == 30


def test_truncated_file_is_always_detected(pristine: Path, tmp_path: Path) -> None:
    size = pristine.stat().st_size
    rng = random.Random(20261129)
    offsets = [0, 1, 50, 99, 100, 4096, size - 1] + [rng.randrange(size) for _ in range(40)]
    for off in offsets:

        def truncate(p: Path, off: int = off) -> None:
            os.truncate(p, off)

        path = mutated(pristine, tmp_path, truncate)
        expect_corrupt(path)


def test_overwritten_bytes_are_detected_or_harmless(pristine: Path, tmp_path: Path) -> None:
    original = snapshot(pristine)
    size = pristine.stat().st_size
    rng = random.Random(4242)
    detected = 0
    for _ in range(150):
        off, junk = rng.randrange(size), rng.randbytes(rng.randrange(1, 48))

        def overwrite(p: Path, off: int = off, junk: bytes = junk) -> None:
            with p.open("r+b") as f:
                f.seek(off)
                f.write(junk)

        path = mutated(pristine, tmp_path, overwrite)
        try:
            got = snapshot(path)
        except StoreCorrupt as exc:
            assert str(path) in str(exc)
            detected += 1
        else:
            assert got == original, f"overwrite at {off} accepted altered data"
    assert detected > 50  # the mutations do hit live data


def _rewrite_body(path: Path, back: int) -> int:
    """Replace event ``last - back`` by a well-formed event with another body."""
    author, seq, raw, _ = feed_row(path, back)
    _v, a, s, prev, hlc, kind, _body = unpack(raw)
    forged = encode_event(a, s, prev, hlc, kind, {"forged": True})
    set_event_raw(path, author, seq, forged.raw)
    return seq


@pytest.mark.parametrize("back", [0, 1, 5])
def test_altered_event_is_detected(pristine: Path, tmp_path: Path, back: int) -> None:
    seqs: list[int] = []
    path = mutated(pristine, tmp_path, lambda p: seqs.append(_rewrite_body(p, back)))
    err = expect_corrupt(path)
    m = FEED_RE.search(str(err))
    assert m is not None, str(err)
    # Caught at the event itself (its signature) or its successor (the chain).
    assert int(m.group(1)) in (seqs[0], seqs[0] + 1)


def test_flipped_byte_in_event_row_is_detected(pristine: Path, tmp_path: Path) -> None:
    def flip(p: Path) -> None:
        author, seq, raw, _ = feed_row(p, 3)
        bad = raw[:-1] + bytes([raw[-1] ^ 0x01])
        set_event_raw(p, author, seq, bad)

    expect_corrupt(mutated(pristine, tmp_path, flip))


def test_event_stored_as_wrong_type_is_detected(pristine: Path, tmp_path: Path) -> None:
    def retype(p: Path) -> None:
        author, seq, _, _ = feed_row(p, 2)
        set_event_raw(p, author, seq, "text")

    assert "does not decode" in str(expect_corrupt(mutated(pristine, tmp_path, retype)))


def test_deleted_middle_event_is_detected(pristine: Path, tmp_path: Path) -> None:
    def delete(p: Path) -> None:
        author, seq, _, _ = feed_row(p, 7)
        delete_event(p, author, seq)

    assert "expected" in str(expect_corrupt(mutated(pristine, tmp_path, delete)))


def test_deleted_last_event_is_detected(pristine: Path, tmp_path: Path) -> None:
    def delete(p: Path) -> None:
        author, seq, _, _ = feed_row(p, 0)
        delete_event(p, author, seq)

    expect_corrupt(mutated(pristine, tmp_path, delete))


def test_renumbered_row_is_detected(pristine: Path, tmp_path: Path) -> None:
    def renumber(p: Path) -> None:
        author, seq, _, last = feed_row(p, 0)
        renumber_run(p, author, seq, last + 5)

    expect_corrupt(mutated(pristine, tmp_path, renumber))


def test_altered_signature_is_detected(pristine: Path, tmp_path: Path) -> None:
    def alter(p: Path) -> None:
        sql(p, ("UPDATE sigs SET sig = zeroblob(64)", ()))

    err = expect_corrupt(mutated(pristine, tmp_path, alter))
    assert "signature over the head does not verify" in str(err)


def test_one_flipped_signature_bit_is_detected(pristine: Path, tmp_path: Path) -> None:
    def alter(p: Path) -> None:
        db = sqlite3.connect(p)
        author, seq, sig = db.execute(
            "SELECT author, seq, sig FROM sigs LIMIT 1 OFFSET 4"
        ).fetchone()
        db.close()
        bad = bytes([sig[0] ^ 0x80]) + sig[1:]
        sql(p, ("UPDATE sigs SET sig = ? WHERE author = ? AND seq = ?", (bad, author, seq)))

    assert "signature" in str(expect_corrupt(mutated(pristine, tmp_path, alter)))


@pytest.mark.parametrize("value", ["'text'", "42", "x'00'", "zeroblob(63)", "3.5"])
def test_signature_of_wrong_type_or_size_is_detected(
    pristine: Path, tmp_path: Path, value: str
) -> None:
    def alter(p: Path) -> None:
        db = sqlite3.connect(p)
        author, seq = db.execute("SELECT author, seq FROM sigs LIMIT 1 OFFSET 2").fetchone()
        db.close()
        sql(p, (f"UPDATE sigs SET sig = {value} WHERE author = ? AND seq = ?", (author, seq)))

    expect_corrupt(mutated(pristine, tmp_path, alter))


def test_deleted_signature_is_detected(pristine: Path, tmp_path: Path) -> None:
    def delete(p: Path) -> None:
        db = sqlite3.connect(p)
        author, seq = db.execute("SELECT author, seq FROM sigs ORDER BY author, seq").fetchone()
        db.close()
        sql(p, ("DELETE FROM sigs WHERE author = ? AND seq = ?", (author, seq)))

    assert "signatures stored" in str(expect_corrupt(mutated(pristine, tmp_path, delete)))


def test_rolled_back_head_is_detected(pristine: Path, tmp_path: Path) -> None:
    def rollback(p: Path) -> None:
        author, _, _, last = feed_row(p, 0)
        sql(p, ("UPDATE feeds SET last_seq = ? WHERE author = ?", (last - 1, author)))

    assert "recorded head" in str(expect_corrupt(mutated(pristine, tmp_path, rollback)))


def test_missing_feed_row_is_detected(pristine: Path, tmp_path: Path) -> None:
    def drop(p: Path) -> None:
        author, _, _, _ = feed_row(p, 0)
        sql(p, ("DELETE FROM feeds WHERE author = ?", (author,)))

    assert "no feed head" in str(expect_corrupt(mutated(pristine, tmp_path, drop)))


def test_tampered_blob_is_detected(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "b.db"
    data = b"screenshot" * 100
    digest = hashlib.blake2b(data, digest_size=32).digest()
    with SQLiteStore(path) as store:
        store.put_blob(digest, data)
    sql(path, ("UPDATE blobs SET data = ?", (b"x" + data[1:],)))
    with SQLiteStore(path) as store, pytest.raises(StoreCorrupt, match="content hash"):
        store.get_blob(digest)


@pytest.mark.parametrize(
    "content", [b"", b"\x00" * 10, b"SQLite format 3\x00" + b"\xff" * 200, b"not a db" * 1000]
)
def test_garbage_file_is_not_a_store(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(StoreCorrupt, match=re.escape(str(path))):
        SQLiteStore(path)


def test_foreign_sqlite_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sql(path, ("CREATE TABLE t (x)", ()), ("INSERT INTO t VALUES (1)", ()))
    with pytest.raises(StoreCorrupt, match="not a hivemesh store"):
        SQLiteStore(path)


def test_missing_magic_is_detected(pristine: Path, tmp_path: Path) -> None:
    path = mutated(pristine, tmp_path, lambda p: sql(p, ("DELETE FROM meta", ())))
    with pytest.raises(StoreCorrupt, match="magic"):
        SQLiteStore(path)


def test_newer_schema_is_refused_not_called_corrupt(pristine: Path, tmp_path: Path) -> None:
    def bump(p: Path) -> None:
        sql(p, ("UPDATE meta SET value = 99 WHERE key = 'schema_version'", ()))

    with pytest.raises(StoreError, match="newer") as info:
        SQLiteStore(mutated(pristine, tmp_path, bump))
    assert not isinstance(info.value, StoreCorrupt)


def test_orphan_wal_without_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gone.db"
    Path(f"{path}-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\x00" * 28)
    with pytest.raises(StoreCorrupt, match="wal"):
        SQLiteStore(path)
    assert not path.exists()


_VALUES = st.one_of(
    st.binary(max_size=80),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.floats(allow_nan=False),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    table=st.sampled_from(["runs", "sigs", "feeds"]),
    row=st.integers(0, 10_000),
    column=st.integers(0, 3),
    value=_VALUES,
)
def test_any_cell_rewritten_is_detected_or_unchanged(
    pristine: Path, tmp_path: Path, table: str, row: int, column: int, value: object
) -> None:
    original = snapshot(pristine)
    columns = {
        "runs": ["author", "seq", "raws"],
        "sigs": ["author", "seq", "sig"],
        "feeds": ["author", "last_seq", "last_hash", "n_sigs"],
    }[table]
    col = columns[column % len(columns)]

    def rewrite(p: Path) -> None:
        db = sqlite3.connect(p, isolation_level=None)
        try:
            (n,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
            keys = db.execute(
                f"SELECT {columns[0]}, {columns[1]} FROM {table} LIMIT 1 OFFSET ?", (row % n,)
            ).fetchone()
            # IntegrityError: the new key collides with another row, nothing changed.
            with contextlib.suppress(sqlite3.IntegrityError):
                db.execute(
                    f"UPDATE {table} SET {col} = ? WHERE {columns[0]} = ? AND {columns[1]} = ?",
                    (value, *keys),
                )
        finally:
            db.close()

    path = mutated(pristine, tmp_path, rewrite)
    try:
        got = snapshot(path)
    except StoreCorrupt as exc:
        assert str(path) in str(exc)
    else:
        assert got == original
