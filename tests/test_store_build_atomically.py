"""Fresh SQLite side files (inbox, telemetry spool) are built aside and linked in."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from hivemesh.stores.inbox import Inbox
from hivemesh.stores.sqlite_file import build_atomically
from hivemesh.telemetry.spool import Spool


def _journal_mode(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        db.close()


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.db"

    def build(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE t (a)")
        raise RuntimeError("crash mid-build")

    with pytest.raises(RuntimeError):
        build_atomically(path, build)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    build_atomically(path, lambda db: db.execute("CREATE TABLE first (a)"))
    build_atomically(path, lambda db: db.execute("CREATE TABLE second (a)"))
    db = sqlite3.connect(path)
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
    db.close()
    assert names == ["first"]


@pytest.mark.parametrize("name", ["inbox.db", "spool.sqlite3"])
def test_fresh_side_files_are_private_wal_and_alone(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.startswith("inbox"):
        Inbox(path).db.close()
    else:
        Spool(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _journal_mode(path) == "wal"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
