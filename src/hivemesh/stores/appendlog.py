"""Append log: our own batches made durable by one ``write(2)``, committed later.

Theory of operation
-------------------
A batch this node signs must be durable before any peer can see it: after a
crash the node must never sign a *different* batch under the same sequence
numbers (peers would hold both, a fork). Committing it to SQLite (three
b-trees, six file locks) costs ~100 us on the critical path of every
publish; appending one record to a plain file costs a few microseconds.

With :attr:`SQLiteStore.append_log <hivemesh.stores.sqlite.SQLiteStore>`
set (the daemon sets it together with write-behind), a durable append writes
its batch here -- one ``write(2)`` on an ``O_APPEND`` file, plus
``fdatasync`` with ``durability="power"`` -- and joins the store's pending
group; the group's SQLite commit then empties the log
(:meth:`AppendLog.reset`). The guarantee is the store's: once ``append``
returns, the batch survives the process being killed at any instant (the
bytes are in the kernel's page cache, as SQLite's own WAL writes are with
``synchronous=NORMAL``), and with ``durability="power"`` also power loss.

Opening a store replays a log left behind first (:func:`claim`): a record
already committed (the same event at its last seq) is skipped, a record that
continues the stored feed is committed, and the log is removed. A record that
does neither -- only a power loss with ``durability="process"`` can cause
that, by rolling back the store's last commits while the log survives --
ends the replay: the log is kept as ``<log>.orphaned`` and counted, and the
store opens at what it holds (as SQLite itself does after such a loss).
A live writer holds an exclusive ``flock`` on its log, so a second process
opening the same store leaves it alone.

Record format: ``b"HMAL" | u32 length | u32 crc32(payload) | payload``,
big-endian, ``payload = msgpack [author, sig, [raw event, ...]]``. A record
cut short or failing its checksum ends the log: only a write that never
returned (its batch was never acknowledged or sent; a failed write is also
cut off at once, and if even that fails, before the next write, which is
refused until it succeeds: no good record ever follows a torn one) or a
power loss can leave one, and it is counted in
:attr:`LogScan.torn_bytes`.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from hivemesh.core.codec import MAX_EVENT_BYTES
from hivemesh.core.feed import MAX_UNSEALED
from hivemesh.errors import InvalidArgument

__all__ = [
    "LOG_SUFFIX",
    "AppendLog",
    "LogClaim",
    "LogRecord",
    "LogScan",
    "claim",
    "encode_record",
    "read_records",
]

#: The log lives next to the store file: ``<store>-appends``.
LOG_SUFFIX = "-appends"
_MAGIC = b"HMAL"
_HEADER = struct.Struct(">4sII")
#: A record holds one sealed batch: at most ``MAX_UNSEALED`` events of at most
#: ``MAX_EVENT_BYTES`` each (plus msgpack headers, author and signature).
_MAX_PAYLOAD = MAX_UNSEALED * (MAX_EVENT_BYTES + 16) + 1024


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One logged batch: ``author``'s events ``raws`` under signature ``sig``."""

    author: bytes
    sig: bytes
    raws: list[bytes]


@dataclass(slots=True)
class LogScan:
    """What :func:`read_records` found: intact records, then any torn tail."""

    records: list[LogRecord] = field(default_factory=list)
    torn_bytes: int = 0


def encode_record(author: bytes, sig: bytes, raws: Sequence[bytes]) -> bytes:
    """One record's bytes (header and payload)."""
    payload: bytes = msgpack.packb([author, sig, list(raws)], use_bin_type=True)
    return _HEADER.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload


def _decode_payload(payload: bytes) -> LogRecord | None:
    try:
        fields = msgpack.unpackb(payload, raw=False, max_bin_len=_MAX_PAYLOAD)
    except Exception:
        return None
    if not (isinstance(fields, list) and len(fields) == 3):
        return None
    author, sig, raws = fields
    if not (
        type(author) is bytes
        and type(sig) is bytes
        and type(raws) is list
        and raws
        and all(type(r) is bytes for r in raws)
    ):
        return None
    return LogRecord(author, sig, raws)


def read_records(data: bytes) -> LogScan:
    """Every intact record of a log's bytes, in order; the first record that
    is cut short, fails its checksum or does not decode ends the scan (see
    the module docs)."""
    scan = LogScan()
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            break
        magic, length, crc = _HEADER.unpack_from(data, pos)
        start, end = pos + _HEADER.size, pos + _HEADER.size + length
        if magic != _MAGIC or length > _MAX_PAYLOAD or end > len(data):
            break
        payload = data[start:end]
        record = _decode_payload(payload) if zlib.crc32(payload) == crc else None
        if record is None:
            break
        scan.records.append(record)
        pos = end
    scan.torn_bytes = len(data) - pos
    return scan


def _open_locked(path: Path, flags: int, lock: int) -> int | None:
    """``path`` opened and ``flock``-ed, or None if absent (or, with
    ``LOCK_NB``, locked by another process). Retries when the file was
    replaced or removed while we waited for the lock."""
    while True:
        try:
            fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, lock)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except (BlockingIOError, FileNotFoundError) as exc:
            os.close(fd)
            if isinstance(exc, BlockingIOError):
                return None
            continue
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed and created again meanwhile: open the new one


class LogClaim:
    """A crashed writer's log, locked for recovery: :attr:`scan` what it holds,
    then :meth:`done` (remove it) once every record is committed."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        chunks = []
        try:
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except BaseException:
            self.release()
            raise
        self.scan = read_records(b"".join(chunks))

    def done(self) -> None:
        """Remove the log (its records are committed) and release it."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self.release()

    def set_aside(self) -> Path:
        """Keep the log for inspection as ``<log>.orphaned`` (replacing an
        older one) and release it; returns the new path."""
        aside = self.path.with_name(self.path.name + ".orphaned")
        try:
            os.replace(self.path, aside)
        finally:
            self.release()
        return aside

    def release(self) -> None:
        """Release the lock, keeping the file (recovery failed)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def claim(path: Path) -> LogClaim | None:
    """The log at ``path`` for recovery, or None when there is none or a live
    writer holds it (its own records are its to commit)."""
    fd = _open_locked(path, os.O_RDONLY, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return None if fd is None else LogClaim(path, fd)


class AppendLog:
    """The open log file of one store (see the module docs). Not thread-safe.

    The writer holds an exclusive ``flock`` on the file while it is open, so
    another process opening the same store never recovers a live log."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self._fd: int | None = None
        #: Bytes written since the last :meth:`reset`.
        self.size = 0
        self._cut_failed = False  # a failed write's bytes could not be cut off yet

    def write(self, author: bytes, sig: bytes, raws: Sequence[bytes]) -> None:
        """Append one batch; it is durable (see the module docs) on return."""
        fd = self._fd
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            fd = _open_locked(self.path, flags, fcntl.LOCK_EX)
            if fd is None:  # pragma: no cover - O_CREAT: only if removed at each try
                raise FileNotFoundError(self.path)
            if self.fsync:  # the new file's directory entry must survive power loss too
                try:
                    _fsync_dir(self.path.parent)
                except BaseException:
                    os.close(fd)
                    raise
            self._fd = fd
            self.size = os.fstat(fd).st_size  # empty, unless another store wrote it
        record = encode_record(author, sig, raws)
        if len(record) - _HEADER.size > _MAX_PAYLOAD:
            raise InvalidArgument(f"a batch of {len(record)} bytes is over the log's record limit")
        if self._cut_failed:  # a good record behind a torn one would be lost at recovery
            os.ftruncate(fd, self.size)
            self._cut_failed = False
        view = memoryview(record)
        try:
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fdatasync(fd)
        except BaseException:
            try:  # no torn or unacknowledged record behind us
                os.ftruncate(fd, self.size)
            except OSError:
                self._cut_failed = True  # cut before the next write, or refuse it
            raise
        self.size += len(record)

    def reset(self) -> None:
        """Empty the log: every record in it is committed to the store."""
        if self._fd is not None and (self.size or self._cut_failed):
            os.ftruncate(self._fd, 0)
            self._cut_failed = False
        self.size = 0

    def close(self) -> None:
        """Close the file, removing it if it holds nothing uncommitted."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if not self.size:
            self.path.unlink(missing_ok=True)  # still ours: we hold the lock
        os.close(fd)
