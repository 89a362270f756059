"""Background WAL checkpoints for :class:`hivemesh.stores.sqlite.SQLiteStore`.

Theory of operation
-------------------
SQLite's automatic checkpoint runs inside the committing transaction and
fsyncs, stalling whoever appends (the daemon's event loop) for tens of ms.
The store turns it off and owns one :class:`Checkpointer`: a thread with its
own connection that runs ``PRAGMA wal_checkpoint(PASSIVE)`` (which never
blocks writers) when the store reports enough WAL written
(:data:`CHECKPOINT_BYTES`) or when appends paused for
:data:`CHECKPOINT_IDLE_S`. SQLite releases the GIL while it copies and
fsyncs. A checkpoint only copies committed pages into the main file, so it
cannot lose an acknowledged append.

A WAL restarts from its beginning only when a writer begins after a
checkpoint covered all of it. A writer that never pauses can keep that from
happening; when the measured WAL reaches :data:`CHECKPOINT_HARD_BYTES` the
thread sets :attr:`Checkpointer.restart_due` and the store (the only writer)
finishes a checkpoint itself. The constants are read at call time (tests
shrink them).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["CHECKPOINT_BYTES", "CHECKPOINT_HARD_BYTES", "CHECKPOINT_IDLE_S", "Checkpointer"]

#: Estimated WAL bytes written that wake the background checkpointer.
CHECKPOINT_BYTES = 4 * 1024 * 1024
#: Estimated WAL bytes without a completed checkpoint after which ``append``
#: checkpoints synchronously (the background thread fell behind or failed).
CHECKPOINT_HARD_BYTES = 64 * 1024 * 1024
#: Seconds without an append after which pending WAL frames are checkpointed.
CHECKPOINT_IDLE_S = 0.5


class Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection and thread.

    Woken by :meth:`note_commit` when enough WAL accumulated, and by its own
    timeout when appends paused for :data:`CHECKPOINT_IDLE_S`. SQLite releases
    the GIL while it copies and fsyncs, so the event loop keeps running.
    When the WAL holds :data:`CHECKPOINT_HARD_BYTES` or more (a writer that
    never pauses keeps it from restarting) it sets :attr:`restart_due` for
    the writer to act on. Failures are counted in :attr:`errors` and retried
    at the next wake.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.checkpoints = 0
        self.errors = 0
        #: Bytes in the WAL at the last checkpoint, and how many were measured.
        self.log_bytes = 0
        self.reports = 0
        #: Set when the WAL outgrew :data:`CHECKPOINT_HARD_BYTES`.
        self.restart_due = False
        self._wake = threading.Event()
        self._stopping = False
        self._commits = 0  # appends since the thread last looked
        self._pending = False  # commits not yet covered by a checkpoint
        self._thread = threading.Thread(
            target=self._run, name=f"hivemesh-checkpoint-{path.name}", daemon=True
        )
        self._thread.start()

    def note_commit(self, due: bool) -> None:
        """An append committed; ``due`` wakes the thread now."""
        self._commits += 1  # a racy count is fine: only zero vs non-zero matters
        if due:
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (the owner's ``close`` checkpoints the rest)."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA wal_autocheckpoint = 0")
            frame_bytes = int(db.execute("PRAGMA page_size").fetchall()[0][0]) + 24
            while not self._stopping:
                due = self._wake.wait(CHECKPOINT_IDLE_S)
                self._wake.clear()
                if self._stopping:
                    break
                commits, self._commits = self._commits, 0
                if commits:
                    self._pending = True
                if due or (self._pending and not commits):  # enough WAL, or idle
                    self._checkpoint(db, frame_bytes)
        except sqlite3.Error:
            self.errors += 1
        finally:
            if db is not None:
                db.close()

    def _checkpoint(self, db: sqlite3.Connection, frame_bytes: int) -> None:
        try:
            # fetchall: an unfinished statement would hold a read lock and
            # keep the WAL from ever restarting.
            ((busy, log, done),) = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            self.errors += 1
            return
        self.checkpoints += 1
        self.log_bytes = max(0, log) * frame_bytes
        self.reports += 1
        if not busy and log == done and not self._commits:
            self._pending = False
        if self.log_bytes >= CHECKPOINT_HARD_BYTES:
            self.restart_due = True
