"""SQLite feed store: the node's durable journal and blob cache.

Theory of operation
-------------------
One SQLite file per node, in WAL mode, implementing
:class:`hivemesh.core.store.FeedStore`::

    meta   (key TEXT PRIMARY KEY, value)              -- magic, schema version
    runs   (author, seq, raws)   PK (author, seq)      WITHOUT ROWID
    events (author, seq, raw)    PK (author, seq)      WITHOUT ROWID  -- v1 files
    sigs   (author, seq, sig)    PK (author, seq)      WITHOUT ROWID
    feeds  (author, last_seq, last_hash, n_sigs)       WITHOUT ROWID
    blobs  (digest, data)        PK digest             WITHOUT ROWID

A ``runs`` row holds one appended batch: ``seq`` is its last event's seq,
``raws`` the msgpack array of its encoded events (the first is at
``seq - len(raws) + 1``). One row per signed batch instead of one per event:
a late joiner's catch-up stores ~50 rows for 50k events, and a group commit
costs a fraction of the per-event rows' CPU. Readers explode runs into
``(seq, raw)`` rows; a store created before v2 keeps its ``events`` rows
(one per event, no longer written) and readers merge both by seq. A run
that is not an array of at least one element raises :class:`StoreCorrupt`;
what its elements hold is checked by the readers' callers, as a stored
event row's bytes are (:func:`hivemesh.stores.replay.verify_feeds`).

Guarantees
~~~~~~~~~~
* **Atomic, durable appends.** :meth:`SQLiteStore.append` writes a batch's
  events, its signature and the feed's new head in one transaction. When it
  returns, the batch is committed (or, with the append log, durably logged).

  - ``durability="process"`` (default): ``synchronous=NORMAL``. The commit is
    in the WAL via ``write(2)`` before ``append`` returns, so it survives the
    *process* being killed at any instant (``kill -9``, OOM, crash). An OS
    crash or power loss may roll back the last few commits, never corrupt
    the file.
  - ``durability="power"``: ``synchronous=FULL``. The WAL is fsync'ed on
    every commit; acknowledged appends also survive power loss. Slower.

* **Write-behind for replicated batches (opt-in).** With
  :attr:`SQLiteStore.write_behind` set (the daemon sets it), an append made
  with ``durable=False`` -- a batch received from a peer, which the author and
  other replicas still hold -- is checked against the feed's head (cached:
  this connection is the only writer) and joins a *pending group* in memory;
  the group is written in one transaction (so every batch is still
  all-or-nothing) by the next :meth:`SQLiteStore.sync`, by the next
  ``durable`` append unless the append log (below) takes it (our own events
  are never acknowledged or sent before they are durable), by any read
  (reads see every append), or when it reaches :data:`GROUP_MAX_APPENDS` /
  :data:`GROUP_MAX_BYTES`. A ``kill -9`` loses at most the pending group, which anti-entropy pulls
  again from the peers; the saving is a transaction per received frame
  (three ``executemany`` per group instead of five statements per batch).

* **Append log for our own batches (opt-in).** With
  :attr:`SQLiteStore.append_log` set as well (the daemon sets both), a
  *durable* append -- our own batch -- is made durable by one ``write(2)`` to
  ``<store>-appends`` (plus ``fdatasync`` with ``durability="power"``) and
  joins the pending group instead of committing its own transaction; the
  group's commit empties the log, and opening the store commits whatever a
  crash left in it (:mod:`hivemesh.stores.appendlog`). The same guarantee
  as a commit for each durability setting, about 100 us less on the path of
  every publish.

* **A failed commit loses nothing and blocks nothing for good.** A group
  whose commit fails (a full disk, an I/O error) stays pending, whole, and
  is retried by the next ``sync``: its logged batches were acknowledged and
  the journal counts its replicated ones as held. An append whose *own*
  commit fails (a durable append without the log) takes its batch back
  out before it raises, so the caller may append the same seqs again. Once
  the disk has room, the next commit goes through; no restart is needed.

* **Only hivemesh files open.** The file is created atomically (built under a
  temporary name, fsync'ed, then linked into place), carries SQLite
  ``application_id`` :data:`APPLICATION_ID` and a ``meta`` row with
  :data:`MAGIC` and the schema version. An existing file that is empty, not
  SQLite, or lacks the magic raises :class:`~hivemesh.errors.StoreCorrupt`;
  a newer schema raises :class:`~hivemesh.errors.StoreError`.

* **Errors are typed.** SQLite corruption (``SQLITE_CORRUPT``,
  ``SQLITE_NOTADB``, "malformed") becomes :class:`StoreCorrupt` naming the
  file; every other SQLite failure (I/O, locking, full disk) becomes
  :class:`StoreError`. Misuse (a batch that does not continue the stored
  feed) is :class:`~hivemesh.errors.InvalidArgument`.

* **Checkpoints never stall an append.** SQLite's automatic checkpoint
  (which runs inside the committing ``append`` and fsyncs) is turned off; a
  background thread runs ``PASSIVE`` checkpoints (which never block
  writers) when enough WAL was written and at idle moments, and the WAL
  stays bounded (see :mod:`hivemesh.stores.checkpoint`). A checkpoint only
  copies committed pages into the main file: it cannot lose an append.

Limits: a damaged ``-wal`` file (torn by power loss, or edited) is cut by
SQLite at the first frame whose checksum fails: the store opens at the last
intact commit, consistent and verifiable, and later commits in that WAL are
gone without an error (nothing distinguishes that from a crash). A clean
:meth:`SQLiteStore.close` checkpoints the WAL into the main file.

What this module does *not* check is cryptography: a byte flipped inside a
stored event still reads back. :func:`hivemesh.stores.replay.verify_feeds`
re-derives every hash chain and checks every signature at rehydration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import msgpack

from hivemesh.core.event import GENESIS, Event, decode_event
from hivemesh.core.store import StoredHead
from hivemesh.errors import InvalidArgument, RemoteProtocolError, StoreCorrupt, StoreError
from hivemesh.stores import checkpoint
from hivemesh.stores.appendlog import LOG_SUFFIX, AppendLog, LogScan, claim
from hivemesh.stores.checkpoint import Checkpointer
from hivemesh.stores.sqlite_file import (
    APPLICATION_ID,
    MAGIC,
    SCHEMA_VERSION,
    blob_digest,
    create_file,
    guard,
    open_file,
)

log = logging.getLogger("hivemesh.stores")

__all__ = [
    "APPLICATION_ID",
    "GROUP_MAX_APPENDS",
    "GROUP_MAX_BYTES",
    "MAGIC",
    "SCHEMA_VERSION",
    "Durability",
    "FeedSummary",
    "SQLiteStore",
]

Durability = Literal["process", "power"]

#: ``author -> (last_seq, last_hash, number of stored signatures)``.
FeedSummary = dict[bytes, tuple[int, bytes, int]]

#: A write-behind group is committed once it holds this many appends ...
GROUP_MAX_APPENDS = 512
#: ... or this many event bytes.
GROUP_MAX_BYTES = 4 * 1024 * 1024

#: WAL bytes one commit is assumed to cost beyond its event bytes (pages of
#: the events, sigs and feeds b-trees).
_COMMIT_OVERHEAD = 3 * 4096

_SCAN_ROWS = 4096
_INSERT_RUN = "INSERT INTO runs (author, seq, raws) VALUES (?, ?, ?)"
#: A feed's stored rows in seq order: legacy event rows (v1) and runs.
_FEED_ROWS = (
    "SELECT seq, raw, 0 FROM events WHERE author = ?1 AND seq >= ?2"
    " UNION ALL SELECT seq, raws, 1 FROM runs WHERE author = ?1 AND seq >= ?2 ORDER BY 1"
)
_packb = msgpack.packb
_unpackb = msgpack.unpackb


class SQLiteStore:
    """A :class:`~hivemesh.core.store.FeedStore` in one SQLite (WAL) file.

    Not thread-safe: use one instance per thread (SQLite itself serialises
    writers across processes).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "process",
        group_commit: bool = False,
    ) -> None:
        """``group_commit`` sets both :attr:`write_behind` and :attr:`append_log`
        (the daemon's group commit; see the module docs) once the append log
        left by the last run was recovered, which commits each batch."""
        if durability not in ("process", "power"):
            raise InvalidArgument(f"durability must be 'process' or 'power', not {durability!r}")
        self.path = Path(path)
        self.durability: Durability = durability
        self._db: sqlite3.Connection | None = None
        self._ckpt: Checkpointer | None = None
        self._wal_pending = 0  # estimated WAL bytes since the last checkpoint
        #: Checkpoints ``append`` had to run itself (see :meth:`_committed`).
        self.sync_checkpoints = 0
        self._wal_estimate = 0  # WAL bytes: last measured size plus writes since
        self._seen_reports = 0
        #: Let ``append(..., durable=False)`` join a group transaction (see module docs).
        self.write_behind = False
        self._group_appends = 0  # appends not committed yet
        self._group_bytes = 0
        self._pending_runs: list[tuple[bytes, int, list[bytes]]] = []
        self._pending_sigs: list[tuple[bytes, int, bytes]] = []
        self._pending_feeds: dict[bytes, tuple[int, bytes, int]] = {}
        self._head_cache: dict[bytes, tuple[int, bytes, int]] = {}
        #: Make durable appends with one write to the append log and commit
        #: them with the group (needs :attr:`write_behind`; see the module docs).
        self.append_log = False
        self._log = AppendLog(Path(f"{self.path}{LOG_SUFFIX}"), fsync=durability == "power")
        #: Batches the last open recovered from the append log, the bytes of a
        #: torn record it cut off its end, and the records it had to set aside
        #: because they no longer fit the store (see the append log's docs).
        self.log_recovered = self.log_torn_bytes = self.log_orphaned = 0
        if not self.path.exists():
            create_file(self.path)
        elif self.path.stat().st_size == 0:
            raise StoreCorrupt(f"{self.path}: store file is empty (torn or truncated)")
        self._db = open_file(self.path, durability)
        try:
            self._recover_log()
        except BaseException:
            self.close()
            raise
        self.write_behind = self.append_log = group_commit

    # -- opening ----------------------------------------------------------------

    def _recover_log(self) -> None:
        """Commit the batches a crashed writer left in the append log."""
        found = claim(self._log.path)
        if found is None:
            return
        try:
            fits = self._replay_log(found.scan)
        except BaseException:
            found.release()
            raise
        if fits:
            found.done()
            return
        aside = found.set_aside()
        log.warning("%s: append log records past the store's head kept in %s", self.path, aside)

    def _replay_log(self, scan: LogScan) -> bool:
        """Commit the records that continue the store; False at the first
        one that neither continues it nor is stored already (module docs)."""
        self.log_torn_bytes = scan.torn_bytes
        for n, rec in enumerate(scan.records):
            try:
                events = [decode_event(raw) for raw in rec.raws]
                if events[-1].seq <= self._head_row(rec.author)[0]:
                    # committed before the log was emptied: the same event must be stored
                    stored = self.read_range(rec.author, events[-1].seq, events[-1].seq)
                    if stored != [events[-1].raw]:
                        raise InvalidArgument(f"#{events[-1].seq} differs from the stored one")
                    continue
                self.append(rec.author, events, rec.sig)  # no append_log yet: commits
            except (RemoteProtocolError, InvalidArgument):
                self.log_orphaned = len(scan.records) - n
                return False
            self.log_recovered += 1
        return True

    def _corrupt(self, what: str) -> StoreCorrupt:
        return StoreCorrupt(f"{self.path}: {what}")

    def _guard(self, doing: str) -> contextlib.AbstractContextManager[None]:
        """Turn sqlite3 exceptions into the hivemesh error tree."""
        return guard(self.path, doing)

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection; raises :class:`StoreError` after :meth:`close`."""
        if self._db is None:
            raise StoreError(f"{self.path}: store is closed")
        return self._db

    # -- FeedStore --------------------------------------------------------------

    def append(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        """Atomically store contiguous events of ``author`` and the signature
        over the last one (see :class:`~hivemesh.core.store.FeedStore`).

        Committed before returning, unless :attr:`write_behind` is set and
        ``durable`` is false (the batch joins the pending group, see module
        docs) or :attr:`append_log` is set too (the batch is durable in the
        append log and joins the group); :meth:`sync` commits the group. A
        group at its limits is committed *before* the batch joins it, so an
        append that raises never leaves its batch behind.
        Raises :class:`InvalidArgument` unless the batch continues the stored
        feed exactly (next seq, chained to the stored head).
        """
        if not events:
            raise InvalidArgument("append needs at least one event")
        if not isinstance(sig, bytes) or not sig:
            raise InvalidArgument("append needs a signature")
        prev = events[0]
        if prev.author != author:
            raise InvalidArgument("batch event is not by the given author")
        for e in events[1:]:
            if e.author != author or e.seq != prev.seq + 1 or e.prev != prev.id:
                raise InvalidArgument(f"batch is not a contiguous chain at #{e.seq}")
            prev = e
        first, last = events[0], prev
        last_seq, last_hash, n_sigs = self._head_row(author)
        if first.seq != last_seq + 1:
            raise InvalidArgument(
                f"append must continue the stored feed: got #{first.seq}, stored up to #{last_seq}"
            )
        if first.prev != last_hash:
            raise InvalidArgument(f"event #{first.seq} does not chain to the stored head")
        size = _COMMIT_OVERHEAD + len(events) * len(last.raw)  # an estimate
        if self._group_appends and (
            self._group_appends >= GROUP_MAX_APPENDS or self._group_bytes + size > GROUP_MAX_BYTES
        ):
            self.sync()  # the full group first: if that fails, this batch stays out
        logged = durable and self.append_log and self.write_behind
        if logged:
            try:
                self._log.write(author, sig, [e.raw for e in events])
            except OSError as exc:
                raise StoreError(f"{self._log.path}: writing the append log: {exc}") from exc
        pending_before = self._pending_feeds.get(author)
        self._pending_runs.append((author, last.seq, [e.raw for e in events]))
        self._pending_sigs.append((author, last.seq, sig))
        row = (last.seq, last.id, n_sigs + 1)
        self._pending_feeds[author] = self._head_cache[author] = row
        self._group_appends += 1
        self._group_bytes += size
        if (durable and not logged) or not self.write_behind:
            try:
                self.sync()
            except BaseException:  # this batch was not stored: take it back out
                self._pending_runs.pop()
                self._pending_sigs.pop()
                if pending_before is None:
                    del self._pending_feeds[author]
                else:
                    self._pending_feeds[author] = pending_before
                self._head_cache[author] = (last_seq, last_hash, n_sigs)
                self._group_appends -= 1
                self._group_bytes -= size
                raise

    def _head_row(self, author: bytes) -> tuple[int, bytes, int]:
        """``(last_seq, last_hash, n_sigs)`` of ``author``, pending appends
        included (cached: this connection is the feed tables' only writer)."""
        row = self._head_cache.get(author)
        if row is None:
            with self._guard("reading a feed head"):
                found = self.db.execute(
                    "SELECT last_seq, last_hash, n_sigs FROM feeds WHERE author = ?", (author,)
                ).fetchone()
            row = self._head_cache[author] = found if found is not None else (0, GENESIS, 0)
        return row

    @property
    def pending(self) -> int:
        """Appends not committed yet (0 unless :attr:`write_behind` grouped some)."""
        return self._group_appends

    def sync(self) -> None:
        """Commit every pending append in one transaction (see module docs),
        then empty the append log.

        On failure (a full disk, an I/O error) the error propagates and the
        whole group stays pending for the next ``sync``: every batch in it was
        accepted by an ``append`` that returned (logged batches of our own
        were acknowledged; the journal already counts replicated ones as
        held), so dropping any would leave the store behind what its callers
        hold. Appends keep joining the group up to its limits; a group at
        its limits makes the next ``append`` commit first and raise."""
        if not self._group_appends:
            return
        runs, sigs, feeds = self._pending_runs, self._pending_sigs, self._pending_feeds
        nbytes, appends = self._group_bytes, self._group_appends
        self._pending_runs, self._pending_sigs, self._pending_feeds = [], [], {}
        self._group_appends = self._group_bytes = 0
        db = self.db
        try:
            with self._guard("appending"):
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany(_INSERT_RUN, [(a, s, _packb(r)) for a, s, r in runs])
                    db.executemany("INSERT INTO sigs (author, seq, sig) VALUES (?, ?, ?)", sigs)
                    db.executemany(
                        "INSERT OR REPLACE INTO feeds (author, last_seq, last_hash, n_sigs)"
                        " VALUES (?, ?, ?, ?)",
                        [(a, *row) for a, row in feeds.items()],
                    )
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
        except BaseException:  # keep the group for the next try (see above)
            self._pending_runs, self._pending_sigs = runs, sigs
            self._pending_feeds = feeds
            self._group_appends, self._group_bytes = appends, nbytes
            raise
        if self._log.size:
            try:
                self._log.reset()
            except OSError as exc:  # committed: the next open skips what it still holds
                raise StoreError(f"{self._log.path}: emptying the append log: {exc}") from exc
        self._committed(nbytes)

    def _read(self) -> sqlite3.Connection:
        """The connection, with every pending append committed (reads see them)."""
        if self._group_appends:
            self.sync()
        return self.db

    def _committed(self, nbytes: int) -> None:
        """Account ``nbytes`` of WAL; wake the checkpointer, or checkpoint
        here when the background one cannot keep the WAL under its bound."""
        ckpt = self._ckpt
        if ckpt is None:
            ckpt = self._ckpt = Checkpointer(self.path)
        self._wal_pending += nbytes
        due = self._wal_pending >= checkpoint.CHECKPOINT_BYTES
        if due:
            self._wal_pending = 0
        ckpt.note_commit(due)
        if ckpt.reports != self._seen_reports:  # the WAL's size as last measured
            self._seen_reports = ckpt.reports
            self._wal_estimate = ckpt.log_bytes
        self._wal_estimate += nbytes
        if ckpt.restart_due or self._wal_estimate >= checkpoint.CHECKPOINT_HARD_BYTES:
            # Appends never paused long enough for a background checkpoint to
            # finish (or it is stuck): as the only writer, finish one now so
            # the WAL restarts at the next append.
            with self._guard("checkpointing"):
                ((busy, log, done),) = self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if not busy and log == done:
                ckpt.restart_due = False
                self._wal_estimate = 0
                self.sync_checkpoints += 1

    def heads(self) -> dict[bytes, StoredHead]:
        """The last stored ``(seq, hash)`` of every author."""
        return {a: (s, h) for a, (s, h, _) in self.feed_summary().items()}

    def feed_summary(self) -> FeedSummary:
        """``author -> (last_seq, last_hash, n_sigs)`` from the ``feeds`` table.

        :func:`~hivemesh.stores.replay.verify_feeds` checks the events and
        signatures actually stored against it.
        """
        with self._guard("reading feed heads"):
            rows = (
                self._read()
                .execute("SELECT author, last_seq, last_hash, n_sigs FROM feeds ORDER BY author")
                .fetchall()
            )
        out: FeedSummary = {}
        for author, seq, h, n in rows:
            if not (type(author) is bytes and type(seq) is int and type(h) is bytes):
                raise self._corrupt("feeds table holds a malformed row")
            out[author] = (seq, h, n)
        return out

    def signed_seqs(self, author: bytes) -> list[int]:
        """Ascending seqs of ``author`` for which a signature is stored."""
        return [s for s, _ in self.signatures(author)]

    def signatures(self, author: bytes) -> list[tuple[int, bytes]]:
        """Every stored ``(seq, sig)`` of ``author``, ascending."""
        with self._guard("reading signatures"):
            rows: list[tuple[int, bytes]] = (
                self._read()
                .execute("SELECT seq, sig FROM sigs WHERE author = ? ORDER BY seq", (author,))
                .fetchall()
            )
        return rows

    def signature(self, author: bytes, seq: int) -> bytes | None:
        """The stored signature over ``author``'s event ``seq``, if any."""
        with self._guard("reading a signature"):
            row = (
                self._read()
                .execute("SELECT sig FROM sigs WHERE author = ? AND seq = ?", (author, seq))
                .fetchone()
            )
        return None if row is None else bytes(row[0])

    def read_range(self, author: bytes, start: int, end: int) -> list[bytes]:
        """Encoded events ``start..end`` (inclusive) of ``author``."""
        out: list[tuple[int, Any]] = []
        with self._guard("reading events"):
            cur = self._read().execute(_FEED_ROWS, (author, start))
            try:
                for seq, data, packed in cur:
                    rows = self._explode(author, seq, data) if packed else [(seq, data)]
                    out.extend(r for r in rows if start <= r[0] <= end)
                    if seq >= end:
                        break
            finally:
                cur.close()
        return [raw for _, raw in out]

    def _explode(self, author: bytes, seq: Any, data: Any) -> list[tuple[int, Any]]:
        """The ``(seq, raw)`` rows of one ``runs`` row (module docs)."""
        raws = self._run_raws(author, seq, data)
        return list(zip(range(seq - len(raws) + 1, seq + 1), raws, strict=True))

    def _run_raws(self, author: bytes, seq: Any, data: Any) -> list[Any]:
        """The raw events of one ``runs`` row, ending at ``seq``."""
        try:
            raws = _unpackb(data, max_ext_len=0) if type(data) is bytes else None
        except Exception:  # any damage: says which row below
            raws = None
        if type(raws) is not list or not raws or type(seq) is not int:
            raise self._corrupt(f"the run of {author.hex()[:12]} ending at #{seq} does not decode")
        return raws

    def iter_rows(self, chunk: int = _SCAN_ROWS) -> Iterator[list[tuple[bytes, int, bytes]]]:
        """Stream every stored event as chunks of ``(author, seq, raw)`` rows,
        ordered by author then seq, holding at most ``chunk`` rows at a time."""
        for author in self.event_authors():
            for rows in self.iter_feed_rows(author, chunk):
                yield [(author, seq, raw) for seq, raw in rows]

    def event_authors(self) -> list[bytes]:
        """Every author with at least one stored event, ascending.

        One index seek per author and table (cheap even for a large journal).
        """
        found: set[bytes] = set()
        with self._guard("listing authors"):
            db = self._read()
            for table in ("events", "runs"):
                row = db.execute(f"SELECT author FROM {table} ORDER BY author LIMIT 1").fetchone()
                while row is not None:
                    if type(row[0]) is not bytes:
                        raise self._corrupt(f"{table} table holds a malformed author")
                    found.add(row[0])
                    row = db.execute(
                        f"SELECT author FROM {table} WHERE author > ? ORDER BY author LIMIT 1", row
                    ).fetchone()
        return sorted(found)

    def iter_feed_rows(
        self, author: bytes, chunk: int = _SCAN_ROWS
    ) -> Iterator[list[tuple[int, bytes]]]:
        """Stream ``author``'s stored events as chunks of ``(seq, raw)`` rows in
        seq order, holding at most ``chunk`` rows at a time (plus one run)."""
        out: list[tuple[int, Any]] = []
        for first, raws in self.iter_feed_runs(author):
            if len(raws) == 1:  # a version 1 row: as stored
                out.append((first, raws[0]))
            else:
                out.extend(zip(range(first, first + len(raws)), raws, strict=True))
            while len(out) >= chunk:
                yield out[:chunk]
                out = out[chunk:]
        if out:
            yield out

    def iter_feed_runs(self, author: bytes, fetch: int = 16) -> Iterator[tuple[Any, list[Any]]]:
        """Stream ``author``'s stored events in seq order as runs ``(first
        seq, [raw, ...])``: one per stored signed batch (one per event for
        rows of a version 1 file), reading ``fetch`` rows at a time. The
        verified replay's hot path: no per-event row. Values are as stored
        (the replay checks them); a run that does not decode raises
        :class:`~hivemesh.errors.StoreCorrupt`."""
        with self._guard("scanning events"):
            cur = self._read().execute(_FEED_ROWS, (author, 0))
        try:
            while True:
                with self._guard("scanning events"):
                    rows = cur.fetchmany(fetch)
                if not rows:
                    break
                for seq, data, packed in rows:
                    if packed:
                        raws = self._run_raws(author, seq, data)
                        yield seq - len(raws) + 1, raws
                    else:
                        yield seq, [data]
        finally:
            with contextlib.suppress(sqlite3.Error):
                cur.close()  # may run after close() when a reader stops early

    def scan(self) -> Iterator[tuple[bytes, list[bytes], list[tuple[int, bytes]]]]:
        """Every author's full feed for rehydration (see ``FeedStore.scan``).

        Streams rows from SQLite; memory is bounded by the largest single feed.
        Prefer :meth:`iter_rows` for bounded memory.
        """
        author: bytes | None = None
        raws: list[bytes] = []
        for rows in self.iter_rows():
            for a, _seq, raw in rows:
                if a != author:
                    if author is not None:
                        yield author, raws, self.signatures(author)
                    author, raws = a, []
                raws.append(raw)
        if author is not None:
            yield author, raws, self.signatures(author)

    def put_blob(self, digest: bytes, data: bytes) -> None:
        """Store blob bytes under their content hash (idempotent).

        Raises :class:`InvalidArgument` if ``digest`` is not the blake2b-256
        of ``data``.
        """
        if blob_digest(data) != digest:
            raise InvalidArgument("blob digest does not match its bytes")
        self.sync()  # the open group, if any, first: the blob is committed on return
        with self._guard("storing a blob"):
            self.db.execute(
                "INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)", (digest, data)
            )
        self._committed(_COMMIT_OVERHEAD + len(data))

    def get_blob(self, digest: bytes) -> bytes | None:
        """Blob bytes, or None if not held; :class:`StoreCorrupt` if the stored
        bytes no longer match their address."""
        with self._guard("reading a blob"):
            row = (
                self._read()
                .execute("SELECT data FROM blobs WHERE digest = ?", (digest,))
                .fetchone()
            )
        if row is None:
            return None
        data = row[0]
        if type(data) is not bytes or blob_digest(data) != digest:
            raise self._corrupt(f"blob {digest.hex()[:16]} does not match its content hash")
        return data

    def check(self) -> None:
        """Run SQLite's ``quick_check`` over the whole file (O(size)).

        Raises :class:`StoreCorrupt` with SQLite's findings.
        """
        with self._guard("checking the store"):
            rows = self._read().execute("PRAGMA quick_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            found = "; ".join(str(r[0]) for r in rows[:5])
            raise self._corrupt(f"SQLite quick_check failed: {found}")

    def close(self) -> None:
        """Commit any write-behind group, checkpoint the WAL and close the
        file (idempotent)."""
        try:
            if self._db is not None:
                self.sync()
        finally:  # even if that failed: logged batches stay in the log for the next open
            self._log.close()  # kept if it still holds uncommitted batches
            ckpt, self._ckpt = self._ckpt, None
            if ckpt is not None:
                ckpt.stop()
            db, self._db = self._db, None
            if db is not None:
                with self._guard("closing"):
                    db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r}, durability={self.durability!r})"
