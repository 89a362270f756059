"""Reading and tampering with a store file's events behind the store's back.

A store keeps each appended batch as one ``runs`` row (``seq`` = its last
event's seq, ``raws`` = the msgpack array of its encoded events; see
:mod:`hivemesh.stores.sqlite`). These helpers address one event by
``(author, seq)`` and rewrite the run that holds it, as the tests once
rewrote an ``events`` row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgpack

__all__ = ["count_events", "delete_event", "event_raw", "renumber_run", "set_event_raw"]


def _connect(db: sqlite3.Connection | Path) -> tuple[sqlite3.Connection, bool]:
    if isinstance(db, sqlite3.Connection):
        return db, False
    return sqlite3.connect(db, isolation_level=None), True


def _run_of(db: sqlite3.Connection, author: bytes, seq: int) -> tuple[int, list[Any]]:
    """``(last seq, raws)`` of the run holding ``author``'s ``seq``."""
    row = db.execute(
        "SELECT seq, raws FROM runs WHERE author = ? AND seq >= ? ORDER BY seq LIMIT 1",
        (author, seq),
    ).fetchone()
    assert row is not None, f"no run holds #{seq}"
    last, blob = row
    raws = msgpack.unpackb(blob)
    assert last - len(raws) + 1 <= seq, f"no run holds #{seq}"
    return last, raws


def event_raw(db: sqlite3.Connection | Path, author: bytes, seq: int) -> bytes:
    """The stored bytes of ``author``'s event ``seq``."""
    conn, own = _connect(db)
    try:
        last, raws = _run_of(conn, author, seq)
        raw: bytes = raws[seq - (last - len(raws) + 1)]
        return raw
    finally:
        if own:
            conn.close()


def _write(conn: sqlite3.Connection, author: bytes, last: int, raws: list[Any]) -> None:
    if raws:
        conn.execute(
            "UPDATE runs SET raws = ? WHERE author = ? AND seq = ?",
            (msgpack.packb(raws), author, last),
        )
    else:
        conn.execute("DELETE FROM runs WHERE author = ? AND seq = ?", (author, last))


def set_event_raw(db: sqlite3.Connection | Path, author: bytes, seq: int, value: Any) -> None:
    """Store ``value`` (any msgpack value: bytes, or a wrong type) as event ``seq``."""
    conn, own = _connect(db)
    try:
        last, raws = _run_of(conn, author, seq)
        raws[seq - (last - len(raws) + 1)] = value
        _write(conn, author, last, raws)
    finally:
        if own:
            conn.close()


def delete_event(db: sqlite3.Connection | Path, author: bytes, seq: int) -> None:
    """Remove event ``seq`` from its run (the run's later events keep their seqs,
    so its earlier ones move up by one; a run left empty is deleted)."""
    conn, own = _connect(db)
    try:
        last, raws = _run_of(conn, author, seq)
        del raws[seq - (last - len(raws) + 1)]
        _write(conn, author, last, raws)
    finally:
        if own:
            conn.close()


def renumber_run(db: sqlite3.Connection | Path, author: bytes, seq: int, new_last: int) -> None:
    """Give the run holding ``seq`` another last seq (all its events move)."""
    conn, own = _connect(db)
    try:
        last, _raws = _run_of(conn, author, seq)
        conn.execute(
            "UPDATE runs SET seq = ? WHERE author = ? AND seq = ?", (new_last, author, last)
        )
    finally:
        if own:
            conn.close()


def count_events(db: sqlite3.Connection | Path) -> int:
    """Events stored in every run (and legacy ``events`` rows)."""
    conn, own = _connect(db)
    try:
        n = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        for (blob,) in conn.execute("SELECT raws FROM runs"):
            n += len(msgpack.unpackb(blob))
        return n
    finally:
        if own:
            conn.close()
