"""The own feed's durable mark, in a small file beside the key.

Theory of operation
-------------------
:mod:`hivemesh.core.ownfeed` explains what the mark is for: the newest own
event that may have left the node, saved after an own batch is stored and
before it is acknowledged or sent. This module keeps it in
``<data_dir>/feed.mark``, apart from the store, so deleting, restoring or
damaging the store leaves it standing.

Format: two fixed slots of :data:`SLOT_BYTES`; a save overwrites the older
slot with one ``pwrite`` (no ``fsync`` unless ``durability="power"``, the
same trade-off as the store's append log: it survives the process being
killed at any instant, and with ``power`` also power loss). A slot torn by a
power loss fails its checksum and the other slot, one save older, is read.
Each slot::

    b"HMFMARK1" | gen u64 | seq u64 | accepted_from u64 | accepted_upto u64
      | author (32) | hash (32) | crc32 u32            (big-endian, zero-padded)

``gen`` orders the two slots; ``author`` binds the mark to the key (a mark
of another key, as after copying files between data dirs, is not used).

Loading gives a :class:`~hivemesh.core.ownfeed.Mark`, or None when the file
is missing, unreadable or another key's: the node then learns how far its
feed went from its peers before it writes. :func:`open_mark` creates the
file for a data dir from an older version (its store is the only record)
and :func:`create_mark` writes mark 0 beside a newly created key.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from pathlib import Path

from hivemesh.core.event import GENESIS
from hivemesh.core.ownfeed import Mark
from hivemesh.core.store import FeedStore
from hivemesh.errors import StoreError

__all__ = ["MARK_FILE", "SLOT_BYTES", "FileMarkStore", "create_mark", "open_mark"]

log = logging.getLogger("hivemesh.stores")

#: Name of the mark file inside the data dir.
MARK_FILE = "feed.mark"
_MAGIC = b"HMFMARK1"
_BODY = struct.Struct(">8sQQQQ32s32s")
_CRC = struct.Struct(">I")
_CRC_PAD = struct.Struct(">I20x")  # the checksum, then zeros to the end of the slot
#: Bytes per slot (two slots per file): 128.
SLOT_BYTES = _BODY.size + _CRC_PAD.size


class FileMarkStore:
    """A :class:`~hivemesh.core.ownfeed.MarkStore` in ``path`` for ``author``.

    Not thread-safe; one writer per file (the daemon's data dir lock).
    """

    def __init__(self, path: Path, author: bytes, *, fsync: bool = False) -> None:
        self.path = path
        self.author = author
        self.fsync = fsync
        #: Why :meth:`load` found no usable mark ("" when it did or the file is absent).
        self.problem = ""
        self._fd: int | None = None
        self._gen = 0
        self._loaded = False

    def exists(self) -> bool:
        """True if the file is there (usable or not)."""
        return self.path.exists()

    def load(self) -> Mark | None:
        """The newest intact slot's mark (see the module docs)."""
        self.problem = ""
        self._loaded = True
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc}"
            return None
        best: tuple[int, Mark] | None = None
        foreign = False
        for i in range(2):
            slot = data[i * SLOT_BYTES : (i + 1) * SLOT_BYTES]
            if len(slot) < _BODY.size + _CRC.size:
                continue
            body = slot[: _BODY.size]
            (crc,) = _CRC.unpack_from(slot, _BODY.size)
            magic, gen, seq, first, upto, author, h = _BODY.unpack(body)
            if magic != _MAGIC or zlib.crc32(body) != crc:
                continue
            if author != self.author:
                foreign = True
                continue
            if best is None or gen > best[0]:
                best = (gen, Mark(seq, h, first, upto))
        if best is None:
            self.problem = (
                f"{self.path} belongs to another key"
                if foreign
                else f"{self.path} holds no intact mark"
            )
            return None
        self._gen = best[0]
        return best[1]

    def save(self, mark: Mark) -> None:
        """Overwrite the older slot with ``mark`` (module docs); raises
        :class:`~hivemesh.errors.StoreError` on an I/O error."""
        if not self._loaded:
            self.load()  # learn the slots' generation first
        gen = self._gen + 1
        body = _BODY.pack(
            _MAGIC, gen, mark.seq, mark.accepted_from, mark.accepted_upto, self.author, mark.hash
        )
        slot = body + _CRC_PAD.pack(zlib.crc32(body))
        try:
            fd = self._fd
            if fd is None:
                fd = self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.pwrite(fd, slot, (gen & 1) * SLOT_BYTES)
            if self.fsync:
                os.fdatasync(fd)
        except OSError as exc:
            raise StoreError(f"{self.path}: saving the feed mark: {exc}") from exc
        self._gen = gen

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def create_mark(data_dir: Path, author: bytes) -> None:
    """Write mark 0 for a key just created in ``data_dir`` (replacing any
    mark file of an earlier key), durably."""
    marks = FileMarkStore(data_dir / MARK_FILE, author, fsync=True)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / MARK_FILE).unlink()
    try:
        marks.save(Mark(0, GENESIS))
    finally:
        marks.close()
    dfd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def open_mark(
    data_dir: Path, author: bytes, store: FeedStore, *, fsync: bool = False
) -> FileMarkStore:
    """The mark store of ``data_dir``. A data dir from before the mark
    existed (no file, our feed in the store) gets one from the store: the
    store is then the only record, and it is trusted as it always was."""
    marks = FileMarkStore(data_dir / MARK_FILE, author, fsync=fsync)
    if marks.exists():
        if marks.load() is None:
            log.warning("own feed mark unusable (%s): asking peers first", marks.problem)
        return marks
    held = store.heads().get(author)
    if held is not None:
        marks.save(Mark(held[0], held[1]))
        log.info("own feed mark created from the store at #%d (older data dir)", held[0])
    return marks
