"""Events: the atoms of a feed.

An event is the msgpack array ``[1, author, seq, prev, hlc, kind, body]``:

* ``author`` -- 32-byte Ed25519 public key of the feed's owner;
* ``seq``    -- 1, 2, 3, ... within the author's feed, no gaps;
* ``prev``   -- 32-byte hash of event ``seq - 1`` (32 zero bytes for seq 1);
* ``hlc``    -- hybrid logical clock (:mod:`hivemesh.core.hlc`);
* ``kind``   -- short dotted name (``ctx.update``, ``name.claim``, ...);
* ``body``   -- any msgpack value.

Its id is ``blake2b-256`` of those exact bytes. Bytes are stored and forwarded
verbatim, so no canonical re-encoding is ever needed. Events are not signed one
by one: a signature covers a feed *head* (see :mod:`hivemesh.core.feed`), and
the hash chain extends it to every earlier event.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgpack

from hivemesh.core.codec import MAX_EVENT_BYTES, MAX_KIND_CHARS, pack, unpack
from hivemesh.core.hlc import MAX_DRIFT_MS, hlc_ms
from hivemesh.errors import ClockAhead, DecodeError, UnsupportedVersion

__all__ = [
    "EVENT_VERSION",
    "GENESIS",
    "Event",
    "decode_chain",
    "decode_event",
    "encode_event",
    "event_hash",
]

EVENT_VERSION = 1
GENESIS = b"\x00" * 32
_MAX_HLC = (1 << 63) - 1
_blake2b = hashlib.blake2b
_HASH0 = hashlib.blake2b(digest_size=32)
_unpackb = msgpack.unpackb
#: unpack()'s limits for one event, bound once (decode_event is the hot path).
_EVENT_LIMITS: dict[str, Any] = {
    "raw": False,
    "strict_map_key": True,
    "max_bin_len": MAX_EVENT_BYTES,
    "max_str_len": MAX_EVENT_BYTES,
    "max_array_len": 65_536,
    "max_map_len": 65_536,
    "max_ext_len": 0,
}


def event_hash(raw: bytes) -> bytes:
    """The 32-byte id of an encoded event."""
    return hashlib.blake2b(raw, digest_size=32).digest()


class Event:
    """A decoded, hashed event. Immutable by convention; compare by :attr:`id`."""

    __slots__ = ("author", "body", "hlc", "id", "kind", "prev", "raw", "seq")

    def __init__(
        self,
        author: bytes,
        seq: int,
        prev: bytes,
        hlc: int,
        kind: str,
        body: Any,
        raw: bytes,
        id: bytes,
    ) -> None:
        self.author = author
        self.seq = seq
        self.prev = prev
        self.hlc = hlc
        self.kind = kind
        self.body = body
        self.raw = raw
        self.id = id

    @property
    def order_key(self) -> tuple[int, bytes]:
        """The swarm-wide total order: ``(hlc, author)``."""
        return (self.hlc, self.author)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Event({self.author.hex()[:8]}#{self.seq} {self.kind} hlc={self.hlc})"


def encode_event(author: bytes, seq: int, prev: bytes, hlc: int, kind: str, body: Any) -> Event:
    """Build and encode a new event (used by a feed's owner)."""
    if len(author) != 32 or len(prev) != 32:
        raise ValueError("author and prev must be 32 bytes")
    if not (seq >= 1 and 0 <= hlc <= _MAX_HLC):
        raise ValueError("seq must be >= 1 and hlc a non-negative int64")
    if not kind or len(kind) > MAX_KIND_CHARS:
        raise ValueError(f"kind must be 1..{MAX_KIND_CHARS} characters")
    raw = pack([EVENT_VERSION, author, seq, prev, hlc, kind, body])
    if len(raw) > MAX_EVENT_BYTES:
        raise ValueError(f"event is {len(raw)} bytes; limit {MAX_EVENT_BYTES} (use a blob)")
    return Event(author, seq, prev, hlc, kind, body, raw, event_hash(raw))


def decode_event(raw: bytes, max_hlc: int = _MAX_HLC) -> Event:
    """Decode and structurally validate one encoded event.

    Checks shape and types only; chain and signature are checked by the feed.
    An otherwise valid event stamped after ``max_hlc`` (the receiver's clock
    bound, :func:`hivemesh.core.hlc.horizon`) raises
    :class:`~hivemesh.errors.ClockAhead`: the bound rides on the range check
    every event gets anyway, so it costs nothing per event.
    """
    if type(raw) is not bytes:
        raise DecodeError("event must be bytes")
    if len(raw) > MAX_EVENT_BYTES:
        unpack(raw, limit=MAX_EVENT_BYTES)  # raises FrameTooLarge
    try:
        fields = _unpackb(raw, **_EVENT_LIMITS)
    except Exception:  # the codec says exactly what was wrong
        fields = unpack(raw, limit=MAX_EVENT_BYTES)
    if type(fields) is not list or len(fields) != 7:
        raise DecodeError("event must be a 7-element array")
    version, author, seq, prev, hlc, kind, body = fields
    # One combined check on the hot path; the slow path says what was wrong.
    if not (
        version == EVENT_VERSION
        and type(author) is bytes
        and len(author) == 32
        and type(prev) is bytes
        and len(prev) == 32
        and type(seq) is int
        and seq >= 1
        and type(hlc) is int
        and 0 <= hlc <= max_hlc
        and type(kind) is str
        and 0 < len(kind) <= MAX_KIND_CHARS
    ):
        _explain(version, author, seq, prev, hlc, kind)
    return Event(author, seq, prev, hlc, kind, body, raw, _blake2b(raw, digest_size=32).digest())


#: Events up to this many bytes are decoded with msgpack's default limits in
#: :func:`decode_chain`: every default length limit is the buffer's size, so
#: for a buffer this small they are at least as strict as
#: :data:`_EVENT_LIMITS` (whose container limits are this number), and
#: ``raw=False``, ``strict_map_key=True``, ``use_list=True`` are defaults.
_SMALL_EVENT = 65_536


def decode_chain(
    author: bytes, raws: Sequence[bytes], max_hlc: int = _MAX_HLC
) -> list[Event] | None:
    """Decode a run of ``author``'s events that must be contiguous and chained.

    The batch hot path (:func:`hivemesh.core.feed.verify_batch`): the checks
    of :func:`decode_event` on every event, plus "same author", "seq follows
    seq" and "prev is the previous event's hash", in one loop. Returns None
    as soon as anything is off, *without* saying what: the caller then takes
    the precise path (:func:`decode_event` per event), which raises the
    exact error. Never raises; never accepts what that path refuses.
    """
    unpackb = _unpackb
    new_hash = _HASH0.copy
    version, max_kind = EVENT_VERSION, MAX_KIND_CHARS
    out: list[Event] = []
    append = out.append
    prev: bytes | None = None
    seq = 0
    try:
        for raw in raws:
            if type(raw) is not bytes or len(raw) > _SMALL_EVENT:
                return None
            v, ea, es, ep, eh, ek, body = unpackb(raw, max_ext_len=0)
            if prev is None:  # the first event: where the chain starts
                if not (type(ep) is bytes and len(ep) == 32 and type(es) is int and es >= 1):
                    return None
                prev, seq = ep, es
            # From the second event on, ``ep == prev`` (the previous hash)
            # and ``es == seq`` (an int >= 2; ``type(es) is int`` rules out
            # 2.0 and True) are the chain checks and the field checks at once.
            if not (
                ep == prev
                and es == seq
                and type(es) is int
                and ea == author
                and type(ea) is bytes
                and v == version
                and type(eh) is int
                and 0 <= eh <= max_hlc
                and type(ek) is str
                and 0 < len(ek) <= max_kind
            ):
                return None
            h = new_hash()
            h.update(raw)
            prev = h.digest()
            seq += 1
            append(Event(author, es, ep, eh, ek, body, raw, prev))
    except Exception:  # malformed in some way: the precise path says how
        return None
    return out


def _explain(version: Any, author: Any, seq: Any, prev: Any, hlc: Any, kind: Any) -> None:
    if version != EVENT_VERSION:
        raise UnsupportedVersion(f"event version {version!r}")
    if type(author) is not bytes or len(author) != 32:
        raise DecodeError("event author must be 32 bytes")
    if type(prev) is not bytes or len(prev) != 32:
        raise DecodeError("event prev must be 32 bytes")
    if type(seq) is not int or seq < 1:
        raise DecodeError("event seq must be a positive int")
    if type(hlc) is not int or not 0 <= hlc <= _MAX_HLC:
        raise DecodeError("event hlc must be a non-negative int64")
    if type(kind) is not str or not 0 < len(kind) <= MAX_KIND_CHARS:
        raise DecodeError("event kind must be a short string")
    raise ClockAhead(
        f"event #{seq} is stamped beyond the clock bound",
        hlc=hlc,
        seq=seq,
        release_ms=hlc_ms(hlc) - MAX_DRIFT_MS,
    )
