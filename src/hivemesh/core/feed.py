"""Feeds: one author's append-only, hash-chained, batch-signed log.

Theory of operation
-------------------
Each event names the hash of its predecessor, so the newest event (the
*head*) commits to the whole feed. The author signs heads, not events::

    sign(b"hivemesh/head/v1" || author || seq:u64be || hash(event seq))

A signed head at ``seq`` authenticates every event ``1..seq``. Verifying a
batch of ``n`` events therefore costs ``n`` hashes plus one Ed25519 verify,
instead of ``n`` verifies (about 100 us each; see shared/FACTS.md).

A receiver accepts a batch only if it continues its current head exactly
(``first.seq == last_seq + 1``, ``first.prev == last_hash``), is internally
chained, and ends at a seq covered by a valid signature. Otherwise it raises
the matching :class:`~hivemesh.errors.RemoteProtocolError` and stores nothing:

* wrong version / shape / size ...... DecodeError, FrameTooLarge
* already held (seq <= last) ......... ReplayError (or ForkError if different)
* starts after last + 1 .............. GapError (caller pulls the range)
* prev hash mismatch ................. BrokenChain
* signature fails .................... BadSignature

The author's own side is :class:`FeedWriter`: it appends events and seals
(signs) the head whenever the caller chooses, at least every
``MAX_UNSEALED`` events.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hivemesh.core.codec import MAX_BATCH_EVENTS
from hivemesh.core.event import GENESIS, Event, decode_chain, decode_event, encode_event
from hivemesh.core.hlc import HLC, MAX_DRIFT_MS, hlc_ms
from hivemesh.core.identity import Identity, verify
from hivemesh.errors import (
    BadSignature,
    BrokenChain,
    ClockAhead,
    DecodeError,
    ForkError,
    GapError,
    ReplayError,
)

__all__ = ["MAX_UNSEALED", "FeedWriter", "Head", "head_message", "verify_batch"]

#: The writer seals at least this often, so replication chunks stay small.
MAX_UNSEALED = 256

_HEAD_TAG = b"hivemesh/head/v1"
_MAX_HLC = (1 << 63) - 1


def head_message(author: bytes, seq: int, event_id: bytes) -> bytes:
    """The bytes an author signs to vouch for its feed up to ``seq``."""
    return _HEAD_TAG + author + seq.to_bytes(8, "big") + event_id


@dataclass(frozen=True, slots=True)
class Head:
    """The latest verified position of a feed: last seq and its event hash."""

    seq: int = 0
    hash: bytes = GENESIS


def verify_batch(
    author: bytes,
    raws: Sequence[bytes],
    sig: bytes,
    head: Head,
    known: Sequence[bytes] = (),
    last: Event | None = None,
    *,
    check_sig: bool = True,
    max_hlc: int | None = None,
) -> list[Event]:
    """Verify a signed batch that should extend ``head``; return its events.

    ``raws`` are encoded events ``head.seq + 1 ...`` of ``author``; ``sig``
    signs the last one. Events at or below ``head.seq`` are dropped as replays
    when ``known`` (our hashes for ``head.seq - len(known) + 1 .. head.seq``)
    confirms them, or flagged as a fork when a validly signed batch disagrees.
    ``last``, if given, is ``raws[-1]`` already decoded by the caller.
    ``check_sig=False`` skips the head signature of a batch that extends
    ``head`` (the caller verifies it later; see the journal's attested runs).
    ``max_hlc`` makes any event stamped after it raise
    :class:`~hivemesh.errors.ClockAhead` while decoding, before anything
    else is checked (the journal then verifies the batch in full and decides).
    Raises a :class:`~hivemesh.errors.RemoteProtocolError` subclass.
    """
    if not raws:
        raise DecodeError("empty batch")
    if len(raws) > MAX_BATCH_EVENTS:
        raise DecodeError(f"batch of {len(raws)} events exceeds {MAX_BATCH_EVENTS}")
    bound = _MAX_HLC if max_hlc is None else max_hlc
    fast = decode_chain(author, raws, bound) if len(author) == 32 else None
    if fast is not None:  # decoded, one author, contiguous and chained
        _check_extends(author, fast, sig, head, known)
        return _trim(author, fast, sig, head, check_sig=check_sig)
    if last is None or last.raw is not raws[-1]:
        events = [decode_event(r, bound) for r in raws]
    else:
        events = [decode_event(r, bound) for r in raws[:-1]]
        if last.hlc > bound:
            release_ms = hlc_ms(last.hlc) - MAX_DRIFT_MS
            raise ClockAhead(
                "the batch ends beyond the clock bound",
                hlc=last.hlc,
                seq=last.seq,
                release_ms=release_ms,
            )
        events.append(last)
    for e in events:
        if e.author != author:
            raise DecodeError("batch mixes authors")
    for a, b in itertools.pairwise(events):
        if b.seq != a.seq + 1:
            raise DecodeError("batch sequence numbers are not contiguous")
        if b.prev != a.id:
            raise BrokenChain(f"event #{b.seq} does not chain to #{a.seq}")
    _check_extends(author, events, sig, head, known)
    return _trim(author, events, sig, head, check_sig=check_sig)


def _check_extends(
    author: bytes, events: list[Event], sig: bytes, head: Head, known: Sequence[bytes]
) -> None:
    """Raise unless a decoded, chained batch reaches past ``head`` without a gap."""
    first, last = events[0], events[-1]
    if last.seq <= head.seq:
        # Everything is old. Tell replay from fork where we can.
        base = head.seq - len(known) + 1
        for e in events:
            i = e.seq - base
            if 0 <= i < len(known) and known[i] != e.id:
                if verify(author, sig, head_message(author, last.seq, last.id)):
                    raise ForkError(f"author signed two different events at #{e.seq}")
                raise BadSignature("conflicting old event with a bad signature")
        raise ReplayError(f"events #{first.seq}..#{last.seq} already held")
    if first.seq > head.seq + 1:
        raise GapError(f"batch starts at #{first.seq}, we hold up to #{head.seq}")


def _trim(
    author: bytes, events: list[Event], sig: bytes, head: Head, *, check_sig: bool
) -> list[Event]:
    """The part of a checked batch past ``head``, once it chains onto it (and,
    with ``check_sig``, the head signature verifies)."""
    first, last = events[0], events[-1]
    # Trim the already-held prefix (overlapping ranges are normal in gossip).
    skip = head.seq + 1 - first.seq
    if skip:
        if events[skip - 1].id != head.hash:
            if verify(author, sig, head_message(author, last.seq, last.id)):
                raise ForkError(f"author signed a different event at #{head.seq}")
            raise BadSignature("conflicting overlap with a bad signature")
        events = events[skip:]
    elif events[0].prev != head.hash:
        raise BrokenChain(f"event #{events[0].seq} does not chain to our head")
    if check_sig and not verify(author, sig, head_message(author, last.seq, last.id)):
        raise BadSignature(f"head signature for #{last.seq} does not verify")
    return events


class FeedWriter:
    """The owner's side of a feed: append events, seal (sign) heads."""

    __slots__ = ("_unsealed", "clock", "head", "identity")

    def __init__(self, identity: Identity, head: Head, clock: HLC) -> None:
        self.identity = identity
        self.head = head
        self.clock = clock
        self._unsealed: list[Event] = []

    @property
    def unsealed(self) -> int:
        """Events appended since the last seal."""
        return len(self._unsealed)

    def append(self, kind: str, body: Any, now_ms: int) -> Event:
        """Append one event to the feed (not yet signed)."""
        ev = encode_event(
            self.identity.public,
            self.head.seq + 1,
            self.head.hash,
            self.clock.tick(now_ms),
            kind,
            body,
        )
        self.head = Head(ev.seq, ev.id)
        self._unsealed.append(ev)
        return ev

    def seal(self, limit: int | None = None) -> tuple[list[Event], bytes] | None:
        """Sign the head of the oldest ``limit`` unsealed events (all of them
        by default); return the newly covered events and the signature."""
        if not self._unsealed:
            return None
        if limit is None or limit >= len(self._unsealed):
            events, self._unsealed = self._unsealed, []
        else:
            events, self._unsealed = self._unsealed[:limit], self._unsealed[limit:]
        last = events[-1]
        sig = self.identity.sign(head_message(last.author, last.seq, last.id))
        return events, sig

    def reset(self, head: Head) -> None:
        """Drop unsealed events and continue the feed from ``head`` (the
        stored head, after a failed append or once the feed was recovered)."""
        self._unsealed = []
        self.head = head
