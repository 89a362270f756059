"""The relay protocol's messages, sans-IO: one message per channel frame.

A relay channel is a secure channel (QUIC, ALPN ``hivemesh-relay/1``)
between a node and a peer that accepted the relay role. Its frames are::

    message := kind (u8) || circuit (u32 big-endian) || body
    RESERVE    0  -           make me reachable through you
    RESERVED   0  -           done
    CONNECT    c  address     open circuit c (the sender's id) to ``address``
    CONNECTED  c  -           circuit c is open
    INCOMING   c  address     ``address`` opened circuit c (the relay's id) to you
    DATA       c  bytes       opaque bytes of circuit c (an end-to-end Noise stream)
    CLOSE      c  code        circuit c ended
    REFUSED    c  code        the request for circuit c (0: RESERVE) is refused
    OBSERVED   0  ip:port     the address the relay sees this channel come from
    PUNCH      c  punch       hole-punch candidates for the other end of circuit c

    punch := claimed address (u8 length || ASCII) || count (u8) || count * (u8 length || ip:port)

Everything is bounded: addresses are at most 64 bytes, candidates at most
:data:`MAX_CANDIDATES_WIRE`, a message at most the channel's frame limit.
Malformed input raises :class:`~hivemesh.errors.DecodeError`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from hivemesh.errors import DecodeError

__all__ = [
    "DATA_CHUNK_BYTES",
    "MAX_CANDIDATES_WIRE",
    "Kind",
    "Message",
    "Punch",
    "data_frames",
    "decode",
    "encode",
    "parse_hostport",
]

_HEAD = struct.Struct(">BI")
_MAX_TEXT = 64
#: The most candidates a PUNCH can carry on the wire (policy may allow fewer).
MAX_CANDIDATES_WIRE = 32
#: Bytes of a circuit per DATA message (well under a relay's ``max_data_bytes``).
DATA_CHUNK_BYTES = 32 << 10


class Kind(enum.IntEnum):
    """Relay message kinds."""

    RESERVE = 1
    RESERVED = 2
    CONNECT = 3
    CONNECTED = 4
    INCOMING = 5
    DATA = 6
    CLOSE = 7
    REFUSED = 8
    OBSERVED = 9
    PUNCH = 10


_TEXT_KINDS = {Kind.CONNECT, Kind.INCOMING, Kind.CLOSE, Kind.REFUSED, Kind.OBSERVED}


@dataclass(frozen=True, slots=True)
class Punch:
    """A PUNCH body: who the sender claims to be and where it may be reached."""

    claimed: str
    candidates: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Message:
    """One relay message; ``text`` for the address/code kinds, ``data`` for
    DATA, ``punch`` for PUNCH."""

    kind: Kind
    circuit: int = 0
    text: str = ""
    data: bytes = b""
    punch: Punch | None = None


def parse_hostport(text: str) -> tuple[str, int]:
    """``"ip:port"`` -> ``(ip, port)``; :class:`DecodeError` if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DecodeError(f"not host:port: {text[:80]!r}")
    return host, int(port)


def _text(value: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > _MAX_TEXT:
        raise ValueError(f"relay text over {_MAX_TEXT} bytes")
    return raw


def encode(msg: Message) -> bytes:
    """The frame carrying ``msg``."""
    head = _HEAD.pack(int(msg.kind), msg.circuit)
    if msg.kind == Kind.DATA:
        return head + msg.data
    if msg.kind in _TEXT_KINDS:
        return head + _text(msg.text)
    if msg.kind == Kind.PUNCH:
        assert msg.punch is not None
        claimed = _text(msg.punch.claimed)
        out = [head, bytes([len(claimed)]), claimed, bytes([len(msg.punch.candidates)])]
        for host, port in msg.punch.candidates:
            c = _text(f"{host}:{port}")
            out += [bytes([len(c)]), c]
        return b"".join(out)
    return head


def data_frames(circuit: int, data: bytes, chunk: int = DATA_CHUNK_BYTES) -> list[bytes]:
    """The DATA frames carrying ``data`` on ``circuit``, in order, ``chunk`` bytes each at most."""
    head = _HEAD.pack(Kind.DATA, circuit)
    return [head + data[i : i + chunk] for i in range(0, len(data), chunk)]


def _ascii(raw: bytes) -> str:
    if len(raw) > _MAX_TEXT:
        raise DecodeError(f"relay text over {_MAX_TEXT} bytes")
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise DecodeError("relay text is not ASCII") from None


def _decode_punch(body: bytes) -> Punch:
    pos = 0

    def take() -> bytes:
        nonlocal pos
        if pos >= len(body):
            raise DecodeError("truncated PUNCH")
        n = body[pos]
        chunk = body[pos + 1 : pos + 1 + n]
        if len(chunk) != n:
            raise DecodeError("truncated PUNCH")
        pos += 1 + n
        return chunk

    claimed = _ascii(take())
    if pos >= len(body):
        raise DecodeError("truncated PUNCH")
    count = body[pos]
    pos += 1
    if count > MAX_CANDIDATES_WIRE:
        raise DecodeError(f"PUNCH with {count} candidates")
    candidates = tuple(parse_hostport(_ascii(take())) for _ in range(count))
    if pos != len(body):
        raise DecodeError("trailing bytes after PUNCH")
    return Punch(claimed, candidates)


def decode(frame: bytes) -> Message:
    """The message in ``frame``; :class:`DecodeError` if it is not one."""
    if len(frame) < _HEAD.size:
        raise DecodeError("relay frame shorter than its header")
    kind_value, circuit = _HEAD.unpack_from(frame)
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise DecodeError(f"unknown relay message kind {kind_value}") from None
    body = frame[_HEAD.size :]
    if kind == Kind.DATA:
        return Message(kind, circuit, data=bytes(body))
    if kind in _TEXT_KINDS:
        return Message(kind, circuit, text=_ascii(body))
    if kind == Kind.PUNCH:
        return Message(kind, circuit, punch=_decode_punch(body))
    if body:
        raise DecodeError(f"{kind.name} carries no body")
    return Message(kind, circuit)
