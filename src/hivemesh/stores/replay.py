"""Verified replay of a store: the first step of rehydration.

Theory of operation
-------------------
A store is only trusted as far as its cryptography. :func:`verify_feeds`
streams every stored event, author by author in seq order, and re-derives
what a remote receiver would check (:mod:`hivemesh.core.feed`):

* each event decodes (strict msgpack, size limits) and names the right
  author and seq; seqs run 1, 2, 3, ... with no gap or duplicate;
* ``prev`` equals the blake2b-256 of the previous event's stored bytes;
* every stored signature verifies over the head at its seq (one Ed25519
  verify per batch, not per event), and the last stored event of each author
  is covered by one;
* the store's own bookkeeping agrees: the recorded head ``(seq, hash)`` of
  each author, and (SQLite) the number of signatures.

Events are yielded only once the signature covering them has verified, one
signed batch at a time; memory is bounded by the largest batch (plus one
SQLite fetch of stored batches). Any mismatch raises :class:`~hivemesh.errors.StoreCorrupt`
naming the file, the feed and the seq: ``feed hm4x2abcdefg #1234: ...``.
A caller applying events to views must discard them on that error.

Cost per event: one msgpack decode, one blake2b, a few comparisons; the rest
is amortised per batch. ``hivemesh bench rehydrate`` measures it.

**Head signatures** (``signatures="head"``, what the daemon's start-up
replay uses). Verifying every stored signature is redundant: checking each
feed's complete hash chain and only the signature on its *last* batch
authenticates every event of the feed just as well. The argument, from what
the code checks (:mod:`hivemesh.core.event`, :mod:`hivemesh.core.feed`):

1. An author signs ``b"hivemesh/head/v1" || author || seq:u64be || H(raw_seq)``
   (:func:`~hivemesh.core.feed.head_message`), where ``H`` is blake2b-256 and
   ``raw_seq`` the exact stored bytes of event ``seq``. A valid signature on
   the last signed seq ``n`` therefore commits to ``H(raw_n)``.
2. Each ``raw_i`` is the msgpack array ``[1, author, i, prev_i, hlc, kind,
   body]``, and the replay checks, for every event in turn, that it decodes,
   names this author and seq ``i`` (the row's seq column too), and that
   ``prev_i == H(raw_{i-1})`` (``prev_1`` is 32 zero bytes). So ``raw_i``
   commits to ``H(raw_{i-1})``, which commits to ``raw_{i-1}``, and so on
   back to seq 1: ``H(raw_n)`` commits to the whole byte sequence
   ``raw_1 .. raw_n``.
3. Storing any other sequence of events that passes those checks and the
   head signature therefore needs a blake2b-256 second preimage or collision
   somewhere on the chain, or an Ed25519 forgery on the head: the same
   assumptions every replica already relies on (a remote batch of ``k``
   events is accepted on ``k`` hashes and one signature, and an attested
   run is stored under its last signature alone, :mod:`hivemesh.core.journal`).
4. Every stored event must be covered: events after the last signed seq
   fail ("not covered by a signature"), a signature past the last event
   fails ("signature stored for an event that is missing"), and the chain
   must end exactly at the recorded head ``(seq, hash)`` of the ``feeds``
   table. A feed's last stored signature is thus always its head's, and no
   batch can lie beyond the head that vouches for it.

What this does *not* check at start-up is the intermediate signatures
themselves: they authenticate nothing the head does not (a damaged one makes
no event suspect), but the node serves them to peers with the ranges they
end (:meth:`~hivemesh.core.journal.Journal.read_chunk`), so a damaged one
would be refused by the peer it is served to. The replay hands them over
(:class:`SigTally`) and :func:`audit_signatures` verifies them later, off
the event loop (the daemon, :mod:`hivemesh.runtime.rehydration`);
:func:`verify_feeds`, :func:`verify_batches` and :func:`rehydrate` (the
store audits) still verify every signature. The order of the checks does
change one thing: with head signatures, a feed's events are yielded (in
signed batches) once their chain checks out so far, before the head
signature at the feed's end has verified. The rule for callers is the same
as for causal replay already: on :class:`StoreCorrupt`, discard the views.

**Causal order.** :func:`verify_causal` verifies the same way but reads every
feed at once (one cursor per author, fewer rows per fetch when there are
many) and merges them by ``(hlc, author)``: an event's HLC is above every
event its author had received (the node's clock observes what it ingests),
so that order is causal. Views may take events in any interleaving that
keeps each author's seq order (:mod:`hivemesh.core.views.base`), but loro
holds an update whose dependencies have not arrived in a pending queue that
it re-examines on every import: feed by feed, a shared context with several
authors costs time quadratic in its history (26,000 updates from 5 authors
took 57-112 s); in causal order every import applies at once. The merge is
:func:`hivemesh.core.causal.causal_merge` (the simulator's replay uses it too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import msgpack

from hivemesh.core.causal import causal_merge
from hivemesh.core.codec import MAX_EVENT_BYTES, MAX_KIND_CHARS
from hivemesh.core.event import EVENT_VERSION, GENESIS, Event, decode_event
from hivemesh.core.feed import head_message
from hivemesh.core.identity import address_of, short, verify
from hivemesh.core.store import FeedStore, StoredHead
from hivemesh.errors import DecodeError, StoreCorrupt
from hivemesh.stores.sqlite import SQLiteStore

__all__ = [
    "DeferredSig",
    "FeedRows",
    "ReplayStats",
    "SigMode",
    "SigTally",
    "audit_signatures",
    "rehydrate",
    "verify_batches",
    "verify_causal",
    "verify_feeds",
]

_MAX_HLC = (1 << 63) - 1
_MAX_CONTAINER = 65_536
#: Stored rows (one per signed batch) fetched at once across all feeds of a
#: causal replay (at least one per feed). Small on purpose: reading feeds
#: interleaved with larger fetches measured slower (the working set leaves
#: the CPU caches), and memory stays bounded with many feeds.
_CAUSAL_ROWS = 64
#: Stored rows fetched at once by a feed-by-feed replay.
_FEED_FETCH = 16

#: One author's stored feed: ``(author, runs, [(seq, sig)])``, its events as
#: runs ``(first seq, [raw, ...])`` in seq order (values as stored: checked).
FeedRows = tuple[bytes, Iterable[tuple[int, list[bytes]]], list[tuple[int, bytes]]]


#: Which stored signatures a replay verifies: every one, or each feed's last.
SigMode = Literal["all", "head"]
#: A signature a head-only replay did not verify: ``(author, seq, hash of
#: event seq, sig)``, everything :func:`audit_signatures` needs.
DeferredSig = tuple[bytes, int, bytes, bytes]


@dataclass(slots=True)
class SigTally:
    """What a replay did with the stored signatures (filled as feeds end)."""

    #: Signatures verified (Ed25519) during the replay.
    verified: int = 0
    #: Signatures not verified because a later verified one covers their
    #: events through the hash chain (``signatures="head"``).
    covered: int = 0
    #: Those signatures, for :func:`audit_signatures`.
    deferred: list[DeferredSig] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """What a verified replay covered."""

    events: int
    authors: int
    signatures: int


def rehydrate(
    store: FeedStore, apply: Callable[[list[Event]], object] | None = None
) -> ReplayStats:
    """Replay ``store`` through :func:`verify_batches`, calling ``apply`` on
    each verified batch (events of one author, ascending seq).

    This is the hook for view rebuilding. Raises :class:`StoreCorrupt`; views
    fed before the error must then be discarded.
    """
    events = 0
    sigs = 0
    authors: set[bytes] = set()
    for batch in verify_batches(store):
        events += len(batch)
        sigs += 1
        authors.add(batch[0].author)
        if apply is not None:
            apply(batch)
    return ReplayStats(events=events, authors=len(authors), signatures=sigs)


def verify_feeds(store: FeedStore) -> Iterator[Event]:
    """Stream every stored event, verified (see the module docstring).

    Yields events per author in seq order, only after the signature covering
    them verified. Raises :class:`StoreCorrupt` on the first problem found.
    """
    for batch in verify_batches(store):
        yield from batch


def verify_batches(store: FeedStore) -> Iterator[list[Event]]:
    """Like :func:`verify_feeds`, one verified signed batch (a list of one
    author's consecutive events, ending at a signed seq) at a time."""
    heads, counts, corrupt, feeds = _sources(store, fetch=None)
    seen: set[bytes] = set()
    for author, runs, sigs in feeds:
        _check_author(author, seen, corrupt)
        yield from _verify_feed(author, runs, sigs, heads, counts, corrupt)
    _check_all_seen(heads, seen, corrupt)


def verify_causal(
    store: FeedStore, signatures: SigMode = "all", tally: SigTally | None = None
) -> Iterator[list[Event]]:
    """Every stored event, verified as :func:`verify_batches` does, in
    ``(hlc, author)`` order (see the module docstring): lists of consecutive
    events of one author. Raises :class:`StoreCorrupt` on the first problem
    found, possibly after events of other feeds were yielded.

    ``signatures="head"`` verifies each feed's whole hash chain and only its
    last signature (see "Head signatures" in the module docs); ``tally``, if
    given, counts the signatures verified and keeps the others for
    :func:`audit_signatures`."""
    heads, counts, corrupt, feeds = _sources(store, fetch=_CAUSAL_ROWS)
    seen: set[bytes] = set()
    streams: list[Iterator[list[Event]]] = []
    head_only = _head_only(signatures)
    for author, runs, sigs in feeds:
        _check_author(author, seen, corrupt)
        streams.append(_verify_feed(author, runs, sigs, heads, counts, corrupt, head_only, tally))
    yield from causal_merge(streams)
    _check_all_seen(heads, seen, corrupt)


def audit_signatures(
    deferred: Iterable[DeferredSig], where: str = ""
) -> list[tuple[DeferredSig, StoreCorrupt]]:
    """Verify signatures a head-only replay left aside; each that fails,
    with a :class:`StoreCorrupt` naming it (an empty list: all good).

    Such a signature covers events that are already authentic (the feed's
    verified head covers them through the chain), so a bad one does not
    make any stored event suspect: it says the store is damaged, and that
    a peer served the range it ends would refuse it. Pure and thread-safe
    (libsodium through PyNaCl releases the GIL): the daemon runs it off the
    event loop after its replay (:mod:`hivemesh.runtime.rehydration`)."""
    corrupt = _Corrupt(where)
    bad: list[tuple[DeferredSig, StoreCorrupt]] = []
    for item in deferred:
        author, seq, h, sig = item
        if not verify(author, sig, head_message(author, seq, h)):
            bad.append((item, corrupt(author, seq, "signature over the head does not verify")))
    return bad


def _check_author(author: object, seen: set[bytes], corrupt: _Corrupt) -> None:
    if type(author) is not bytes or len(author) != 32:
        raise corrupt(author, 1, "author is not a 32-byte key")
    if author in seen:
        raise corrupt(author, 1, "feed is scanned twice")
    seen.add(author)


def _check_all_seen(heads: dict[bytes, StoredHead], seen: set[bytes], corrupt: _Corrupt) -> None:
    missing = sorted(set(heads) - seen)
    if missing:
        a = missing[0]
        raise corrupt(a, heads[a][0], "feed head recorded but its events are missing")


def _sources(
    store: FeedStore, fetch: int | None
) -> tuple[dict[bytes, StoredHead], dict[bytes, int] | None, _Corrupt, Iterable[FeedRows]]:
    """What verification checks a store against, and its feeds' runs. SQLite
    streams them, :data:`_FEED_FETCH` rows at a time, or with ``fetch``
    (every feed read at once) that many rows shared among the feeds."""
    if isinstance(store, SQLiteStore):
        summary = store.feed_summary()
        rows = _FEED_FETCH if fetch is None else max(1, fetch // max(1, len(summary)))
        heads: dict[bytes, StoredHead] = {a: (s, h) for a, (s, h, _) in summary.items()}
        counts: dict[bytes, int] | None = {a: n for a, (_, _, n) in summary.items()}
        where = f"{store.path}: "
        corrupt = _Corrupt(where)
        stored = store.event_authors()
        unknown = sorted(set(stored) - set(heads))
        if unknown:
            raise corrupt(unknown[0], 1, "events stored but no feed head recorded")
        feeds: Iterable[FeedRows] = (
            (a, store.iter_feed_runs(a, rows), store.signatures(a)) for a in sorted(heads)
        )
    else:
        heads = store.heads()
        counts = None
        corrupt = _Corrupt("")
        feeds = (
            (a, [(1, list(raws))], sigs)
            for a, raws, sigs in store.scan()
            if raws or sigs  # an empty feed holds nothing to verify
        )
    return heads, counts, corrupt, feeds


def _feed(author: object) -> str:
    if type(author) is bytes and len(author) == 32:
        return f"feed {short(address_of(author))}"
    return f"feed {author!r:.40}"


def _head_only(signatures: SigMode) -> bool:
    if signatures not in ("all", "head"):
        raise ValueError(f"signatures must be 'all' or 'head', not {signatures!r}")
    return signatures == "head"


def _verify_feed(
    author: bytes,
    runs: Iterable[tuple[int, list[bytes]]],
    sigs: list[tuple[int, bytes]],
    heads: dict[bytes, StoredHead],
    counts: dict[bytes, int] | None,
    corrupt: _Corrupt,
    head_only: bool = False,
    tally: SigTally | None = None,
) -> Iterator[list[Event]]:
    """Verify one author's feed; yield it one signed batch at a time.

    With ``head_only`` only the last stored signature is verified (module
    docs, "Head signatures"); the others go to ``tally.deferred``."""
    unpackb = msgpack.unpackb
    version = EVENT_VERSION
    max_bytes = MAX_EVENT_BYTES
    max_kind = MAX_KIND_CHARS
    max_hlc = _MAX_HLC
    # For a buffer of at most _MAX_CONTAINER bytes, msgpack's default limits
    # (every length <= the buffer size; raw=False, strict_map_key=True and
    # use_list=True are defaults) are exactly as strict as the codec's, and the
    # call is cheaper. Larger events get the codec's explicit limits.
    small = _MAX_CONTAINER
    limits = {
        "raw": False,
        "strict_map_key": True,
        "use_list": True,
        "max_bin_len": MAX_EVENT_BYTES,
        "max_str_len": MAX_EVENT_BYTES,
        "max_array_len": _MAX_CONTAINER,
        "max_map_len": _MAX_CONTAINER,
        "max_ext_len": 0,
    }
    new_hash = hashlib.blake2b(digest_size=32).copy
    for s, sg in sigs:
        if type(s) is not int or s < 1:
            raise corrupt(author, 0, f"signature stored at invalid seq {s!r}")
        if type(sg) is not bytes:
            raise corrupt(author, s, f"stored signature is a {type(sg).__name__}, not bytes")
    # The one signed seq whose signature is verified here when ``head_only``
    # (the last one); -1: every signed seq is.
    final = sigs[-1][0] if head_only and sigs else -1
    deferred = None if tally is None else tally.deferred
    checked = 0
    signed = iter(sigs)
    next_signed, sig = next(signed, (0, b""))
    expect = 1
    prev = GENESIS
    pending: list[Event] = []
    append = pending.append
    for first, raws in runs:
        if first != expect:
            raise corrupt(author, expect, _misplaced(first, expect))
        for raw in raws:
            try:
                if len(raw) <= small:
                    v, ea, es, ep, eh, ek, body = unpackb(raw, max_ext_len=0)
                elif len(raw) <= max_bytes:
                    v, ea, es, ep, eh, ek, body = unpackb(raw, **limits)
                else:
                    raise DecodeError(f"event is {len(raw)} bytes; limit {max_bytes}")
            except Exception as exc:
                raise corrupt(author, expect, f"event does not decode: {_why(raw, exc)}") from None
            if (
                v != version
                or ea != author
                or es != expect
                or ep != prev
                or type(es) is not int
                or type(eh) is not int
                or type(ek) is not str
                or not (0 <= eh <= max_hlc)
                or not (0 < len(ek) <= max_kind)
            ):
                raise corrupt(author, expect, _mismatch(raw, author, expect, prev))
            h = new_hash()
            h.update(raw)
            prev = h.digest()
            # ``author`` (equal to ``ea``): one object for the whole feed, so
            # views hashing or comparing it per event hit its cached hash.
            append(Event(author, es, ep, eh, ek, body, raw, prev))
            if es == next_signed:
                if final < 0 or es == final:
                    if not verify(author, sig, head_message(author, es, prev)):
                        raise corrupt(author, es, "signature over the head does not verify")
                    checked += 1
                elif deferred is not None:
                    deferred.append((author, es, prev, sig))
                yield pending
                pending = []
                append = pending.append
                next_signed, sig = next(signed, (0, b""))
            expect += 1
    last = expect - 1
    if pending:
        raise corrupt(
            author, last, f"events #{pending[0].seq}..#{last} are not covered by a signature"
        )
    if next_signed:
        raise corrupt(author, next_signed, "signature stored for an event that is missing")
    head = heads.get(author)
    if head is None:
        raise corrupt(author, last, "events stored but no feed head recorded")
    if head != (last, prev):
        raise corrupt(author, last, f"recorded head is #{head[0]} but the feed ends here")
    if counts is not None and counts.get(author) != len(sigs):
        raise corrupt(author, last, f"{len(sigs)} signatures stored, {counts.get(author)} recorded")
    if tally is not None:
        tally.verified += checked
        tally.covered += len(sigs) - checked


class _Corrupt:
    """Builds :class:`StoreCorrupt` errors naming file, feed and seq."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, author: object, seq: object, what: str) -> StoreCorrupt:
        return StoreCorrupt(f"{self.where}{_feed(author)} #{seq}: {what}")


def _why(raw: object, exc: Exception) -> str:
    """A precise reason for an event that failed the fast path."""
    try:
        decode_event(raw)  # type: ignore[arg-type]
    except Exception as detail:
        return str(detail)
    return f"{type(exc).__name__}: {exc}"


def _misplaced(first: object, expect: int) -> str:
    return f"row stored at seq {first!r} where #{expect} was expected (gap or duplicate)"


def _mismatch(raw: bytes, author: bytes, expect: int, prev: bytes) -> str:
    try:
        ev = decode_event(raw)
    except Exception as exc:
        return f"malformed event: {exc}"
    if ev.author != author:
        return "event is signed into another author's feed"
    if ev.seq != expect:
        return f"event claims seq #{ev.seq} (gap, duplicate or reorder)"
    if ev.prev != prev:
        return "prev hash does not match the previous event (altered or missing event)"
    return "event fields are invalid"
