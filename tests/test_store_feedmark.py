"""The own feed's mark file: two slots, a checksum, bound to the key."""

from __future__ import annotations

import random
import time
from pathlib import Path

from hivemesh.core.ownfeed import Mark
from hivemesh.stores.feedmark import MARK_FILE, SLOT_BYTES, FileMarkStore, open_mark
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import make_batch, writer

ME, OTHER = b"m" * 32, b"o" * 32


def test_saves_alternate_slots_and_the_newest_is_read(tmp_path: Path) -> None:
    path = tmp_path / MARK_FILE
    marks = FileMarkStore(path, ME)
    assert marks.load() is None and marks.problem == ""  # no file
    for seq in range(1, 6):
        marks.save(Mark(seq, bytes([seq]) * 32))
    marks.close()
    assert path.stat().st_size == 2 * SLOT_BYTES
    assert FileMarkStore(path, ME).load() == Mark(5, b"\x05" * 32)
    again = FileMarkStore(path, ME)  # a reopened store continues the generations
    again.save(Mark(6, b"\x06" * 32, 3, 4))
    again.close()
    assert FileMarkStore(path, ME).load() == Mark(6, b"\x06" * 32, 3, 4)


def test_a_torn_slot_falls_back_to_the_save_before(tmp_path: Path) -> None:
    path = tmp_path / MARK_FILE
    marks = FileMarkStore(path, ME)
    marks.save(Mark(1, b"\x01" * 32))  # generation 1: slot 1
    marks.save(Mark(2, b"\x02" * 32))  # generation 2: slot 0
    marks.close()
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # power loss tore the newest slot
    path.write_bytes(bytes(data))
    assert FileMarkStore(path, ME).load() == Mark(1, b"\x01" * 32)
    data[SLOT_BYTES + 40] ^= 0xFF  # both torn: no usable mark (ask the peers)
    path.write_bytes(bytes(data))
    broken = FileMarkStore(path, ME)
    assert broken.load() is None and "no intact mark" in broken.problem


def test_a_mark_of_another_key_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / MARK_FILE
    theirs = FileMarkStore(path, OTHER)
    theirs.save(Mark(9, b"\x09" * 32))
    theirs.close()
    mine = FileMarkStore(path, ME)
    assert mine.load() is None and "another key" in mine.problem


def test_an_older_data_dir_gets_its_mark_from_the_store(tmp_path: Path) -> None:
    me = writer(0)
    with SQLiteStore(tmp_path / "store.db") as store:
        events, sig = make_batch(me, 4, random.Random(1))
        store.append(me.identity.public, events, sig)
        marks = open_mark(tmp_path, me.identity.public, store)
        assert marks.load() == Mark(4, events[-1].id)
        marks.close()
    with SQLiteStore(tmp_path / "other.db") as empty:  # no file and no feed: unknown
        (tmp_path / MARK_FILE).unlink()
        assert open_mark(tmp_path, me.identity.public, empty).load() is None


def test_a_save_costs_one_small_write(tmp_path: Path) -> None:
    """The mark is saved once per sealed own batch: keep it tiny (no fsync
    with durability="process")."""
    marks = FileMarkStore(tmp_path / MARK_FILE, ME)
    marks.save(Mark(1, b"\x01" * 32))
    n = 2000
    t0 = time.perf_counter()
    for seq in range(2, n + 2):
        marks.save(Mark(seq, b"\x02" * 32))
    per_save_us = (time.perf_counter() - t0) / n * 1e6
    marks.close()
    assert per_save_us < 200, per_save_us  # a few microseconds here; generous for load
