"""Encrypted records carrying length-prefixed frames, sans-IO.

Theory of operation
-------------------
After the Noise handshake (:mod:`hivemesh.transports.noise`) a connection
is a sequence of **records** on the wire::

    record := length (u16 big-endian, 16..65535) || Noise transport message

Each record is one AES-GCM message under the session's implicit nonce
counter, so records cannot be replayed, reordered, dropped from the middle
or forged: the receiver's nonce would not match and the record fails
authentication (:class:`~hivemesh.errors.BadRecord`).

The plaintexts of consecutive records form one byte stream of **items**
(TLS does the same with its records)::

    item   := header (u32 big-endian) || body
    header := kind (top 8 bits) || body length (low 24 bits)
    kind 0 := data: the body is one application frame
    kind 1 := control: ACCEPT or CLOSE(code)

For a data frame the header is simply the frame's 4-byte big-endian length.
A frame larger than a record spans several records, and many small frames
share one record, so a batch of frames costs one AEAD operation and one
write instead of one per frame. A header announcing more than
``max_frame_bytes`` fails with :class:`~hivemesh.errors.FrameTooLarge` as
soon as its four bytes arrive, before anything is buffered.

Control items: the responder's first item is ACCEPT, which tells the dialler
that it passed the responder's trust check (otherwise it receives
CLOSE("unknown_peer")). CLOSE(code) is sent before a deliberate close, so an
EOF without it is visibly an unclean end (crash or truncation).

A CLOSE code from the peer becomes a typed local error by the table
:data:`PEER_CLOSE` (:func:`peer_close_error`), and how the channel then ends
(clean or a fault, frames kept or dropped) is :func:`read_ending`'s;
:class:`ChannelOptions` are the limits and deadlines of a channel.

Failure is sticky and never loses authenticated input: :meth:`receive_data`
returns every frame that arrived intact before the fault and records the
fault in :attr:`FrameSession.failure`; later input is ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hivemesh.core.codec import MAX_FRAME_BYTES
from hivemesh.core.joins import JOIN_REFUSALS
from hivemesh.errors import (
    ChannelSuperseded,
    ConnectionClosed,
    DeadlineExceeded,
    DecodeError,
    FrameTooLarge,
    HivemeshError,
    InvalidArgument,
    StaleBoot,
    UnknownPeer,
)
from hivemesh.transports.noise import MAX_MESSAGE_BYTES, TAG_BYTES, CipherState

__all__ = [
    "CONTROL_ACCEPT",
    "CONTROL_CLOSE",
    "MAX_CONTROL_BYTES",
    "MAX_RECORD_PLAINTEXT",
    "PEER_CLOSE",
    "ChannelOptions",
    "Ending",
    "FrameSession",
    "close_ending",
    "peer_close_error",
    "read_ending",
    "write_ending",
]


@dataclass(frozen=True)
class ChannelOptions:
    """Limits and deadlines of a channel (defaults suit a LAN mesh)."""

    max_frame_bytes: int = MAX_FRAME_BYTES
    send_queue_frames: int = 4096
    send_queue_bytes: int = 8 * 1024 * 1024
    recv_queue_frames: int = 4096
    recv_queue_bytes: int = 8 * 1024 * 1024
    write_batch_bytes: int = 256 * 1024
    read_chunk_bytes: int = 256 * 1024
    write_stall_timeout_s: float = 30.0
    handshake_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name, value in sorted(vars(self).items()):
            if not value > 0:
                raise InvalidArgument(f"ChannelOptions.{name} must be positive, got {value!r}")


#: A CLOSE code from the peer -> the local error raised for it, and its text
#: (a join's refusals are the Peer's table, core.joins); any other code is a
#: :class:`~hivemesh.errors.ConnectionClosed` naming it.
PEER_CLOSE: Mapping[str, tuple[type[HivemeshError], str]] = {
    **JOIN_REFUSALS,
    UnknownPeer.code: (UnknownPeer, "the peer does not trust this node (refused or revoked)"),
    "normal": (ConnectionClosed, "the peer closed the channel"),
    ChannelSuperseded.code: (ChannelSuperseded, "the peer retired this duplicate channel"),
    StaleBoot.code: (
        StaleBoot,
        "the peer holds a link to a later life of this node (same key twice?)",
    ),
}


def peer_close_error(code: str) -> HivemeshError:
    """The local error for a CLOSE item carrying ``code`` from the peer."""
    cls, text = PEER_CLOSE.get(code, (ConnectionClosed, f"the peer closed the channel: {code}"))
    return cls(text)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a channel ends: ``reason``; the CLOSE code to send the peer
    (``notify``, if any); whether it is a fault to count under
    ``errors.<code>``; whether unwritten frames go back to the owner
    (``keep_unsent``, a retired channel) instead of being dropped."""

    reason: HivemeshError
    notify: str | None = None
    count: bool = True
    keep_unsent: bool = False

    @property
    def abort(self) -> bool:
        """Drop the connection at once instead of flushing its last bytes
        (the peer stopped reading: a deadline passed)."""
        return isinstance(self.reason, DeadlineExceeded)


def close_ending(reason: HivemeshError | None, *, retiring: bool) -> Ending:
    """How a channel this node closes ends: its CLOSE carries ``reason``'s
    code (``"normal"`` if none), or nothing once retiring (that CLOSE went
    already); never a fault to count."""
    notify = None if retiring else (reason.code if reason else "normal")
    return Ending(reason or ConnectionClosed("closed by this node"), notify, count=False)


def write_ending(exc: BaseException, stall_s: float) -> Ending:
    """How a channel ends when writing failed with ``exc``: a write that
    stalled ``stall_s`` (``TimeoutError``) tells the peer why; a socket
    error, or a bug in the writer, does not."""
    if isinstance(exc, TimeoutError):
        stalled = DeadlineExceeded(f"peer read nothing for {stall_s}s (stalled)")
        return Ending(stalled, notify=stalled.code)
    if isinstance(exc, OSError):  # ConnectionError included
        return Ending(ConnectionClosed(f"write failed: {exc}"))
    return Ending(ConnectionClosed(f"write loop failed: {exc!r}"))


def read_ending(session: FrameSession, *, retiring: bool, eof: bool = False) -> Ending | None:
    """How a channel ends after its input (``eof``: the peer hung up), or
    ``None`` if it goes on. A fault in the input is answered with its code;
    a CLOSE ``"normal"`` or ``channel_superseded`` (the peer retired it: its
    unwritten frames go elsewhere), or any end of a channel we are
    retiring, is clean; an EOF without CLOSE is not (a crash, a cut)."""
    if session.failure is not None:
        return Ending(session.failure, notify=session.failure.code)
    code = session.peer_close
    if code is not None:
        superseded = code == ChannelSuperseded.code
        quiet = superseded or code == "normal" or retiring
        return Ending(peer_close_error(code), count=not quiet, keep_unsent=superseded)
    if not eof:
        return None
    if retiring:  # the peer read our CLOSE and hung up
        return Ending(ConnectionClosed("retired"), count=False)
    return Ending(ConnectionClosed("the peer closed the connection without a close notice"))


#: Largest plaintext in one record.
MAX_RECORD_PLAINTEXT = MAX_MESSAGE_BYTES - TAG_BYTES
#: Largest control item body.
MAX_CONTROL_BYTES = 256
KIND_DATA = 0
KIND_CONTROL = 1
CONTROL_ACCEPT = 1
CONTROL_CLOSE = 2
_LEN_MASK = 0xFFFFFF
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


class FrameSession:
    """Frames in, wire bytes out; wire bytes in, frames out.

    ``initiator`` selects the dialler's rule that the first item received
    must be ACCEPT. Counters (``records_in`` ...) are plain ints for the
    driver's statistics.
    """

    def __init__(
        self,
        send: CipherState,
        recv: CipherState,
        *,
        initiator: bool,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if not 0 < max_frame_bytes <= _LEN_MASK:
            raise InvalidArgument(f"max_frame_bytes must be in 1..{_LEN_MASK}")
        self._send = send
        self._recv = recv
        self.max_frame_bytes = max_frame_bytes
        #: True once the responder's ACCEPT arrived (always True on the responder).
        self.accepted = not initiator
        #: The code in the peer's CLOSE item, once received.
        self.peer_close: str | None = None
        #: The first fault in received input (then all later input is ignored).
        self.failure: HivemeshError | None = None
        self.closing = False
        self.records_in = 0
        self.records_out = 0
        self._wire = bytearray()
        self._plain = bytearray()
        self._need = 0  # length of the partial item in _plain, once its header is known

    # -- sending -------------------------------------------------------------

    def encode_frames(self, frames: Sequence[bytes]) -> bytes:
        """Wire bytes carrying ``frames`` in order (as few records as fit)."""
        parts: list[bytes] = []
        pack = _U32.pack
        limit = self.max_frame_bytes
        for frame in frames:
            size = len(frame)
            if size > limit:
                raise InvalidArgument(f"frame of {size} bytes exceeds the limit {limit}")
            parts.append(pack(size))
            parts.append(frame)
        return self._seal(b"".join(parts))

    def encode_frame(self, frame: bytes) -> bytes:
        """Wire bytes carrying one frame (:meth:`encode_frames` of ``[frame]``)."""
        size = len(frame)
        if size > self.max_frame_bytes:
            raise InvalidArgument(f"frame of {size} bytes exceeds the limit {self.max_frame_bytes}")
        return self._seal(_U32.pack(size) + frame)

    def encode_accept(self) -> bytes:
        """Wire bytes of the responder's ACCEPT item."""
        return self._seal(self._control(bytes([CONTROL_ACCEPT])))

    def encode_close(self, code: str) -> bytes:
        """Wire bytes of a CLOSE item carrying an error ``code`` (``"normal"`` if clean)."""
        body = bytes([CONTROL_CLOSE]) + code.encode("ascii", "replace")[: MAX_CONTROL_BYTES - 1]
        self.closing = True
        return self._seal(self._control(body))

    @staticmethod
    def _control(body: bytes) -> bytes:
        return _U32.pack((KIND_CONTROL << 24) | len(body)) + body

    def _seal(self, stream: bytes) -> bytes:
        encrypt = self._send.encrypt_with_ad
        pack = _U16.pack
        if len(stream) <= MAX_RECORD_PLAINTEXT:
            ct = encrypt(None, stream)
            self.records_out += 1
            return pack(len(ct)) + ct
        out: list[bytes] = []
        view = memoryview(stream)
        for start in range(0, len(stream), MAX_RECORD_PLAINTEXT):
            ct = encrypt(None, view[start : start + MAX_RECORD_PLAINTEXT])
            out.append(pack(len(ct)))
            out.append(ct)
            self.records_out += 1
        return b"".join(out)

    # -- receiving -----------------------------------------------------------

    def receive_data(self, data: bytes) -> list[bytes]:
        """Consume wire bytes; return the complete frames they finish.

        Never raises for bad input: on the first fault, frames that arrived
        intact before it are returned and the fault is stored in
        :attr:`failure`. Check :attr:`failure` and :attr:`peer_close` after
        each call.
        """
        if self.failure is not None or self.peer_close is not None:
            return []
        frames: list[bytes] = []
        try:
            self._open_records(data, frames)
        except HivemeshError as exc:
            self.failure = exc
        return frames

    def _open_records(self, data: bytes, frames: list[bytes]) -> None:
        wire = self._wire
        wire += data
        n = len(wire)
        pos = 0
        try:
            while n - pos >= 2:
                size = (wire[pos] << 8) | wire[pos + 1]
                if size < TAG_BYTES:
                    raise DecodeError(f"record of {size} bytes is shorter than its tag")
                end = pos + 2 + size
                if end > n:
                    break
                plain = self._recv.decrypt_with_ad(None, bytes(wire[pos + 2 : end]))
                pos = end
                self.records_in += 1
                self._on_plaintext(plain, frames)
                if self.peer_close is not None:
                    break
        finally:
            del wire[:pos]

    def _on_plaintext(self, plain: bytes, frames: list[bytes]) -> None:
        pending = self._plain
        if pending:
            pending += plain
            if len(pending) < self._need:
                return  # still inside a frame that spans records: no parsing
            buf = bytes(pending)
            pending.clear()
        else:
            buf = plain
        pos = self._parse_items(buf, frames)
        if pos < len(buf):
            pending += memoryview(buf)[pos:]

    def _parse_items(self, buf: bytes, frames: list[bytes]) -> int:
        """Parse complete items from ``buf``; return where the unparsed rest starts."""
        n = len(buf)
        pos = 0
        unpack = _U32.unpack_from
        limit = self.max_frame_bytes
        self._need = 0
        while n - pos >= 4:
            (header,) = unpack(buf, pos)
            kind = header >> 24
            size = header & _LEN_MASK
            end = pos + 4 + size
            if kind == KIND_DATA:
                if size > limit:
                    raise FrameTooLarge(f"peer announced a {size}-byte frame; limit {limit}")
                if not self.accepted:
                    raise DecodeError("data frame before the responder's ACCEPT")
                if end > n:
                    self._need = end - pos
                    return pos
                frames.append(buf[pos + 4 : end])
            elif kind == KIND_CONTROL:
                if size == 0 or size > MAX_CONTROL_BYTES:
                    raise DecodeError(f"control item of {size} bytes")
                if end > n:
                    return pos
                self._control_item(buf[pos + 4 : end])
                if self.peer_close is not None:
                    return n  # nothing after CLOSE counts
            else:
                raise DecodeError(f"unknown item kind {kind}")
            pos = end
        return pos

    def _control_item(self, body: bytes) -> None:
        code = body[0]
        if code == CONTROL_ACCEPT and len(body) == 1 and not self.accepted:
            self.accepted = True
        elif code == CONTROL_CLOSE:
            self.peer_close = body[1:].decode("ascii", "replace") or "normal"
        else:
            raise DecodeError(f"unexpected control item {code} (accepted={self.accepted})")
