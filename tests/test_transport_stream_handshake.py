"""The handshake over a byte stream, and how a channel ends, without sockets
or an event loop: two :class:`StreamHandshake` machines pumped through bytes
(h11's style)."""

from __future__ import annotations

import contextlib
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    ChannelSuperseded,
    ConnectionClosed,
    DeadlineExceeded,
    HandshakeError,
    HivemeshError,
    PeerBusy,
    UnknownPeer,
)
from hivemesh.transports.admission import encode_refusal
from hivemesh.transports.noise import SecureHandshake, StaticCredentials
from hivemesh.transports.session import FrameSession, close_ending, read_ending, write_ending
from hivemesh.transports.stream_handshake import StreamHandshake

A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
LIMIT = 1 << 20


def machine(me: Identity, *, initiator: bool, trust: bool = True) -> StreamHandshake:
    creds = StaticCredentials.generate(me, secrets.token_bytes)
    hs = SecureHandshake(
        creds, initiator=initiator, random_bytes=secrets.token_bytes, authorize=lambda a: trust
    )
    return StreamHandshake(hs, max_frame_bytes=LIMIT)


def feed(m: StreamHandshake, data: bytes, chunk: int = 7) -> bytes:
    """Feed ``data`` as the driver does: never more than :meth:`wanted`;
    return what was left unread (the machine never reads past its handshake)."""
    while data and not m.done:
        n = min(m.wanted(chunk), len(data))
        assert n > 0
        m.receive_data(data[:n])
        data = data[n:]
    return data


def test_two_machines_agree_and_frames_after_accept_arrive_with_it() -> None:
    a, b = machine(A, initiator=True), machine(B, initiator=False)
    assert feed(b, a.data_to_send()) == b"" and b.last_message == 0 and not b.done
    feed(a, b.data_to_send())
    assert a.last_message == 1 and a.session is not None and not a.done
    assert feed(b, a.data_to_send()) == b"" and b.done and b.last_message == 2
    assert b.session is not None
    accept_and_frame = b.data_to_send() + b.session.encode_frames([b"hello"])
    assert feed(a, accept_and_frame, chunk=1 << 16) == b""
    assert a.done and a.frames == [b"hello"]
    assert b.session.receive_data(a.session.encode_frames([b"hi"])) == [b"hi"]  # same keys


def test_the_responder_never_reads_past_the_third_message() -> None:
    a, b = machine(A, initiator=True), machine(B, initiator=False)
    feed(b, a.data_to_send())
    feed(a, b.data_to_send())
    assert feed(b, a.data_to_send() + b"records follow", chunk=1 << 16) == b"records follow"


def test_an_untrusted_dialler_hears_why_encrypted() -> None:
    a, b = machine(A, initiator=True), machine(B, initiator=False, trust=False)
    feed(b, a.data_to_send())
    feed(a, b.data_to_send())
    with pytest.raises(UnknownPeer):
        feed(b, a.data_to_send())
    last_word = b.data_to_send()
    assert last_word
    with pytest.raises(UnknownPeer, match="does not trust"):
        feed(a, last_word)


@pytest.mark.parametrize("after_message", [0, 2])
def test_a_refusal_in_place_of_a_message_or_of_accept_is_typed(after_message: int) -> None:
    a, b = machine(A, initiator=True), machine(B, initiator=False)
    if after_message == 2:
        feed(b, a.data_to_send())
        feed(a, b.data_to_send())
    with pytest.raises(PeerBusy):
        feed(a, encode_refusal("busy"), chunk=1)
    with pytest.raises(HandshakeError, match="maintenance"):
        feed(machine(A, initiator=True), encode_refusal("maintenance"))


def test_garbage_fails_at_its_first_two_bytes_and_eof_is_a_handshake_error() -> None:
    b = machine(B, initiator=False)
    with pytest.raises(HandshakeError, match="not hivemesh"):
        b.receive_data(b"GE")
    with pytest.raises(HandshakeError, match="not hivemesh"):  # only a dialler reads refusals
        machine(B, initiator=False).receive_data(encode_refusal("busy"))
    with pytest.raises(HandshakeError, match="during the handshake"):
        machine(A, initiator=True).receive_eof()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_garbage_only_ever_raises_typed_errors(data: bytes, initiator: bool) -> None:
    m = machine(A, initiator=initiator)
    with contextlib.suppress(HivemeshError):
        feed(m, data)


def _sessions() -> tuple[FrameSession, FrameSession]:
    a, b = machine(A, initiator=True), machine(B, initiator=False)
    feed(b, a.data_to_send())
    feed(a, b.data_to_send())
    feed(b, a.data_to_send())
    feed(a, b.data_to_send(), chunk=1 << 16)
    assert a.session is not None and b.session is not None
    return a.session, b.session


def test_how_a_channel_ends_after_its_input() -> None:
    """Faults are answered and counted; a clean CLOSE is not a fault; the
    peer's ``channel_superseded`` hands unwritten frames back; a hang-up
    without CLOSE is a fault unless we were retiring the channel."""
    mine, theirs = _sessions()
    assert read_ending(mine, retiring=False) is None
    eof = read_ending(mine, retiring=False, eof=True)
    assert eof is not None and eof.count and eof.notify is None
    retired = read_ending(mine, retiring=True, eof=True)
    assert retired is not None and not retired.count and not retired.keep_unsent
    for code, count, keep, error in (
        ("normal", False, False, ConnectionClosed),
        (ChannelSuperseded.code, False, True, ChannelSuperseded),
        (UnknownPeer.code, True, False, UnknownPeer),
    ):
        mine, theirs = _sessions()
        mine.receive_data(theirs.encode_close(code))
        ending = read_ending(mine, retiring=False)
        assert ending is not None and isinstance(ending.reason, error)
        assert (ending.count, ending.keep_unsent, ending.notify) == (count, keep, None)
    mine, _ = _sessions()
    mine.receive_data(b"\x00\x20" + b"\x00" * 32)  # a record that fails authentication
    ending = read_ending(mine, retiring=True)
    assert ending is not None and ending.count and ending.notify == ending.reason.code


def test_how_a_channel_ends_when_we_close_it_or_its_writer_fails() -> None:
    """Our close tells the peer its code (none once retiring) and is no
    fault; a stalled write tells the peer and aborts; a socket error or a
    bug in the writer ends it as a fault without a word to the peer."""
    plain = close_ending(None, retiring=False)
    assert plain.notify == "normal" and not plain.count and not plain.abort
    revoked = close_ending(UnknownPeer("revoked"), retiring=False)
    assert revoked.notify == UnknownPeer.code and isinstance(revoked.reason, UnknownPeer)
    assert close_ending(UnknownPeer("revoked"), retiring=True).notify is None
    stalled = write_ending(TimeoutError(), 30.0)
    assert isinstance(stalled.reason, DeadlineExceeded) and "30.0s" in str(stalled.reason)
    assert stalled.notify == DeadlineExceeded.code and stalled.count and stalled.abort
    for exc, text in (
        (ConnectionResetError("reset"), "write failed"),
        (KeyError(1), "loop failed"),
    ):
        ending = write_ending(exc, 30.0)
        assert isinstance(ending.reason, ConnectionClosed) and text in str(ending.reason)
        assert ending.notify is None and ending.count and not ending.abort
