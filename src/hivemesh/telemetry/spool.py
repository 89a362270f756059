"""The sender's durable telemetry spool (SQLite).

Theory of operation
-------------------
Every record an agent makes is written here *before* anyone tries to send
it, with the next per-sender sequence number. The sender
(:mod:`.sender`) repeatedly takes the oldest unacknowledged records as one
batch (:meth:`Spool.take_batch`; records are stored one msgpack map each and
encoded per batch, columnar when asked), delivers it, and on the collector's ack
deletes them (:meth:`Spool.ack`). Until the ack, :meth:`take_batch` keeps
returning the same records, so a lost batch or a lost ack only causes a
resend, which the collector de-duplicates by ``(sender, seq)``.

Durability: SQLite in WAL mode with ``synchronous=NORMAL``; a committed
append survives ``kill -9`` of the process (the WAL is in the OS page cache);
a power cut may lose the last few commits, which the collector then reports
as a gap.

Sequence numbers are never reused. The last assigned seq lives in the spool
database *and* in a small sidecar file (``<path>.seq``) written on every
commit, so that if the spool database is deleted or corrupted the new spool
continues the numbering and the collector sees, and reports, the hole.

Bounded: at ``max_records`` waiting records a new record is dropped, its seq
still consumed (so the loss shows up at the collector as a gap), the drop
counted, and :class:`~hivemesh.telemetry.errors.SpoolFull` raised. The backlog is
visible through :meth:`Spool.statistics` and in every batch (``backlog``).
"""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from hivemesh.errors import InvalidArgument, StoreCorrupt, StoreError
from hivemesh.stores.private import create_private
from hivemesh.stores.sqlite_file import build_atomically
from hivemesh.telemetry.errors import SpoolFull
from hivemesh.telemetry.schema import BATCH_TYPE, MAX_BATCH_BYTES, MAX_BATCH_RECORDS

__all__ = ["Spool", "SpoolBatch", "SpoolStats"]

_SEQ_FMT = struct.Struct("<Q")


def _create_tables(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS spool(seq INTEGER PRIMARY KEY, rec BLOB NOT NULL)")
    db.execute("CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL)")


_BATCH_BYTES_TARGET = MAX_BATCH_BYTES - 4096


@dataclass(frozen=True, slots=True)
class SpoolBatch:
    """The oldest waiting records, encoded as one batch ready to deliver."""

    first_seq: int
    last_seq: int
    count: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class SpoolStats:
    """Counters of a spool."""

    backlog: int
    last_seq: int
    acked_seq: int
    dropped: int
    max_records: int


class Spool:
    """A durable, bounded FIFO of metric records with per-sender sequence numbers."""

    def __init__(self, path: str | os.PathLike[str], *, max_records: int = 1_000_000) -> None:
        if max_records < 1:
            raise InvalidArgument("max_records must be >= 1")
        self.path = Path(path)
        self.max_records = max_records
        self._lock = threading.Lock()
        try:
            if not self.path.exists():  # built aside: 2 syncs, not SQLite's 6 in place
                build_atomically(self.path, _create_tables)
            create_private(self.path)  # 0600, and so its -wal and -shm
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            _create_tables(self._db)
            meta = dict(self._db.execute("SELECT k, v FROM meta").fetchall())
            row = self._db.execute("SELECT count(*), max(seq) FROM spool").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreCorrupt(f"telemetry spool {self.path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"telemetry spool {self.path}: cannot create it: {exc}") from exc
        self._backlog: int = row[0]
        self._seq_fd = os.open(f"{self.path}.seq", os.O_RDWR | os.O_CREAT, 0o600)
        side = os.pread(self._seq_fd, 8, 0)
        side_seq = _SEQ_FMT.unpack(side)[0] if len(side) == 8 else 0
        self._last_seq: int = max(meta.get("last_seq", 0), row[1] or 0, side_seq)
        self._acked_seq: int = meta.get("acked_seq", 0)
        self._dropped: int = meta.get("dropped", 0)
        self._packer = msgpack.Packer(use_bin_type=True)

    # -- writing ---------------------------------------------------------------

    def append(self, record: Mapping[str, Any]) -> int:
        """Store one record (without ``seq``); return its seq. See :meth:`append_many`."""
        return self.append_many((record,))[0]

    def append_many(self, records: Iterable[Mapping[str, Any]]) -> list[int]:
        """Store records in one transaction, numbering them; return their seqs.

        Raises :class:`SpoolFull` (after storing what fitted) when the spool
        is at ``max_records``; the dropped records' seqs are consumed.
        """
        pack = self._packer.pack
        with self._lock:
            seq = self._last_seq
            rows: list[tuple[int, bytes]] = []
            seqs: list[int] = []
            dropped = 0
            room = self.max_records - self._backlog
            for rec in records:
                if "seq" in rec:
                    raise InvalidArgument("the spool assigns seq; do not set it")
                seq += 1
                seqs.append(seq)
                if len(rows) < room:
                    rows.append((seq, pack({"seq": seq, **rec})))
                else:
                    dropped += 1
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany("INSERT INTO spool(seq, rec) VALUES (?, ?)", rows)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('last_seq', ?)", (seq,))
                if dropped:
                    db.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('dropped', ?)",
                        (self._dropped + dropped,),
                    )
                db.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc, "append")
                raise
            os.pwrite(self._seq_fd, _SEQ_FMT.pack(seq), 0)
            self._last_seq = seq
            self._backlog += len(rows)
            self._dropped += dropped
        if dropped:
            raise SpoolFull(f"telemetry spool full ({self.max_records}); dropped {dropped}")
        return seqs

    def _abort(self, exc: BaseException, what: str) -> None:
        """Roll back a failed transaction (SQLite has already rolled back one
        whose COMMIT hit a full disk) and turn an SQLite error into a typed
        :class:`~hivemesh.errors.StoreError` (found by ``hivemesh chaos``:
        a full disk made ``metrics.record`` fail with a bare OperationalError)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"telemetry spool {self.path}: cannot {what}: {exc}") from exc

    # -- reading and acknowledging ---------------------------------------------

    def take_batch(
        self, max_n: int = 1000, max_bytes: int = _BATCH_BYTES_TARGET, *, columnar: bool = False
    ) -> SpoolBatch | None:
        """The oldest waiting records (at most ``max_n``, and at most ``max_bytes``
        encoded, but at least one) as one batch, or None.

        ``columnar``: encode a v2 batch (:mod:`.columnar`, ~25 bytes a record)
        when every record fits its typed form, else v1 (a map per record).
        Does not remove them: call :meth:`ack` once the collector acknowledged.
        """
        max_n = max(1, min(max_n, MAX_BATCH_RECORDS))
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, rec FROM spool ORDER BY seq LIMIT ?", (max_n,)
            ).fetchall()
            if not rows:
                return None
            if columnar:
                got = self._columnar(rows, max_bytes)
                if got is not None:
                    return got
            total = 0
            n = 0
            for _seq, rec in rows:
                total += len(rec)
                if total > max_bytes and n:
                    break
                n += 1
            rows = rows[:n]
            pk = self._packer.pack
            head = b"".join(
                (
                    self._packer.pack_map_header(5),
                    pk("type"),
                    pk(BATCH_TYPE),
                    pk("v"),
                    pk(1),
                    pk("hi"),
                    pk(self._last_seq),
                    pk("backlog"),
                    pk(self._backlog),
                    pk("records"),
                    self._packer.pack_array_header(n),
                )
            )
            payload = head + b"".join(r[1] for r in rows)
            return SpoolBatch(first_seq=rows[0][0], last_seq=rows[-1][0], count=n, payload=payload)

    def _columnar(self, rows: list[tuple[int, bytes]], max_bytes: int) -> SpoolBatch | None:
        # imported here: the columnar codec loads Arrow, which a node that
        # never ships a v2 batch should not pay for at start-up
        from hivemesh.telemetry.columnar import encode_columnar

        n = len(rows)
        for _ in range(4):  # shrink until it fits (distinct long strings weigh more)
            payload = encode_columnar([r[1] for r in rows[:n]], self._last_seq, self._backlog)
            if payload is None:
                return None
            if len(payload) <= max_bytes:
                return SpoolBatch(rows[0][0], rows[n - 1][0], n, payload)
            if n == 1:
                return None
            n = max(1, n * max_bytes * 9 // (10 * len(payload)))
        return None

    def ack(self, up_to_seq: int) -> int:
        """Delete every waiting record with seq <= ``up_to_seq``; return how many."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                cur = db.execute("DELETE FROM spool WHERE seq <= ?", (up_to_seq,))
                n = cur.rowcount
                if up_to_seq > self._acked_seq:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('acked_seq', ?)", (up_to_seq,))
                db.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc, "acknowledge")
                raise
            self._backlog -= n
            self._acked_seq = max(self._acked_seq, up_to_seq)
            return n

    # -- introspection ---------------------------------------------------------

    @property
    def backlog(self) -> int:
        """Records waiting to be acknowledged."""
        return self._backlog

    @property
    def last_seq(self) -> int:
        """The last seq assigned (0 if none)."""
        return self._last_seq

    def statistics(self) -> SpoolStats:
        """A frozen snapshot of the spool's counters."""
        with self._lock:
            return SpoolStats(
                backlog=self._backlog,
                last_seq=self._last_seq,
                acked_seq=self._acked_seq,
                dropped=self._dropped,
                max_records=self.max_records,
            )

    def close(self) -> None:
        """Close the database and the sidecar file."""
        with self._lock:
            self._db.close()
            if self._seq_fd >= 0:
                os.close(self._seq_fd)
                self._seq_fd = -1
