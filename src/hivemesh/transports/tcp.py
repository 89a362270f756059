"""Secure channels over asyncio TCP: Noise XX handshake, then framed records.

Theory of operation
-------------------
This is the thin asyncio pump around two sans-IO objects:
:class:`~hivemesh.transports.noise.SecureHandshake` (who is the peer, may we
talk) and :class:`~hivemesh.transports.session.FrameSession` (frames <->
encrypted records), driven per connection by
:class:`~hivemesh.transports.channel.SecureChannel`. On the wire every
message, handshake or transport, is a ``u16`` big-endian length followed by
one Noise message; handshake messages have fixed sizes, so garbage on the
port fails at its first two bytes.

* :func:`connect` dials, runs the handshake as initiator under one deadline
  (TCP connect + handshake + the responder's ACCEPT) and returns a
  :class:`SecureChannel`. The peer must prove ``expect_address`` if given
  (else :class:`~hivemesh.errors.PeerIdentityMismatch`) and pass
  ``authorize`` (else :class:`~hivemesh.errors.UnknownPeer`); the responder
  refusing us also surfaces as :class:`~hivemesh.errors.UnknownPeer`.
* :func:`serve` listens; each connection gets a handshake deadline, a cap
  on concurrent handshakes, and on success ``on_channel(channel)``. Failures
  are counted by error code in :attr:`Listener.counters` and never stop the
  listener. :meth:`Listener.revalidate` re-runs the trust policy on open
  channels (revocation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
from collections.abc import Awaitable, Callable

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    DeadlineExceeded,
    HandshakeError,
    HivemeshError,
    InvalidArgument,
    PeerUnreachable,
    UnknownPeer,
)
from hivemesh.transports.channel import Authorize, ChannelOptions, SecureChannel, peer_close_error
from hivemesh.transports.noise import (
    MESSAGE_BYTES,
    RandomBytes,
    SecureHandshake,
    StaticCredentials,
)
from hivemesh.transports.session import FrameSession
from hivemesh.transports.stats import TransportCounters

__all__ = ["ChannelOptions", "Listener", "SecureChannel", "connect", "serve"]

_log = logging.getLogger(__name__)
_U16 = struct.Struct(">H")


# -- handshake over a stream ----------------------------------------------------


def _write_record(writer: asyncio.StreamWriter, message: bytes) -> None:
    writer.write(_U16.pack(len(message)) + message)


async def _read_record(reader: asyncio.StreamReader, want: int) -> bytes:
    (size,) = _U16.unpack(await reader.readexactly(2))
    if size != want:
        raise HandshakeError(f"handshake message of {size} bytes, expected {want} (not hivemesh?)")
    return await reader.readexactly(size)


async def _handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hs: SecureHandshake,
    options: ChannelOptions,
) -> tuple[FrameSession, list[bytes]]:
    """Run ``hs`` to completion; raise typed errors only."""
    try:
        if hs.initiator:
            _write_record(writer, hs.initiate())
            reply = hs.receive(await _read_record(reader, MESSAGE_BYTES[1]))
            assert reply is not None
            _write_record(writer, reply)
            result = hs.result()
            session = FrameSession(
                result.send, result.recv, initiator=True, max_frame_bytes=options.max_frame_bytes
            )
            frames: list[bytes] = []
            while not session.accepted:
                data = await reader.read(options.read_chunk_bytes)
                if not data:
                    raise HandshakeError("the responder closed before accepting us")
                frames += session.receive_data(data)
                if session.failure is not None:
                    raise session.failure
                if session.peer_close is not None:
                    raise peer_close_error(session.peer_close)
            return session, frames
        reply = hs.receive(await _read_record(reader, MESSAGE_BYTES[0]))
        assert reply is not None
        _write_record(writer, reply)
        try:
            hs.receive(await _read_record(reader, MESSAGE_BYTES[2]))
        except UnknownPeer:
            result = hs.result()  # keys exist: tell the peer why, encrypted
            refusal = FrameSession(result.send, result.recv, initiator=False)
            writer.write(refusal.encode_close(UnknownPeer.code))
            with contextlib.suppress(Exception):
                await writer.drain()
            raise
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


async def connect(
    host: str,
    port: int,
    identity: Identity,
    *,
    authorize: Authorize,
    expect_address: str | None = None,
    timeout_s: float = 5.0,
    random_bytes: RandomBytes = secrets.token_bytes,
    credentials: StaticCredentials | None = None,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
) -> SecureChannel:
    """Dial ``host:port`` and return an authenticated channel.

    ``timeout_s`` bounds TCP connect + handshake + ACCEPT together. Raises
    :class:`PeerUnreachable`, :class:`DeadlineExceeded`,
    :class:`HandshakeError`, :class:`PeerIdentityMismatch` or
    :class:`UnknownPeer` (either side's trust check); each is also counted
    in ``counters`` if given.
    """
    opts = options or ChannelOptions()
    counters = counters if counters is not None else TransportCounters()
    creds = credentials or StaticCredentials.generate(identity, random_bytes)
    if creds.identity is not identity:
        raise InvalidArgument("credentials belong to another identity")
    hs = SecureHandshake(
        creds,
        initiator=True,
        random_bytes=random_bytes,
        authorize=authorize,
        expect_address=expect_address,
    )
    writer: asyncio.StreamWriter | None = None
    try:
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    reader, writer = await asyncio.open_connection(host, port)
                except OSError as exc:
                    raise PeerUnreachable(f"cannot connect to {host}:{port}: {exc}") from None
                session, frames = await _handshake(reader, writer, hs, opts)
        except TimeoutError:
            raise DeadlineExceeded(
                f"connect+handshake to {host}:{port} over {timeout_s}s"
            ) from None
    except HivemeshError as exc:
        counters.record_error(exc)
        if writer is not None:
            writer.close()
        raise
    counters.incr("handshakes_ok")
    result = hs.result()
    return SecureChannel(
        reader,
        writer,
        session,
        peer_address=result.peer_address,
        handshake_hash=result.handshake_hash,
        options=opts,
        counters=counters,
        initial_frames=frames,
    )


class Listener:
    """A listening socket handing authenticated channels to ``on_channel``."""

    def __init__(
        self,
        identity: Identity,
        *,
        authorize: Authorize,
        on_channel: Callable[[SecureChannel], Awaitable[None]],
        random_bytes: RandomBytes,
        options: ChannelOptions,
        counters: TransportCounters,
        max_pending_handshakes: int,
        max_channels: int,
    ) -> None:
        self.identity = identity
        #: Counters shown by ``hivemesh status`` for this listener.
        self.counters = counters
        self._authorize = authorize
        self._on_channel = on_channel
        self._random_bytes = random_bytes
        self._opts = options
        self._creds = StaticCredentials.generate(identity, random_bytes)
        self._max_pending = max_pending_handshakes
        self._max_channels = max_channels
        self._pending = 0
        self._channels: dict[int, SecureChannel] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound TCP port (useful with port 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    def channels(self) -> list[SecureChannel]:
        """Open channels accepted by this listener."""
        self._channels = {k: c for k, c in self._channels.items() if not c.is_closed}
        return list(self._channels.values())

    def revalidate(self) -> int:
        """Re-run ``authorize`` on every open channel; close revoked ones. Returns how many."""
        return sum(not ch.reauthorize(self._authorize) for ch in self.channels())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.incr("connections_accepted")
        if self._pending >= self._max_pending or len(self.channels()) >= self._max_channels:
            self.counters.incr("refused_busy")
            writer.close()
            return
        self._pending += 1
        hs = SecureHandshake(
            self._creds, initiator=False, random_bytes=self._random_bytes, authorize=self._authorize
        )
        try:
            try:
                async with asyncio.timeout(self._opts.handshake_timeout_s):
                    session, _ = await _handshake(reader, writer, hs, self._opts)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"handshake not finished in {self._opts.handshake_timeout_s}s"
                ) from None
        except HivemeshError as exc:
            self.counters.record_error(exc)
            _log.debug("handshake from %s failed: %r", writer.get_extra_info("peername"), exc)
            writer.close()
            return
        except BaseException:  # cancelled (listener closing) or a bug: never leak the socket
            writer.close()
            raise
        finally:
            self._pending -= 1
        self.counters.incr("handshakes_ok")
        result = hs.result()
        channel = SecureChannel(
            reader,
            writer,
            session,
            peer_address=result.peer_address,
            handshake_hash=result.handshake_hash,
            options=self._opts,
            counters=self.counters,
            initial_frames=[],
        )
        self._channels[id(channel)] = channel
        try:
            await self._on_channel(channel)
        except Exception:
            self.counters.incr("errors.on_channel")
            _log.exception("on_channel failed for %r", channel)
            channel.close()

    def _spawn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """Stop listening and close every channel and pending handshake."""
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels.values()):
            channel.close()
        self._channels.clear()
        for task in list(self._tasks):
            task.cancel()

    async def wait_closed(self) -> None:
        """Wait for the listening socket and handler tasks to finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


async def serve(
    host: str,
    port: int,
    identity: Identity,
    *,
    authorize: Authorize,
    on_channel: Callable[[SecureChannel], Awaitable[None]],
    random_bytes: RandomBytes = secrets.token_bytes,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
    max_pending_handshakes: int = 64,
    max_channels: int = 1024,
) -> Listener:
    """Listen on ``host:port`` (port 0 picks one; see :attr:`Listener.port`).

    Every accepted connection must finish the handshake within
    ``options.handshake_timeout_s`` and pass ``authorize(address)``; then
    ``on_channel(channel)`` runs in its own task. Returning from it does not
    close the channel. Connections beyond ``max_pending_handshakes`` in
    progress or ``max_channels`` open are closed at once (``refused_busy``).
    Refusals and failures are counted, never raised.
    """
    listener = Listener(
        identity,
        authorize=authorize,
        on_channel=on_channel,
        random_bytes=random_bytes,
        options=options or ChannelOptions(),
        counters=counters if counters is not None else TransportCounters(),
        max_pending_handshakes=max_pending_handshakes,
        max_channels=max_channels,
    )
    listener._server = await asyncio.start_server(listener._spawn, host, port)
    return listener
