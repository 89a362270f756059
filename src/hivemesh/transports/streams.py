"""A secure channel over any byte stream (TCP, a QUIC stream, a relayed
circuit): one handshake, records, trust rules, counters and frame limits.

:func:`run_handshake` runs a :class:`~hivemesh.transports.noise.SecureHandshake`
over a stream, with the wire format and refusals described in
:mod:`hivemesh.transports.tcp`; :func:`open_channel` makes the channel.

:func:`secure_dial` and :func:`secure_accept` take a connected
``StreamReader``/``StreamWriter`` (a QUIC stream or a relayed circuit made
into one by :mod:`hivemesh.transports.pipe`), run the Noise XX handshake of
:mod:`hivemesh.transports.noise` under one deadline and return a
:class:`~hivemesh.transports.channel.SecureChannel` whose :attr:`path` says
how its bytes travel. Failures are typed, counted in ``counters`` and close
the stream. The identity, the trust check (``authorize``) and the
``expect_address`` check are exactly the TCP transport's: whoever carries
the bytes (a QUIC peer, a relay) learns and can change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
from collections.abc import Callable

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    DeadlineExceeded,
    HandshakeError,
    HivemeshError,
    InvalidArgument,
    UnknownPeer,
)
from hivemesh.transports.admission import REFUSAL_MARK, refusal_error
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.noise import (
    ACCEPTED_MESSAGE_BYTES,
    BOOT_ID_BYTES,
    RandomBytes,
    SecureHandshake,
    StaticCredentials,
)
from hivemesh.transports.session import ChannelOptions, FrameSession, peer_close_error
from hivemesh.transports.stats import TransportCounters

__all__ = ["PROCESS_BOOT_ID", "open_channel", "run_handshake", "secure_accept", "secure_dial"]

_U16 = struct.Struct(">H")
#: The boot id this process proves when no other is given: random, drawn once
#: per process start.
PROCESS_BOOT_ID = secrets.token_bytes(BOOT_ID_BYTES)


def _write_record(writer: asyncio.StreamWriter, message: bytes) -> None:
    writer.write(_U16.pack(len(message)) + message)


async def _read_refusal(reader: asyncio.StreamReader) -> HivemeshError:
    """Read a refusal's code (its mark was read); return the error to raise."""
    (n,) = await reader.readexactly(1)
    return refusal_error((await reader.readexactly(n)).decode("ascii", "replace"))


async def _read_record(
    reader: asyncio.StreamReader, sizes: tuple[int, ...], *, dialler: bool
) -> bytes:
    """One handshake message of one of ``sizes`` (ours first; the others are
    legacy versions', read only to be refused by their version)."""
    (size,) = _U16.unpack(await reader.readexactly(2))
    if size == 0 and dialler:  # only a listener refuses
        raise await _read_refusal(reader)
    if size not in sizes:
        raise HandshakeError(
            f"handshake message of {size} bytes, expected {sizes[0]} (not hivemesh?)"
        )
    return await reader.readexactly(size)


async def run_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hs: SecureHandshake,
    options: ChannelOptions,
    progress: Callable[[int], None] | None = None,
) -> tuple[FrameSession, list[bytes]]:
    """Run ``hs`` to completion over any byte stream (TCP, a QUIC stream, a
    relayed circuit); raise typed errors only. Returns the session and the
    frames that arrived with the responder's ACCEPT.

    The responder calls ``progress(i)`` when handshake message ``i`` (0 or
    2) has arrived complete.
    """
    try:
        if hs.initiator:
            _write_record(writer, hs.initiate())
            reply = hs.receive(await _read_record(reader, ACCEPTED_MESSAGE_BYTES[1], dialler=True))
            assert reply is not None
            _write_record(writer, reply)
            result = hs.result()
            session = FrameSession(
                result.send, result.recv, initiator=True, max_frame_bytes=options.max_frame_bytes
            )
            # Evicted after message 2, the responder sends a refusal in
            # place of its ACCEPT record: a record never starts with 0x0000.
            mark = await reader.readexactly(2)
            if mark == REFUSAL_MARK:
                raise await _read_refusal(reader)
            frames: list[bytes] = []
            data = mark
            while True:
                frames += session.receive_data(data)
                if session.failure is not None:
                    raise session.failure
                if session.peer_close is not None:
                    raise peer_close_error(session.peer_close)
                if session.accepted:
                    return session, frames
                data = await reader.read(options.read_chunk_bytes)
                if not data:
                    raise HandshakeError("the responder closed before accepting us")
        reply = hs.receive(await _read_record(reader, ACCEPTED_MESSAGE_BYTES[0], dialler=False))
        assert reply is not None
        if progress is not None:
            progress(0)
        _write_record(writer, reply)
        try:
            hs.receive(await _read_record(reader, ACCEPTED_MESSAGE_BYTES[2], dialler=False))
        except UnknownPeer:
            result = hs.result()  # keys exist: tell the peer why, encrypted
            refusal = FrameSession(result.send, result.recv, initiator=False)
            writer.write(refusal.encode_close(UnknownPeer.code))
            with contextlib.suppress(Exception):
                await writer.drain()
            raise
        if progress is not None:
            progress(2)
        result = hs.result()
        session = FrameSession(
            result.send, result.recv, initiator=False, max_frame_bytes=options.max_frame_bytes
        )
        writer.write(session.encode_accept())
        await writer.drain()
        return session, []
    except asyncio.IncompleteReadError:
        raise HandshakeError("the peer closed the connection during the handshake") from None
    except (ConnectionError, OSError) as exc:
        raise HandshakeError(f"connection failed during the handshake: {exc}") from None


def open_channel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    session: FrameSession,
    hs: SecureHandshake,
    options: ChannelOptions,
    counters: TransportCounters,
    frames: list[bytes],
    path: str = "tcp",
) -> SecureChannel:
    """The channel of a finished handshake ``hs`` (counted ``handshakes_ok``)."""
    counters.incr("handshakes_ok")
    result = hs.result()
    return SecureChannel(
        reader,
        writer,
        session,
        peer_address=result.peer_address,
        handshake_hash=result.handshake_hash,
        peer_boot_id=result.peer_boot_id,
        options=options,
        counters=counters,
        initial_frames=frames,
        path=path,
    )


async def _secure(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hs: SecureHandshake,
    *,
    options: ChannelOptions,
    counters: TransportCounters,
    timeout_s: float,
    path: str,
) -> SecureChannel:
    try:
        try:
            async with asyncio.timeout(timeout_s):
                session, frames = await run_handshake(reader, writer, hs, options)
        except TimeoutError:
            raise DeadlineExceeded(f"handshake over {path} not finished in {timeout_s}s") from None
    except HivemeshError as exc:
        counters.record_error(exc)
        writer.close()
        raise
    except BaseException:
        writer.close()
        raise
    return open_channel(reader, writer, session, hs, options, counters, frames, path)


async def secure_dial(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    authorize: Authorize,
    path: str,
    expect_address: str | None = None,
    timeout_s: float = 5.0,
    random_bytes: RandomBytes = secrets.token_bytes,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
    boot_id: bytes | None = None,
    credentials: StaticCredentials | None = None,
) -> SecureChannel:
    """Run the handshake as initiator over a connected stream (see module docs).

    We prove ``boot_id`` (default :data:`PROCESS_BOOT_ID`) unless
    ``credentials`` carry their own."""
    creds = credentials or StaticCredentials.generate(
        identity, random_bytes, boot_id=PROCESS_BOOT_ID if boot_id is None else boot_id
    )
    if creds.identity is not identity:
        writer.close()
        raise InvalidArgument("credentials belong to another identity")
    hs = SecureHandshake(
        creds,
        initiator=True,
        random_bytes=random_bytes,
        authorize=authorize,
        expect_address=expect_address,
    )
    return await _secure(
        reader,
        writer,
        hs,
        options=options or ChannelOptions(),
        counters=counters if counters is not None else TransportCounters(),
        timeout_s=timeout_s,
        path=path,
    )


async def secure_accept(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    credentials: StaticCredentials,
    *,
    authorize: Authorize,
    path: str,
    random_bytes: RandomBytes = secrets.token_bytes,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
) -> SecureChannel:
    """Run the handshake as responder over a connected stream (see module docs);
    the deadline is ``options.handshake_timeout_s``."""
    opts = options or ChannelOptions()
    hs = SecureHandshake(
        credentials, initiator=False, random_bytes=random_bytes, authorize=authorize
    )
    return await _secure(
        reader,
        writer,
        hs,
        options=opts,
        counters=counters if counters is not None else TransportCounters(),
        timeout_s=opts.handshake_timeout_s,
        path=path,
    )
