"""Content-addressed blobs for the daemon: put locally, fetch on demand.

Theory of operation
-------------------
The protocol is :mod:`hivemesh.core.views.blobs` (the ``blob.put`` index
view, a sans-IO fetcher that verifies every byte against the digest, and
``serve`` for answering). This module wires it to the daemon:

* :meth:`Blobs.put` stores the bytes in the node's store and appends a
  ``blob.put`` announcement; only the announcement is gossiped.
* :meth:`Blobs.get` returns local bytes, or asks the announced holders (else
  every peer) through the fetcher and resolves when the verified bytes are
  stored locally, or fails at the fetcher's give-up or the caller's deadline.
* Frames of the blob range are routed to ``serve`` (``want``/``get``, answered
  from the store) or to the fetcher (``have``/``none``/``data``).
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from hivemesh.core.frames import encode_frame
from hivemesh.core.views.blobs import (
    BLOB_TAGS,
    TAG_GET,
    TAG_WANT,
    BlobFetcher,
    BlobIndex,
    blob_digest,
    serve,
)
from hivemesh.errors import DeadlineExceeded, InvalidArgument

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["Blobs"]


class Blobs:
    """One daemon's blob index, server and fetcher."""

    def __init__(self, daemon: Daemon, rng: random.Random) -> None:
        self.daemon = daemon
        self.index = BlobIndex()
        self.fetcher = BlobFetcher(rng)
        self._waiters: dict[bytes, list[asyncio.Future[bytes]]] = {}
        daemon.node.add_view(self.index)
        for tag in BLOB_TAGS:
            daemon.node.register_handler(tag, _make_handler(self, tag))

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
        """The bytes of ``digest``: local, or fetched from holders."""
        local = self.daemon.node.journal.store.get_blob(digest)
        if local is not None:
            return local
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(digest, []).append(fut)
        if not self.fetcher.want(digest, now_ms, self.index.holders(digest)):
            self._waiters[digest].remove(fut)
            raise DeadlineExceeded("too many blob fetches in flight; retry later")
        await self.daemon.flush()
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            raise DeadlineExceeded(
                f"blob {digest.hex()[:12]} not fetched in {timeout_s}s"
            ) from None
        finally:
            waiting = self._waiters.get(digest)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._waiters[digest]
                    self.fetcher.cancel(digest)

    def after_input(self) -> None:
        """Send fetcher frames, store completed blobs, fail given-up ones."""
        node = self.daemon.node
        for peer, frame in self.fetcher.outbox():
            encoded = encode_frame(frame[0], *frame[1:])
            for p in [peer] if peer is not None else node.peers:
                node.send(p, encoded)
        for digest, data in self.fetcher.completed():
            node.journal.store.put_blob(digest, data)
            for fut in self._waiters.pop(digest, []):
                if not fut.done():
                    fut.set_result(data)
        for digest in self.fetcher.failed():
            self.daemon.counters["blob_fetch_failed"] += 1
            for fut in self._waiters.pop(digest, []):
                if not fut.done():
                    fut.set_exception(
                        DeadlineExceeded(f"no holder served blob {digest.hex()[:12]}")
                    )

    def next_deadline(self) -> int | None:
        """The fetcher's next timer."""
        return self.fetcher.next_deadline()

    def handle_timer(self, now_ms: int) -> None:
        """Advance the fetcher's timeouts."""
        self.fetcher.handle_timer(now_ms)


def _make_handler(blobs: Blobs, tag: int) -> Any:
    """A frame handler for ``tag``: the node passes the fields after the type."""

    def handler(peer: str, fields: list[Any], now_ms: int) -> None:
        frame = [tag, *fields]
        node = blobs.daemon.node
        if tag in (TAG_WANT, TAG_GET):
            reply = serve(frame, node.journal.store.get_blob)
            if reply is not None:
                node.send(peer, encode_frame(reply[0], *reply[1:]))
        else:
            blobs.fetcher.receive(peer, frame, now_ms)

    return handler
