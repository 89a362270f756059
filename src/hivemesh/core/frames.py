"""Wire frames exchanged between nodes.

A frame is the msgpack array ``[FRAME_VERSION, type, *fields]``. The type tags
of every subsystem live in :class:`FrameType`, in one table, so a reader can
see the whole protocol at a glance:

=====  ===========  ====================================================
type   name         fields
=====  ===========  ====================================================
1      EVENTS       author, [raw events], head signature, hops
2      HAVE         {author: last seq}, reply wanted (bool)
3      WANT         [[author, start, end], ...]
10-19  blobs        see :mod:`hivemesh.core.views.blobs`
20-29  direct       direct messages, see :mod:`hivemesh.core.direct`
30-39  membership   SWIM probes and gossip, see :mod:`hivemesh.core.membership`
40-49  leases       quorum lease protocol
60-69  runtime      daemon ping/pong, join proof and admission (runtime)
=====  ===========  ====================================================
"""

from __future__ import annotations

import io
from enum import IntEnum
from typing import Any

import msgpack

from hivemesh.core.codec import MAX_FRAME_BYTES, pack, unpack
from hivemesh.errors import DecodeError, FrameTooLarge, UnsupportedVersion

__all__ = ["FRAME_VERSION", "FrameType", "decode_frame", "encode_frame", "events_author"]

FRAME_VERSION = 1


class FrameType(IntEnum):
    """Frame type tags (see the module table)."""

    EVENTS = 1
    HAVE = 2
    WANT = 3
    BLOB_WANT = 10
    BLOB_DATA = 11
    BLOB_MISSING = 12
    DIRECT = 20
    DIRECT_ACK = 21
    PING = 30
    PING_REQ = 31
    ACK = 32
    SYNC = 33
    GOSSIP = 34
    LEASE = 40
    RT_PING = 60
    RT_PONG = 61
    RT_JOIN = 62
    RT_JOINED = 63
    RT_JOIN_REFUSED = 64


def encode_frame(ftype: int, *fields: Any) -> bytes:
    """Encode a frame of ``ftype`` with ``fields``."""
    return pack([FRAME_VERSION, int(ftype), *fields])


def decode_frame(data: bytes) -> tuple[int, list[Any]]:
    """Decode a frame into ``(type, fields)``; raises DecodeError/FrameTooLarge."""
    obj = unpack(data, limit=MAX_FRAME_BYTES)
    if type(obj) is not list or len(obj) < 2:
        raise DecodeError("frame must be an array [version, type, ...]")
    if obj[0] != FRAME_VERSION:
        raise UnsupportedVersion(f"frame version {obj[0]!r}")
    if type(obj[1]) is not int:
        raise DecodeError("frame type must be an int")
    return obj[1], obj[2:]


def events_author(data: bytes) -> bytes:
    """The author an EVENTS frame names, read from the frame's head alone.

    Only the array header, version, type and author are decoded, not the
    events (a 1,024-event frame is ~150 KB): for a caller that routes or
    checks a frame before handing it to a receiver that decodes it whole.
    Raises as :func:`decode_frame` would (:class:`FrameTooLarge`,
    :class:`UnsupportedVersion`, :class:`DecodeError`), and
    :class:`DecodeError` unless the head is an EVENTS frame's with a
    32-byte author. A frame whose head is fine and whose rest is not passes
    here: its receiver refuses it."""
    if len(data) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"{len(data)} bytes exceeds limit {MAX_FRAME_BYTES}")
    head = msgpack.Unpacker(io.BytesIO(data), read_size=64, raw=False, max_ext_len=0)
    try:
        n = head.read_array_header()
        version = head.unpack() if n >= 2 else None
        ftype = head.unpack() if n >= 2 else None
        author = head.unpack() if n == 6 else None
    except Exception as exc:  # msgpack raises many unrelated types
        raise DecodeError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
    if n >= 2 and version != FRAME_VERSION:
        raise UnsupportedVersion(f"frame version {version!r}")
    if type(ftype) is not int or ftype != FrameType.EVENTS or type(author) is not bytes:
        raise DecodeError("not an EVENTS frame")
    if len(author) != 32:
        raise DecodeError("EVENTS frame author is not a public key")
    return author
