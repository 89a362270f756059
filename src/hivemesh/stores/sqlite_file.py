"""Creating and opening the SQLite file behind :class:`~hivemesh.stores.sqlite.SQLiteStore`.

A store file is created atomically (built under a temporary name, fsync'ed,
then hard-linked into place, so a crash never leaves a half-initialised
store), carries SQLite ``application_id`` :data:`APPLICATION_ID` and a
``meta`` row with :data:`MAGIC` and the schema version, and is opened in WAL
mode with the pragmas the store relies on. Corruption is told from other
SQLite failures by :func:`is_corruption`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from hivemesh.errors import StoreCorrupt, StoreError
from hivemesh.stores.private import create_private

__all__ = [
    "APPLICATION_ID",
    "MAGIC",
    "SCHEMA_VERSION",
    "blob_digest",
    "build_atomically",
    "create_file",
    "guard",
    "is_corruption",
    "open_file",
]

#: SQLite header ``application_id`` of a hivemesh store ("HMST").
APPLICATION_ID = 0x484D5354
#: Value of the ``magic`` row in the ``meta`` table.
MAGIC = "hivemesh-store"
#: Schema version written by this module; older readers refuse newer files.
#: v2 adds ``runs`` (one row per appended batch); a v1 file is upgraded in
#: place when opened (its ``events`` rows stay and are still read).
SCHEMA_VERSION = 2

#: ``journal_size_limit``: the WAL file is trimmed to this after a restart.
_WAL_SIZE_LIMIT = 16 * 1024 * 1024
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_RUNS = (
    "CREATE TABLE IF NOT EXISTS runs (author BLOB NOT NULL, seq INTEGER NOT NULL,"
    " raws BLOB NOT NULL, PRIMARY KEY (author, seq)) WITHOUT ROWID"
)
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE events (author BLOB NOT NULL, seq INTEGER NOT NULL, raw BLOB NOT NULL,"
    " PRIMARY KEY (author, seq)) WITHOUT ROWID",
    _RUNS,
    "CREATE TABLE sigs (author BLOB NOT NULL, seq INTEGER NOT NULL, sig BLOB NOT NULL,"
    " PRIMARY KEY (author, seq)) WITHOUT ROWID",
    "CREATE TABLE feeds (author BLOB PRIMARY KEY, last_seq INTEGER NOT NULL,"
    " last_hash BLOB NOT NULL, n_sigs INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE blobs (digest BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID",
)


def blob_digest(data: bytes) -> bytes:
    """The content address of blob bytes: ``blake2b-256``."""
    return hashlib.blake2b(data, digest_size=32).digest()


def is_corruption(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return True
    msg = str(exc).lower()
    return "malformed" in msg or "not a database" in msg or "corrupt" in msg


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_file(path: Path) -> None:
    """Create an empty, initialised store at ``path`` atomically."""
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        # A side file only appears once the store is open, so if the store
        # exists when checked *after* the side file, a concurrent creator
        # linked it in meanwhile (not torn): the caller opens that one.
        if side.exists():
            if path.exists():
                return
            raise _corrupt(
                path,
                f"no store file but {side.name} exists (database deleted or torn); "
                "refusing to create a new store over it",
            )
    try:
        with guard(path, "creating the store"):
            build_atomically(path, _build)
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the store: {exc}") from exc


def build_atomically(path: Path, build: Callable[[sqlite3.Connection], object]) -> None:
    """Create the SQLite file ``path`` (mode 0600, WAL mode) unless it exists:
    ``build`` fills it under a temporary name (in one transaction, without
    syncs: the file is private until it is fsync'ed and hard-linked into
    place, then the directory fsync'ed), so a crash never leaves a
    half-built file at ``path``. Two syncs: SQLite building a file in place
    pays six or more (its rollback journal, the switch to WAL, the new WAL's
    header), 25-50 ms of a fresh node's start on a loaded box. Raises
    ``OSError`` or ``sqlite3.Error`` (what ``build`` raises)."""
    tmp = path.with_name(f".{path.name}.init-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        create_private(tmp)  # SQLite gives -journal/-wal/-shm the db file's mode
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous = OFF")
            db.execute("BEGIN")
            build(db)
            db.execute("COMMIT")
            db.execute("PRAGMA journal_mode = WAL")
        finally:
            db.close()
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # never clobbers a file created meanwhile
        _fsync_dir(path.parent)
    finally:
        for ext in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(f"{tmp}{ext}")


def _build(db: sqlite3.Connection) -> None:
    """Initialise an empty store (in :func:`build_atomically`'s transaction)."""
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    for stmt in _SCHEMA:
        db.execute(stmt)
    db.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("magic", MAGIC), ("schema_version", SCHEMA_VERSION)],
    )


def open_file(path: Path, durability: str) -> sqlite3.Connection:
    """Open the store at ``path`` in WAL mode (``durability`` as in the store)."""
    with guard(path, "opening the store"):
        db = sqlite3.connect(path, isolation_level=None)
        try:
            version = _check_identity(path, db)
            _check_size(path, db)
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: cannot enable WAL mode (got {mode!r})")
            if version < SCHEMA_VERSION:
                _upgrade(db)
            sync = "FULL" if durability == "power" else "NORMAL"
            db.execute(f"PRAGMA synchronous = {sync}")
            db.execute("PRAGMA cell_size_check = ON")
            db.execute("PRAGMA trusted_schema = OFF")
            db.execute("PRAGMA wal_autocheckpoint = 0")  # see Checkpointer
            db.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
        except BaseException:
            db.close()
            raise
    return db


def _check_size(path: Path, db: sqlite3.Connection) -> None:
    """Without a WAL (a clean close checkpoints it into the file), the file
    must hold every page its header counts: a file cut inside a page whose
    tail no row uses (a run's last overflow page) reads back unchanged, so
    only its size tells that it was torn."""
    wal = Path(f"{path}-wal")

    def wal_empty() -> bool:
        return not wal.exists() or not wal.stat().st_size

    if not wal_empty():
        return  # pages may still live in the WAL only
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    size = path.stat().st_size
    if size < pages * page_size and wal_empty():  # (not a writer that just began)
        raise _corrupt(path, f"file is {size} bytes, its header counts {pages} pages")


def _upgrade(db: sqlite3.Connection) -> None:
    """v1 -> v2 in one transaction: add the ``runs`` table (nothing is moved)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(_RUNS)
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _check_identity(path: Path, db: sqlite3.Connection) -> int:
    """Raise unless ``db`` is a hivemesh store this module can open; its schema version."""
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    if app_id != APPLICATION_ID:
        raise _corrupt(
            path,
            f"not a hivemesh store (SQLite application_id {app_id:#x}, want {APPLICATION_ID:#x})",
        )
    try:
        rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as exc:
        if is_corruption(exc):
            raise
        raise _corrupt(path, f"not a hivemesh store (no meta table: {exc})") from exc
    if rows.get("magic") != MAGIC:
        raise _corrupt(path, f"not a hivemesh store (magic {rows.get('magic')!r})")
    version = rows.get("schema_version")
    if type(version) is not int:
        raise _corrupt(path, f"schema version is {version!r}")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema v{version} is newer than this hivemesh "
            f"(supports v{SCHEMA_VERSION}); upgrade hivemesh"
        )
    return version


def _corrupt(path: Path, what: str) -> StoreCorrupt:
    return StoreCorrupt(f"{path}: {what}")


@contextlib.contextmanager
def guard(path: Path, doing: str) -> Iterator[None]:
    """Turn sqlite3 exceptions into the hivemesh error tree (naming ``path``)."""
    try:
        yield
    except sqlite3.Error as exc:
        if is_corruption(exc):
            raise _corrupt(path, f"store is corrupt while {doing}: {exc}") from exc
        raise StoreError(f"{path}: SQLite failed while {doing}: {exc}") from exc
