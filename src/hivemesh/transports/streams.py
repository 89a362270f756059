"""A secure channel over any byte stream (TCP, a QUIC stream, a relayed
circuit): :func:`secure_dial` and :func:`secure_accept` run the handshake
(:mod:`hivemesh.transports.stream_handshake`) under one deadline and return a
:class:`~hivemesh.transports.channel.SecureChannel` whose ``path`` says how
its bytes travel. Identity, trust and ``expect_address`` are checked end to
end: whoever carries the bytes learns and can change nothing. Failures are
typed, counted in ``counters`` and close the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable

from hivemesh.core.identity import Identity
from hivemesh.errors import (
    DeadlineExceeded,
    HandshakeError,
    HivemeshError,
    InvalidArgument,
)
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.noise import (
    BOOT_ID_BYTES,
    RandomBytes,
    SecureHandshake,
    StaticCredentials,
)
from hivemesh.transports.session import ChannelOptions, FrameSession
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.stream_handshake import StreamHandshake

__all__ = [
    "PROCESS_BOOT_ID",
    "TaskSet",
    "open_channel",
    "run_handshake",
    "secure_accept",
    "secure_dial",
]

_log = logging.getLogger(__name__)

#: The boot id this process proves when no other is given: random, drawn once
#: per process start.
PROCESS_BOOT_ID = secrets.token_bytes(BOOT_ID_BYTES)


class TaskSet:
    """The tasks of one transport object (handshakes, readers, punches): a
    task's failure is logged and counted as ``errors.<name>`` at once (the
    object goes on); :meth:`cancel` and :meth:`wait` end them all."""

    def __init__(self, counters: TransportCounters, name: str) -> None:
        self._counters = counters
        self._name = name
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task of this set."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._counters.incr(f"errors.{self._name}")
            _log.error("a %s task failed", self._name, exc_info=exc)

    def cancel(self) -> None:
        """Cancel every task."""
        for task in list(self._tasks):
            task.cancel()

    async def wait(self) -> None:
        """Wait for every task to end."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def run_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hs: SecureHandshake,
    options: ChannelOptions,
    progress: Callable[[int], None] | None = None,
) -> tuple[FrameSession, list[bytes]]:
    """Run ``hs`` over a byte stream (:class:`StreamHandshake`); raise typed
    errors only. Returns the session and the frames that came with the
    responder's ACCEPT. ``progress(i)``: handshake message ``i`` arrived whole."""
    machine = StreamHandshake(hs, max_frame_bytes=options.max_frame_bytes)
    try:
        while not machine.done:
            writer.write(machine.data_to_send())
            data = await reader.read(machine.wanted(options.read_chunk_bytes))
            seen = machine.last_message
            machine.receive_data(data) if data else machine.receive_eof()
            if progress is not None and machine.last_message != seen:
                progress(machine.last_message or 0)
        writer.write(machine.data_to_send())
        await writer.drain()
        assert machine.session is not None
        return machine.session, machine.frames
    except HivemeshError:
        if last_word := machine.data_to_send():
            writer.write(last_word)
            with contextlib.suppress(Exception):
                await writer.drain()
        raise
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
