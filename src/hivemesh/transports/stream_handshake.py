"""The Noise handshake over a byte stream, sans-IO: framing, refusals, ACCEPT.

Theory of operation
-------------------
:class:`StreamHandshake` runs a :class:`~hivemesh.transports.noise.SecureHandshake`
over any byte stream (TCP, a QUIC stream, a relayed circuit): bytes in
(:meth:`~StreamHandshake.receive_data`, :meth:`~StreamHandshake.receive_eof`),
bytes out (:meth:`~StreamHandshake.data_to_send`), and once
:attr:`~StreamHandshake.session` is set the channel's
:class:`~hivemesh.transports.session.FrameSession`. Faults raise typed errors;
after one, :meth:`~StreamHandshake.data_to_send` may still hold a last word
for the peer (the responder's encrypted CLOSE("unknown_peer")). The driver
reads at most :meth:`~StreamHandshake.wanted` bytes at a time, so it never
reads past the handshake into the channel's records.

On the wire each handshake message is a ``u16`` big-endian length followed by
one Noise message. Handshake messages have fixed sizes, so garbage fails at
its first two bytes. After the dialler's third message the responder sends
ACCEPT as the first item of its first record (:mod:`hivemesh.transports.session`).

A listener may refuse a dialler (too busy, :mod:`hivemesh.transports.admission`)
in place of its next handshake message or of its ACCEPT::

    refusal := 0x0000 || length (u8) || code (ASCII), e.g. "busy"

No handshake message and no record is empty, so a zero length is
unambiguous. Only the dialler reads refusals. The refusal is not
authenticated (nothing is yet): an on-path attacker could forge one, as it
could forge a TCP reset.
"""

from __future__ import annotations

import struct

from hivemesh.errors import HandshakeError, UnknownPeer
from hivemesh.transports.admission import REFUSAL_MARK, refusal_error
from hivemesh.transports.noise import SecureHandshake
from hivemesh.transports.session import FrameSession, peer_close_error

__all__ = ["StreamHandshake"]

_U16 = struct.Struct(">H")
_HEADER, _BODY, _REFUSAL_LEN, _REFUSAL, _ACCEPT, _DONE = range(6)


class StreamHandshake:
    """One side's handshake over a byte stream (see the module docs)."""

    def __init__(self, hs: SecureHandshake, *, max_frame_bytes: int) -> None:
        self._hs = hs
        self._max_frame_bytes = max_frame_bytes
        self._out = bytearray()
        self._buf = bytearray()
        self._state = _HEADER
        self._need = 2
        #: The index (0, 1, 2) of the last handshake message received whole.
        self.last_message: int | None = None
        #: The channel's session, once the handshake is done.
        self.session: FrameSession | None = None
        #: Frames that came with the responder's ACCEPT (dialler only).
        self.frames: list[bytes] = []
        if hs.initiator:
            self._send(hs.initiate())

    @property
    def done(self) -> bool:
        """True once :attr:`session` carries the channel (ACCEPT received, or sent)."""
        return self._state == _DONE

    def data_to_send(self) -> bytes:
        """The bytes to write now (and forget)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def wanted(self, chunk: int) -> int:
        """How many bytes to read next, at most (``chunk`` once records flow)."""
        return chunk if self._state == _ACCEPT and not self._need else self._need - len(self._buf)

    def receive_eof(self) -> None:
        """The peer closed its side: always a fault before the handshake ended."""
        if self._state == _ACCEPT:
            raise HandshakeError("the responder closed before accepting us")
        raise HandshakeError("the peer closed the connection during the handshake")

    def receive_data(self, data: bytes) -> None:
        """Consume bytes from the peer; raise typed errors only."""
        self._buf += data
        while self._state != _DONE:
            if self._state == _ACCEPT and not self._need:
                self._accepting(bytes(self._buf))
                self._buf.clear()
                return
            if len(self._buf) < self._need:
                return
            chunk = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._step(chunk)

    def _send(self, message: bytes) -> None:
        self._out += _U16.pack(len(message)) + message

    def _expect(self, state: int, need: int) -> None:
        self._state, self._need = state, need

    def _step(self, chunk: bytes) -> None:
        state, hs = self._state, self._hs
        if state == _HEADER:
            (size,) = _U16.unpack(chunk)
            sizes = hs.next_message_sizes
            if size == 0 and hs.initiator:
                self._expect(_REFUSAL_LEN, 1)
            elif size in sizes:
                self._expect(_BODY, size)
            else:
                want = sizes[0] if sizes else 0
                raise HandshakeError(
                    f"handshake message of {size} bytes, expected {want} (not hivemesh?)"
                )
        elif state == _REFUSAL_LEN and chunk[0]:
            self._expect(_REFUSAL, chunk[0])
        elif state in (_REFUSAL_LEN, _REFUSAL):
            code = b"" if state == _REFUSAL_LEN else chunk
            raise refusal_error(code.decode("ascii", "replace"))
        elif state == _ACCEPT:  # the first two bytes after our last message
            if chunk == REFUSAL_MARK:
                self._expect(_REFUSAL_LEN, 1)
            else:
                self._need = 0
                self._accepting(chunk)
        else:
            self._message(chunk)

    def _message(self, message: bytes) -> None:
        hs = self._hs
        self.last_message = 1 if hs.initiator else (0 if self.last_message is None else 2)
        try:
            reply = hs.receive(message)
        except UnknownPeer:
            if not hs.initiator:  # keys exist: tell the peer why, encrypted
                result = hs.result()
                refusal = FrameSession(result.send, result.recv, initiator=False)
                self._out += refusal.encode_close(UnknownPeer.code)
            raise
        if reply is not None:
            self._send(reply)
        if self.last_message == 0:
            self._expect(_HEADER, 2)
            return
        result = hs.result()
        self.session = FrameSession(
            result.send,
            result.recv,
            initiator=hs.initiator,
            max_frame_bytes=self._max_frame_bytes,
        )
        if hs.initiator:
            self._expect(_ACCEPT, 2)
        else:
            self._out += self.session.encode_accept()
            self._expect(_DONE, 0)

    def _accepting(self, data: bytes) -> None:
        session = self.session
        assert session is not None
        self.frames += session.receive_data(data)
        if session.failure is not None:
            raise session.failure
        if session.peer_close is not None:
            raise peer_close_error(session.peer_close)
        if session.accepted:
            self._expect(_DONE, 0)
