"""Strict, versioned msgpack codec with explicit size limits.

Every byte string that crosses a trust boundary (a frame from a peer, a row
from disk) is decoded here, once, with hard limits on the total size and on
every container and string inside. Anything that is not exactly what the
protocol allows becomes a :class:`~hivemesh.errors.DecodeError` (or
:class:`~hivemesh.errors.FrameTooLarge`): msgpack's own zoo of exceptions never
leaks out, so callers have one thing to catch and count.

Limits are module constants so they are documented in one place.
"""

from __future__ import annotations

from typing import Any

import msgpack

from hivemesh.errors import DecodeError, FrameTooLarge

__all__ = [
    "MAX_BATCH_EVENTS",
    "MAX_BODY_BYTES",
    "MAX_EVENT_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_KIND_CHARS",
    "pack",
    "unpack",
]

#: Largest frame accepted from a peer (one transport message).
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: Largest single encoded event. Large binary state goes in blobs.
MAX_EVENT_BYTES = 256 * 1024
#: Largest event body, encoded.
MAX_BODY_BYTES = MAX_EVENT_BYTES - 256
#: Most events in one replication batch.
MAX_BATCH_EVENTS = 1024
#: Longest event kind (a short dotted name such as ``ctx.update``).
MAX_KIND_CHARS = 64

_MAX_CONTAINER = 65_536
_unpackb = msgpack.unpackb


def pack(obj: Any) -> bytes:
    """Encode ``obj`` as msgpack (bin for bytes, str for text)."""
    try:
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def unpack(data: bytes, *, limit: int = MAX_FRAME_BYTES) -> Any:
    """Decode one msgpack value from ``data`` with size limits.

    Raises :class:`FrameTooLarge` if ``data`` exceeds ``limit`` and
    :class:`DecodeError` for anything malformed (truncated, trailing bytes,
    extension types, non-string map keys, invalid UTF-8, too deep).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limit:
        raise FrameTooLarge(f"{len(data)} bytes exceeds limit {limit}")
    try:
        return _unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=limit,
            max_str_len=limit,
            max_array_len=_MAX_CONTAINER,
            max_map_len=_MAX_CONTAINER,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many unrelated types
        raise DecodeError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
