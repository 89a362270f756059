"""The storage interface the core is given, and an in-memory implementation.

The core never opens files. A node is handed a :class:`FeedStore`; the
production one is SQLite (:mod:`hivemesh.stores.sqlite`), the simulator uses
:class:`MemoryStore` (which it keeps across a simulated crash, as a disk).

Contract
--------
* :meth:`FeedStore.append` is atomic: a batch of one author's events and the
  signature over its last event are stored together or not at all. When it
  returns, the batch is durable (an acknowledged append is never lost) --
  unless it was made with ``durable=False`` (a batch replicated from a peer,
  which other replicas still hold): a store may then hold it in a group
  commit until :meth:`FeedStore.sync` or the next durable append. Reads see
  it at once either way.
* Per author, stored events are contiguous from seq 1, and the highest stored
  seq always has a stored signature (heads are only ever advanced to a
  signed seq). Earlier signatures are kept too: they let a replica serve any
  range ending at a signed seq.
* Blobs are content-addressed (``blake2b-256`` of the bytes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from hivemesh.core.event import Event, event_hash

__all__ = ["FeedStore", "MemoryStore", "StoredHead"]

#: ``author -> (last_seq, last_hash)`` as loaded from a store.
StoredHead = tuple[int, bytes]


class FeedStore(Protocol):
    """Durable storage for feeds, signatures and blobs."""

    def append(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        """Atomically store contiguous events of ``author`` and the signature
        over the last one (``durable=False``: may be group-committed later)."""

    def sync(self) -> None:
        """Make every append so far durable."""

    def heads(self) -> dict[bytes, StoredHead]:
        """The last stored ``(seq, hash)`` of every author."""

    def signed_seqs(self, author: bytes) -> list[int]:
        """Ascending seqs of ``author`` for which a signature is stored."""

    def signature(self, author: bytes, seq: int) -> bytes | None:
        """The stored signature over ``author``'s event ``seq``, if any."""

    def read_range(self, author: bytes, start: int, end: int) -> list[bytes]:
        """Encoded events ``start..end`` (inclusive) of ``author``."""

    def scan(self) -> Iterator[tuple[bytes, list[bytes], list[tuple[int, bytes]]]]:
        """Every author's full feed for rehydration:
        ``(author, [raw events in seq order], [(signed seq, sig)])``."""

    def put_blob(self, digest: bytes, data: bytes) -> None:
        """Store blob bytes under their content hash (idempotent)."""

    def get_blob(self, digest: bytes) -> bytes | None:
        """Blob bytes, or None if not held locally."""

    def close(self) -> None:
        """Flush and release resources."""


class MemoryStore:
    """A :class:`FeedStore` in dictionaries (tests and the simulator)."""

    def __init__(self) -> None:
        self._events: dict[bytes, list[bytes]] = {}
        self._hashes: dict[bytes, bytes] = {}
        self._sigs: dict[bytes, dict[int, bytes]] = {}
        self._blobs: dict[bytes, bytes] = {}

    def append(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        """See :meth:`FeedStore.append` (always durable: the dicts are the disk)."""
        feed = self._events.get(author, [])
        if not events or events[0].seq != len(feed) + 1:
            raise ValueError("append must continue the stored feed")
        self._events[author] = feed
        feed.extend(e.raw for e in events)
        self._hashes[author] = events[-1].id
        self._sigs.setdefault(author, {})[events[-1].seq] = sig

    def sync(self) -> None:
        """Nothing is ever pending."""

    def heads(self) -> dict[bytes, StoredHead]:
        """See :meth:`FeedStore.heads`."""
        return {a: (len(f), self._hashes[a]) for a, f in self._events.items() if f}

    def signed_seqs(self, author: bytes) -> list[int]:
        """See :meth:`FeedStore.signed_seqs`."""
        return sorted(self._sigs.get(author, {}))

    def signature(self, author: bytes, seq: int) -> bytes | None:
        """See :meth:`FeedStore.signature`."""
        return self._sigs.get(author, {}).get(seq)

    def read_range(self, author: bytes, start: int, end: int) -> list[bytes]:
        """See :meth:`FeedStore.read_range`."""
        start = max(start, 1)
        return self._events.get(author, [])[start - 1 : max(end, start - 1)]

    def scan(self) -> Iterator[tuple[bytes, list[bytes], list[tuple[int, bytes]]]]:
        """See :meth:`FeedStore.scan`."""
        for author in sorted(self._events):
            sigs = sorted(self._sigs.get(author, {}).items())
            yield author, list(self._events[author]), sigs

    def put_blob(self, digest: bytes, data: bytes) -> None:
        """See :meth:`FeedStore.put_blob`."""
        self._blobs[digest] = data

    def get_blob(self, digest: bytes) -> bytes | None:
        """See :meth:`FeedStore.get_blob`."""
        return self._blobs.get(digest)

    def close(self) -> None:
        """Nothing to release."""

    # -- fault injection (simulator, tests) ---------------------------------------

    def copy(self) -> MemoryStore:
        """An independent copy (a backup of the disk)."""
        other = MemoryStore()
        other._events = {a: list(f) for a, f in self._events.items()}
        other._hashes = dict(self._hashes)
        other._sigs = {a: dict(s) for a, s in self._sigs.items()}
        other._blobs = dict(self._blobs)
        return other

    def truncate(self, author: bytes, seq: int) -> None:
        """Forget ``author``'s events after its last signed seq ``<= seq``, as
        a damaged disk would (the contract still holds: the head is signed)."""
        sigs = self._sigs.get(author, {})
        keep = max((s for s in sigs if s <= seq), default=0)
        feed = self._events.get(author, [])
        del feed[keep:]
        for s in [s for s in sigs if s > keep]:
            del sigs[s]
        if keep:
            self._hashes[author] = event_hash(feed[-1])
        else:
            self._events.pop(author, None)
            self._hashes.pop(author, None)
            self._sigs.pop(author, None)
