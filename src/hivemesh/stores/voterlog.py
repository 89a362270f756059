"""Durable quorum-voter state as a preallocated, checksummed record log.

Theory of operation
-------------------
A voter must not reply to a write before the state that write changed
(the resource's highest fencing token, the longest TTL granted) is on disk.
Rewriting a snapshot file and renaming it costs a file-system journal commit
per write (measured here: ~0.4 ms idle, 4 ms and more when the disk is busy);
overwriting bytes *inside* an already written file with ``fdatasync`` needs
no metadata change and is several times cheaper. So the state lives in a log
file filled with zeros when created (real zeros, not ``fallocate``: an
unwritten extent would need metadata on first write):

* records and their fold are :mod:`hivemesh.core.lease_voter`'s
  (*Records*: :func:`~hivemesh.core.lease_voter.pack_record`,
  :class:`~hivemesh.core.lease_voter.DurableBounds`), the first one after
  every compaction a full snapshot;
* :meth:`VoterLog.write` puts one record at the end of the valid prefix
  with ``pwrite``; :meth:`VoterLog.sync` ``fdatasync``s every record written
  since the last sync (group commit: the runtime writes the changes of all
  the votes of one event-loop turn, syncs once, then sends their replies);
  :meth:`VoterLog.append` is both;
* :meth:`VoterLog.open` reads the valid records (a torn tail was never
  acknowledged), then *compacts*: writes a new zero-filled file with one
  snapshot record, fsyncs it and its directory, and renames it over the old
  one. A full log is compacted the same way while running, and a voter
  that had no log creates it so with its first change.

Restored state is the highest token bound per resource and the longest TTL;
the voter quarantines itself for that TTL (see :mod:`hivemesh.core.lease_voter`).

A crash loses at most records that were written and not yet synced: their
replies had not been sent (the caller's rule), so nothing acknowledged is lost.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from hivemesh.core.lease_voter import RECORD_HEAD, DurableBounds, pack_record, unpack_records
from hivemesh.errors import DecodeError, StoreCorrupt, StoreError
from hivemesh.stores.private import open_private

__all__ = ["VoterLog"]

#: Default log size; a full log is compacted to one snapshot record.
DEFAULT_SIZE = 1 << 20


class VoterLog:
    """Open with :meth:`open`; then :meth:`append` one change per acknowledged write."""

    def __init__(self, path: str | os.PathLike[str], *, size: int = DEFAULT_SIZE) -> None:
        self.path = Path(path)
        self.size = size
        self._fd: int | None = None
        self._pos = 0
        self.bounds = DurableBounds()
        self._dirty = False  # records written since the last sync
        self._fresh = False  # opened without a log: the first write creates it
        #: records written, fdatasyncs and compactions done
        self.writes = 0
        self.syncs = 0
        self.compactions = 0

    def state(self) -> dict[str, Any]:
        """The restored state, in the shape ``Voter(state=...)`` takes."""
        return self.bounds.state()

    def open(self) -> dict[str, Any] | None:
        """Read the log (None if there was none), compact it, keep it open.
        A voter without a log has promised nothing: its log is created with
        its first change (:meth:`write`), not here (a fresh node's start
        paid a 1 MiB write and two syncs, 6-17 ms on a loaded box)."""
        existed = self.path.exists()
        if not existed:
            self._fresh = True
            return None
        self._read(self.path.read_bytes())
        try:
            self._compact()
        except OSError as exc:  # a full disk at start: say so, typed (not a traceback)
            with contextlib.suppress(OSError):
                self.path.with_suffix(".tmp").unlink()
            raise StoreError(f"{self.path}: cannot rewrite the voter log: {exc}") from exc
        return self.state()

    def _read(self, data: bytes) -> None:
        try:
            for _, rec in unpack_records(data):
                self.bounds.apply(rec)
        except (DecodeError, TypeError, ValueError, KeyError, AttributeError) as e:
            raise StoreCorrupt(f"{self.path}: bad voter record: {e!r}") from e

    def _compact(self) -> None:
        snap = pack_record(self.state())
        size = max(self.size, 2 * len(snap))
        tmp = self.path.with_suffix(".tmp")
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.write(snap)
            f.write(bytes(size - len(snap)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self._pos = len(snap)
        self.size = size
        self._dirty = False
        self.compactions += 1

    def write(self, resource: str, max_token: int, max_ttl_ms: int) -> None:
        """Record a change; durable only after the next :meth:`sync` returns."""
        if self._fresh:  # the new log's snapshot holds this change, synced
            self.bounds.change(resource, max_token, max_ttl_ms)
            self.writes += 1
            self._compact()
            self._fresh = False
            return
        if self._fd is None:
            raise StoreCorrupt(f"{self.path}: voter log not open")
        rec = pack_record(self.bounds.change(resource, max_token, max_ttl_ms))
        self.writes += 1
        if self._pos + len(rec) + RECORD_HEAD.size > self.size:
            self._compact()  # the snapshot holds this change and every earlier one, synced
            return
        os.pwrite(self._fd, rec, self._pos)
        self._pos += len(rec)
        self._dirty = True

    def sync(self) -> bool:
        """Make every record written so far durable (one ``fdatasync``);
        False if there was nothing to sync."""
        if not self._dirty:
            return False
        if self._fd is None:
            raise StoreCorrupt(f"{self.path}: voter log not open")
        os.fdatasync(self._fd)
        self._dirty = False
        self.syncs += 1
        return True

    @property
    def pending(self) -> bool:
        """Whether records were written since the last sync."""
        return self._dirty

    def append(self, resource: str, max_token: int, max_ttl_ms: int) -> None:
        """Record a change durably (:meth:`write` then :meth:`sync`)."""
        self.write(resource, max_token, max_ttl_ms)
        self.sync()

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._fresh = False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
