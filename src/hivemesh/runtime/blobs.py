"""Content-addressed blobs for the daemon: put locally, fetch on demand.

Theory of operation
-------------------
The protocol is :mod:`hivemesh.core.views.blobs` (the ``blob.put`` index
view, a sans-IO fetcher that verifies every byte against the digest, and
``serve`` for answering), run by the node's :class:`~hivemesh.core.peer.Peer`:
it serves the blob frames from the store, feeds the fetcher and stores what
it completes. This module is the daemon's side:

* :meth:`Blobs.put` stores the bytes in the node's store and appends a
  ``blob.put`` announcement; only the announcement is gossiped.
* :meth:`Blobs.get` returns local bytes, or runs the Peer's
  :class:`~hivemesh.commands.peer.FetchBlob` (the announced holders,
  else every peer) and waits for its reply: the verified bytes, or the
  fetcher's give-up, or the caller's deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh.commands.peer import FetchBlob
from hivemesh.core.views.blobs import BlobFetcher, BlobIndex, blob_digest
from hivemesh.errors import InvalidArgument

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["Blobs"]


class Blobs:
    """One daemon's blob puts and fetches (the Peer's index and fetcher)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.index: BlobIndex = daemon.peer.blob_index
        self.fetcher: BlobFetcher = daemon.peer.fetcher

    async def put(self, data: bytes, mime: str, name: str | None) -> bytes:
        """Store ``data``, announce it, return its digest."""
        kind, body = BlobIndex.encode_put(data, mime, name)
        digest = blob_digest(data)
        self.daemon.node.journal.store.put_blob(digest, data)
        await self.daemon.append(kind, body)
        return digest

    def resolve(self, ref: str) -> bytes:
        """A digest from 64 hex characters or a blob name."""
        if len(ref) == 64:
            try:
                return bytes.fromhex(ref)
            except ValueError:
                pass
        digest = self.index.by_name(ref)
        if digest is None:
            raise InvalidArgument(f"no blob digest or name {ref!r:.80}")
        return digest

    async def get(self, digest: bytes, now_ms: int, timeout_s: float) -> bytes:
        """The bytes of ``digest``: local, or fetched from holders (raises
        DeadlineExceeded when no holder served it within ``timeout_s``)."""
        local = self.daemon.node.journal.store.get_blob(digest)
        if local is not None:
            return local
        data: bytes = await self.daemon.call(FetchBlob(digest, timeout_s))
        return data
