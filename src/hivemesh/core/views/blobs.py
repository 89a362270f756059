"""Content-addressed blobs: announced in the journal, fetched on demand.

Theory of operation
-------------------
Binary state (DOM snapshots, screenshots, files) never travels inside events:
events are gossiped to everyone and capped at 256 KiB. Instead the holder
appends a ``blob.put`` event announcing ``{"h": digest, "n": size, "m": mime,
"name": optional name}`` where ``digest = blake2b-256(bytes)``; a node that
needs the bytes fetches them from a holder, verifies them against the digest
and may then announce them itself.

:class:`BlobIndex` is the view over ``blob.put``: which digests exist, their
size and type, who holds them, and which digest a name currently points to
(the announcement with the largest ``(hlc, author)`` wins). The size and mime
of a digest come from its earliest ``(hlc, author)`` announcement; they are
hints, since only the hash is checked.

:class:`BlobFetcher` is a sans-IO state machine that downloads blobs. It
never touches the network or the clock: frames come in through
:meth:`BlobFetcher.receive` with the current time, frames to send come out of
:meth:`BlobFetcher.outbox`, and :meth:`BlobFetcher.handle_timer` must be
called at :meth:`BlobFetcher.next_deadline`. Randomness (which holder to ask)
comes from an injected :class:`Random`.

Wire messages are msgpack-able lists ``[type, *fields]`` whose integer type
lies in the blob range 10-19 of :mod:`hivemesh.core.frames`, so the node sends
one as ``encode_frame(frame[0], *frame[1:])`` and routes received types
:data:`BLOB_TAGS` back here as ``[type, *fields]``::

    [10 WANT, h]                        do you hold h?     (fetcher -> any)
    [13 HAVE, h, size]                  I hold h           (server -> fetcher)
    [12 NONE, h]                        I do not hold h    (server -> fetcher)
    [14 GET,  h, index]                 send chunk index   (fetcher -> holder)
    [11 DATA, h, index, size, chunk]    chunk index of h   (server -> fetcher)

Chunks are :data:`CHUNK_BYTES` long except the last; blobs are at most
:data:`MAX_BLOB_BYTES`. An empty blob is one empty chunk. :func:`serve`
answers ``want``/``get`` from local storage.

Fetching one blob: pick a random holder not yet marked bad (announcers from
the index, or peers that answered ``have`` to a broadcast ``want``); pipeline
up to ``window`` chunk requests to it (at most ``max_inflight`` over all
blobs). A request unanswered by its deadline gives the holder a strike and
the fetcher re-picks among the holders with the fewest strikes (a lost frame
costs one timeout; a slow holder is retried only when no better one exists;
``max_strikes`` retires it). A ``none`` or a malformed chunk retires the
holder at once. Chunks already received are kept across holders, unless the
new holder reports a different size: then the download restarts from it.

When every chunk is in, the whole blob is hashed. A mismatch is a
:class:`~hivemesh.errors.BlobMismatch` and the chunks are dropped: if one
holder sent them all it is retired; if several did, nobody can be blamed, so
the download restarts from the current holder alone and the next mismatch
convicts it. With no usable holder left the fetcher broadcasts ``want`` once
and gives up (:meth:`BlobFetcher.failed`) after ``search_ms`` without an
answer. The fetcher never accepts bytes that do not hash to the digest.

Wiring (node side): route received types ``WANT`` and ``GET`` to
:func:`serve` and send its reply back; route ``HAVE``, ``NONE`` and ``DATA``
to :meth:`BlobFetcher.receive`; send :meth:`BlobFetcher.outbox`; call
:meth:`BlobFetcher.handle_timer` at :meth:`BlobFetcher.next_deadline`; store
what :meth:`BlobFetcher.completed` yields and, if it should be served to
others, announce it with :meth:`BlobIndex.encode_put`.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.core.views.base import ViewBase, state_digest
from hivemesh.errors import (
    BlobMismatch,
    DecodeError,
    FrameTooLarge,
    InvalidArgument,
    InvalidName,
    RemoteProtocolError,
)

__all__ = [
    "BLOB_TAGS",
    "CHUNK_BYTES",
    "KIND_PUT",
    "MAX_BLOB_BYTES",
    "TAG_DATA",
    "TAG_GET",
    "TAG_HAVE",
    "TAG_NONE",
    "TAG_WANT",
    "BlobFetcher",
    "BlobIndex",
    "BlobInfo",
    "blob_digest",
    "parse_frame",
    "serve",
]

KIND_PUT = "blob.put"
CHUNK_BYTES = 1024 * 1024
MAX_BLOB_BYTES = 64 * 1024 * 1024
#: Frame type tags, in the range 10-19 that :mod:`hivemesh.core.frames` reserves
#: for blobs (10-12 match ``FrameType.BLOB_WANT/BLOB_DATA/BLOB_MISSING``).
TAG_WANT = 10
TAG_DATA = 11
TAG_NONE = 12
TAG_HAVE = 13
TAG_GET = 14
BLOB_TAGS = (TAG_WANT, TAG_DATA, TAG_NONE, TAG_HAVE, TAG_GET)
_MIME = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}/[a-z0-9][a-z0-9.+-]{0,63}\Z")
_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,128}\Z")


def blob_digest(data: bytes) -> bytes:
    """The content address of ``data``: blake2b-256."""
    return hashlib.blake2b(data, digest_size=32).digest()


def _chunks(size: int, chunk_bytes: int) -> int:
    return max(1, -(-size // chunk_bytes))


# -- the index view --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """What the journal says about one blob."""

    digest: bytes
    size: int
    mime: str
    #: Addresses of the authors that announced it, sorted.
    holders: tuple[str, ...]


def _parse_put(body: Any) -> tuple[bytes, int, str, str | None]:
    if type(body) is not dict or not {"h", "n", "m"} <= set(body) <= {"h", "n", "m", "name"}:
        raise DecodeError("blob.put body must be {h, n, m[, name]}")
    h, n, m, name = body["h"], body["n"], body["m"], body.get("name")
    if type(h) is not bytes or len(h) != 32:
        raise DecodeError("blob digest must be 32 bytes")
    if type(n) is not int or not 0 <= n <= MAX_BLOB_BYTES:
        raise DecodeError(f"blob size must be 0..{MAX_BLOB_BYTES}")
    if type(m) is not str or not _MIME.match(m):
        raise InvalidName(f"bad mime type {m!r:.80}")
    if name is not None and (type(name) is not str or not _NAME.match(name)):
        raise InvalidName(f"bad blob name {name!r:.80}")
    return h, n, m, name


class BlobIndex(ViewBase):
    """The view over ``blob.put`` announcements."""

    kinds = frozenset({KIND_PUT})

    def __init__(self) -> None:
        super().__init__()
        # digest -> author -> (hlc, size, mime) of its first announcement
        self._puts: dict[bytes, dict[bytes, tuple[int, int, str]]] = {}
        # name -> (hlc, author, digest), largest (hlc, author) wins
        self._names: dict[str, tuple[int, bytes, bytes]] = {}

    @staticmethod
    def encode_put(
        data: bytes, mime: str = "application/octet-stream", name: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` announcing ``data`` (which the caller must store)."""
        if len(data) > MAX_BLOB_BYTES:
            raise InvalidArgument(f"blob over {MAX_BLOB_BYTES} bytes")
        body: dict[str, Any] = {"h": blob_digest(data), "n": len(data), "m": mime}
        if name is not None:
            body["name"] = name
        try:
            _parse_put(body)
        except RemoteProtocolError as exc:
            raise InvalidArgument(str(exc)) from None
        return KIND_PUT, body

    def apply(self, event: Event) -> None:
        """Fold one ``blob.put`` (never raises for bad bodies)."""
        if event.kind != KIND_PUT:
            return
        try:
            h, n, m, name = _parse_put(event.body)
        except RemoteProtocolError as exc:
            self._reject(exc)
            return
        self._puts.setdefault(h, {}).setdefault(event.author, (event.hlc, n, m))
        if name is not None:
            cur = self._names.get(name)
            if cur is None or (event.hlc, event.author) > cur[:2]:
                self._names[name] = (event.hlc, event.author, h)
        self.applied += 1

    def info(self, digest: bytes) -> BlobInfo | None:
        """Size, mime and holders of ``digest``, or ``None`` if never announced."""
        puts = self._puts.get(digest)
        if not puts:
            return None
        first = min(puts, key=lambda a: (puts[a][0], a))
        _, size, mime = puts[first]
        return BlobInfo(digest, size, mime, tuple(sorted(address_of(a) for a in puts)))

    def holders(self, digest: bytes) -> list[str]:
        """Addresses that announced ``digest``, sorted."""
        info = self.info(digest)
        return [] if info is None else list(info.holders)

    def by_name(self, name: str) -> bytes | None:
        """The digest ``name`` points to, or ``None``."""
        cur = self._names.get(name)
        return None if cur is None else cur[2]

    def resolve(self, ref: str) -> bytes:
        """The digest ``ref`` names: 64 hex characters, or a blob name
        (InvalidArgument when it is neither)."""
        if len(ref) == 64:
            try:
                return bytes.fromhex(ref)
            except ValueError:
                pass
        digest = self.by_name(ref)
        if digest is None:
            raise InvalidArgument(f"no blob digest or name {ref!r:.80}")
        return digest

    def snapshot(self) -> dict[str, Any]:
        """``{"blobs": {hex: {n, m, holders}}, "names": {name: hex}}``."""
        blobs: dict[str, Any] = {}
        for h in sorted(self._puts):
            info = self.info(h)
            assert info is not None
            blobs[h.hex()] = {"n": info.size, "m": info.mime, "holders": list(info.holders)}
        names = {n: self._names[n][2].hex() for n in sorted(self._names)}
        return {"blobs": blobs, "names": names}

    def digest(self) -> bytes:
        """Hash of :meth:`snapshot`."""
        return state_digest("blobs", self.snapshot())


# -- frames -------------------------------------------------------------------------


def parse_frame(frame: Any, chunk_bytes: int = CHUNK_BYTES) -> tuple[Any, ...]:
    """Validate a ``blob.*`` frame; return it as a tuple or raise DecodeError."""
    if type(frame) is not list or not frame or type(frame[0]) is not int:
        raise DecodeError("blob frame must be a list starting with its type")
    tag, args = frame[0], frame[1:]
    want = {TAG_WANT: 1, TAG_NONE: 1, TAG_HAVE: 2, TAG_GET: 2, TAG_DATA: 4}.get(tag)
    if want is None or len(args) != want:
        raise DecodeError(f"bad blob frame type {tag} with {len(args)} fields")
    if type(args[0]) is not bytes or len(args[0]) != 32:
        raise DecodeError("blob digest must be 32 bytes")
    for x in args[1:3]:
        if type(x) is not int or x < 0:
            raise DecodeError("blob sizes and indexes must be non-negative ints")
    if tag in (TAG_HAVE, TAG_DATA) and args[-1 if tag == TAG_HAVE else 2] > MAX_BLOB_BYTES:
        raise FrameTooLarge(f"blob over {MAX_BLOB_BYTES} bytes")
    if tag == TAG_DATA and (type(args[3]) is not bytes or len(args[3]) > chunk_bytes):
        raise DecodeError(f"blob chunk must be at most {chunk_bytes} bytes")
    return (tag, *args)


def serve(
    frame: Any, lookup: Callable[[bytes], bytes | None], chunk_bytes: int = CHUNK_BYTES
) -> list[Any] | None:
    """Answer a ``want`` or ``get`` frame from local storage (``None``: no reply).

    Raises :class:`DecodeError` for malformed frames.
    """
    parsed = parse_frame(frame, chunk_bytes)
    tag, h = parsed[0], parsed[1]
    if tag not in (TAG_WANT, TAG_GET):
        return None
    data = lookup(h)
    if data is None:
        return [TAG_NONE, h]
    if tag == TAG_WANT:
        return [TAG_HAVE, h, len(data)]
    index = parsed[2]
    if index >= _chunks(len(data), chunk_bytes):
        return [TAG_NONE, h]
    return [TAG_DATA, h, index, len(data), data[index * chunk_bytes : (index + 1) * chunk_bytes]]


# -- the fetcher ------------------------------------------------------------------------


@dataclass(slots=True)
class _Want:
    digest: bytes
    size: int | None = None
    sources: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)
    strikes: Counter[str] = field(default_factory=Counter)  # timeouts per holder
    peer: str | None = None
    chunks: dict[int, bytes] = field(default_factory=dict)
    from_peer: dict[int, str] = field(default_factory=dict)
    requested: dict[int, int] = field(default_factory=dict)  # index -> deadline_ms
    search_until: int | None = None


class BlobFetcher:
    """Downloads blobs from holders, verifying content addresses (sans-IO)."""

    def __init__(
        self,
        rng: Random,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        window: int = 4,
        max_inflight: int = 16,
        max_wants: int = 256,
        request_timeout_ms: int = 10_000,
        search_ms: int = 5_000,
        max_strikes: int = 3,
        max_downloads: int = 4,
    ) -> None:
        limits = (chunk_bytes, window, max_inflight, max_wants, max_strikes, max_downloads)
        if min(limits) <= 0:
            raise InvalidArgument("fetcher limits must be positive")
        self._rng = rng
        self.chunk_bytes = chunk_bytes
        self.window = window
        self.max_inflight = max_inflight
        self.max_wants = max_wants
        self.request_timeout_ms = request_timeout_ms
        self.search_ms = search_ms
        self.max_strikes = max_strikes
        #: Blobs downloading at once; buffered bytes stay below
        #: ``max_downloads * MAX_BLOB_BYTES``. Other wants queue.
        self.max_downloads = max_downloads
        self._wants: dict[bytes, _Want] = {}
        self._out: list[tuple[str | None, list[Any]]] = []
        self._done: list[tuple[bytes, bytes]] = []
        self._failed: list[bytes] = []
        #: Invalid frames and bad blobs, by error code.
        self.rejected: Counter[str] = Counter()
        #: Frames ignored because nobody asked for them (late or unsolicited).
        self.ignored = 0

    # -- commands ----------------------------------------------------------------

    def want(self, digest: bytes, now_ms: int, sources: Iterable[str] = ()) -> bool:
        """Start fetching ``digest``, asking ``sources`` first (else a broadcast).

        Returns ``False`` (backpressure) when ``max_wants`` fetches are active.
        Wanting a digest already being fetched adds the sources. The size is
        learned from the first chunk, so announced sizes are never trusted.
        """
        if len(digest) != 32:
            raise InvalidArgument("digest must be 32 bytes")
        w = self._wants.get(digest)
        if w is None:
            if len(self._wants) >= self.max_wants:
                return False
            w = self._wants[digest] = _Want(digest)
        w.sources.update(sources)
        self._pump(now_ms)
        return True

    def add_source(self, digest: bytes, peer: str, now_ms: int) -> None:
        """Tell the fetcher that ``peer`` holds ``digest`` (e.g. a new ``blob.put``)."""
        w = self._wants.get(digest)
        if w is not None:
            w.sources.add(peer)
            self._pump(now_ms)

    def cancel(self, digest: bytes) -> None:
        """Stop fetching ``digest`` (late replies are ignored)."""
        self._wants.pop(digest, None)

    def active(self) -> list[bytes]:
        """Digests being fetched, sorted."""
        return sorted(self._wants)

    # -- input ---------------------------------------------------------------------

    def receive(self, peer: str, frame: Any, now_ms: int) -> None:
        """Handle a ``have``/``none``/``data`` frame from ``peer`` (never raises)."""
        try:
            parsed = parse_frame(frame, self.chunk_bytes)
        except RemoteProtocolError as exc:
            self.rejected[exc.code] += 1
            return
        tag = parsed[0]
        if tag == TAG_HAVE:
            self.receive_have(peer, parsed[1], parsed[2], now_ms)
        elif tag == TAG_NONE:
            self.receive_none(peer, parsed[1], now_ms)
        elif tag == TAG_DATA:
            self.receive_data(peer, parsed[1], parsed[2], parsed[3], parsed[4], now_ms)
        else:
            self.ignored += 1

    def receive_have(self, peer: str, digest: bytes, size: int, now_ms: int) -> None:
        """``peer`` says it holds ``digest`` (``size`` is a hint)."""
        w = self._wants.get(digest)
        if w is None:
            self.ignored += 1
            return
        w.sources.add(peer)
        self._pump(now_ms)

    def receive_none(self, peer: str, digest: bytes, now_ms: int) -> None:
        """``peer`` says it does not hold ``digest``."""
        w = self._wants.get(digest)
        if w is None:
            self.ignored += 1
            return
        w.sources.discard(peer)
        if w.peer == peer:
            self._drop_peer(w)
        self._pump(now_ms)

    def receive_data(
        self, peer: str, digest: bytes, index: int, size: int, chunk: bytes, now_ms: int
    ) -> None:
        """One chunk of ``digest`` from ``peer``."""
        w = self._wants.get(digest)
        if w is None or w.peer != peer or index not in w.requested:
            self.ignored += 1
            return
        try:
            if size > MAX_BLOB_BYTES:
                raise FrameTooLarge(f"blob over {MAX_BLOB_BYTES} bytes")
            if w.size is not None and size != w.size:
                if set(w.from_peer.values()) <= {peer}:
                    raise BlobMismatch(f"holder said {w.size} bytes, now says {size}")
                # Earlier holders disagree with this one: we cannot tell who
                # lies, so restart from this holder; the hash settles it.
                w.chunks.clear()
                w.from_peer.clear()
                w.size = None
            if w.size is None:
                w.size = size
            n = _chunks(size, self.chunk_bytes)
            expect = min(self.chunk_bytes, size - index * self.chunk_bytes)
            if index >= n or len(chunk) != expect:
                raise BlobMismatch(f"chunk {index} has {len(chunk)} bytes, want {max(expect, 0)}")
        except RemoteProtocolError as exc:
            self.rejected[exc.code] += 1
            w.bad.add(peer)
            self._drop_peer(w)
            self._pump(now_ms)
            return
        del w.requested[index]
        w.chunks[index] = chunk
        w.from_peer[index] = peer
        if len(w.chunks) == n:
            self._finish(w)
        self._pump(now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Expire overdue requests and searches; call at :meth:`next_deadline`."""
        for digest in sorted(self._wants):
            w = self._wants[digest]
            if w.requested and min(w.requested.values()) <= now_ms:
                assert w.peer is not None
                w.strikes[w.peer] += 1
                self._drop_peer(w)
            elif (
                w.peer is None
                and w.search_until is not None
                and w.search_until <= now_ms
                and not self._usable(w)
            ):
                del self._wants[digest]
                self._failed.append(digest)
        self._pump(now_ms)

    # -- output --------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When :meth:`handle_timer` must next be called (``None``: no timers)."""
        if not self._wants:
            return None
        times = [t for w in self._wants.values() for t in w.requested.values()]
        times += [w.search_until for w in self._wants.values() if w.search_until is not None]
        return min(times) if times else None

    def outbox(self) -> list[tuple[str | None, list[Any]]]:
        """Frames to send as ``(peer, frame)``; ``peer`` ``None`` means every neighbour."""
        out, self._out = self._out, []
        return out

    def completed(self) -> list[tuple[bytes, bytes]]:
        """Verified blobs since the last call, as ``(digest, data)``."""
        out, self._done = self._done, []
        return out

    def failed(self) -> list[bytes]:
        """Digests given up on since the last call (no holder answered)."""
        out, self._failed = self._failed, []
        return out

    def inflight(self) -> int:
        """Chunk requests awaiting an answer."""
        return sum(len(w.requested) for w in self._wants.values())

    # -- internals -------------------------------------------------------------------

    def _usable(self, w: _Want) -> list[str]:
        """Holders worth asking: not proven bad, fewest timeouts first."""
        ok = [p for p in w.sources - w.bad if w.strikes[p] < self.max_strikes]
        fewest = min((w.strikes[p] for p in ok), default=0)
        return sorted(p for p in ok if w.strikes[p] == fewest)

    def _drop_peer(self, w: _Want) -> None:
        w.peer = None
        w.requested.clear()

    def _finish(self, w: _Want) -> None:
        data = b"".join(w.chunks[i] for i in range(len(w.chunks)))
        if blob_digest(data) == w.digest:
            del self._wants[w.digest]
            self._done.append((w.digest, data))
            return
        self.rejected[BlobMismatch.code] += 1
        contributors = set(w.from_peer.values())
        w.chunks.clear()
        w.from_peer.clear()
        w.size = None
        if len(contributors) == 1:
            w.bad.update(contributors)  # it alone sent bytes that do not hash
            self._drop_peer(w)
        # else: chunks from several holders; we cannot tell who lied. Start
        # over from the current holder alone, so the next mismatch convicts it.

    def _pump(self, now_ms: int) -> None:
        budget = self.max_inflight - self.inflight()
        downloading = sum(1 for w in self._wants.values() if w.peer is not None or w.chunks)
        for digest in sorted(self._wants):
            w = self._wants[digest]
            if w.peer is None:
                if not w.chunks and downloading >= self.max_downloads:
                    continue  # queued until a download finishes or fails
                usable = self._usable(w)
                if usable:
                    w.peer = self._rng.choice(usable)
                    w.search_until = None
                    downloading += not w.chunks
                elif w.search_until is None:
                    w.search_until = now_ms + self.search_ms
                    self._out.append((None, [TAG_WANT, digest]))
                    continue
                else:
                    continue
            total = 1 if w.size is None else _chunks(w.size, self.chunk_bytes)
            for i in range(total):
                if budget <= 0 or len(w.requested) >= self.window:
                    break
                if i in w.chunks or i in w.requested:
                    continue
                w.requested[i] = now_ms + self.request_timeout_ms
                self._out.append((w.peer, [TAG_GET, digest, i]))
                budget -= 1
