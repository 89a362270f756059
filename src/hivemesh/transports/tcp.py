"""Secure channels over asyncio TCP: :func:`connect` and :func:`serve`.

The handshake over a stream is :mod:`hivemesh.transports.streams`'s (its
wire format and refusals: :mod:`hivemesh.transports.stream_handshake`); this
module opens and accepts the TCP connections.

* :func:`connect` dials and runs the handshake as initiator under one
  deadline (TCP connect + handshake + ACCEPT).
* :func:`serve` listens; each connection gets a handshake deadline and, on
  success, ``on_channel(channel)``. When ``max_pending_handshakes`` are in
  progress the one that waited longest for its peer is evicted
  (:mod:`hivemesh.transports.admission`); an evicted connection, and one
  beyond ``max_channels``, is refused ``busy``. Failures are counted by
  error code in :attr:`Listener.counters` and never stop the listener.

Both sides prove a boot id (:mod:`hivemesh.transports.noise`), by default
:data:`~hivemesh.transports.streams.PROCESS_BOOT_ID`; a peer that proves our
own identity fails with :class:`~hivemesh.errors.SelfConnection`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hivemesh.core.identity import Identity
from hivemesh.errors import DeadlineExceeded, HivemeshError, PeerUnreachable
from hivemesh.transports.admission import BUSY, HandshakeAdmission, encode_refusal
from hivemesh.transports.channel import Authorize, SecureChannel
from hivemesh.transports.noise import RandomBytes, SecureHandshake, StaticCredentials
from hivemesh.transports.session import ChannelOptions
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.streams import (
    PROCESS_BOOT_ID,
    TaskSet,
    open_channel,
    run_handshake,
    secure_dial,
)

__all__ = ["ChannelOptions", "Listener", "SecureChannel", "connect", "serve"]

_log = logging.getLogger(__name__)
#: Connections accepted per event-loop turn (asyncio's ``backlog``). Well
#: under ``max_pending_handshakes``: a newcomer's first message is read
#: within about two turns, before that many newer connections can evict it.
ACCEPT_BATCH = 128
#: Connections the kernel queues for accept (``listen(2)``): deep, so that a
#: flood does not make it drop a legitimate peer's SYN (a 1 s retransmit).
LISTEN_QUEUE = 4096


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
    boot_id: bytes | None = None,
) -> SecureChannel:
    """Dial ``host:port`` and return an authenticated channel.

    ``timeout_s`` bounds TCP connect + handshake + ACCEPT together. Raises
    :class:`PeerUnreachable`, :class:`DeadlineExceeded`,
    :class:`HandshakeError` (:class:`UnsupportedHandshake` for a peer of
    another payload version), :class:`PeerIdentityMismatch` or
    :class:`UnknownPeer` (either side's trust check); each is also counted
    in ``counters`` if given. We prove ``boot_id`` (default
    :data:`PROCESS_BOOT_ID`) unless ``credentials`` carry their own.
    """
    counters = counters if counters is not None else TransportCounters()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            raise PeerUnreachable(f"cannot connect to {host}:{port}: {exc}") from None
        except TimeoutError:
            raise DeadlineExceeded(f"connect to {host}:{port} over {timeout_s}s") from None
    except HivemeshError as exc:
        counters.record_error(exc)
        raise
    return await secure_dial(
        reader,
        writer,
        identity,
        authorize=authorize,
        path="tcp",
        expect_address=expect_address,
        timeout_s=max(0.0, deadline - loop.time()),
        random_bytes=random_bytes,
        credentials=credentials,
        options=options,
        counters=counters,
        boot_id=boot_id,
    )


@dataclass(eq=False, slots=True)
class _Inbound:
    """One inbound handshake in progress (the admission's key)."""

    deadline: asyncio.Timeout | None = None
    evicted: bool = False


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
        boot_id: bytes = PROCESS_BOOT_ID,
    ) -> None:
        self.identity = identity
        #: Counters shown by ``hivemesh status`` for this listener.
        self.counters = counters
        self._authorize = authorize
        self._on_channel = on_channel
        self._random_bytes = random_bytes
        self._opts = options
        self._creds = StaticCredentials.generate(identity, random_bytes, boot_id=boot_id)
        self._admission = HandshakeAdmission(max_pending_handshakes)
        self._max_channels = max_channels
        self._channels: dict[int, SecureChannel] = {}
        self._tasks = TaskSet(counters, "accept_handler")
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
        full = len(self._channels) >= self._max_channels  # prune only when it may be full
        if full and len(self.channels()) >= self._max_channels:
            self._refuse(writer, BUSY)
            return
        loop = asyncio.get_running_loop()
        me = _Inbound()
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        # No await between admitting and arming the deadline: an eviction
        # always finds the victim's deadline to fire (see _evict).
        victim = self._admission.admit(me, source, loop.time())
        if isinstance(victim, _Inbound):
            self._evict(victim, loop)

        def progress(message: int) -> None:
            self._admission.received(me, message, loop.time())

        hs = SecureHandshake(
            self._creds, initiator=False, random_bytes=self._random_bytes, authorize=self._authorize
        )
        try:
            try:
                async with asyncio.timeout(self._opts.handshake_timeout_s) as me.deadline:
                    session, _ = await run_handshake(reader, writer, hs, self._opts, progress)
            except TimeoutError:
                if me.evicted:
                    self.counters.incr("handshakes_evicted")
                    self._refuse(writer, BUSY)
                    return
                raise DeadlineExceeded(
                    f"handshake not finished in {self._opts.handshake_timeout_s}s"
                ) from None
        except HivemeshError as exc:
            self.counters.record_error(exc)
            _log.debug("handshake from %s failed: %r", peer, exc)
            writer.close()
            return
        except BaseException:  # cancelled (listener closing) or a bug: never leak the socket
            writer.close()
            raise
        finally:
            self._admission.finish(me)
        channel = open_channel(reader, writer, session, hs, self._opts, self.counters, [])
        self._channels[id(channel)] = channel
        try:
            await self._on_channel(channel)
        except Exception:
            self.counters.incr("errors.on_channel")
            _log.exception("on_channel failed for %r", channel)
            channel.close()

    def _refuse(self, writer: asyncio.StreamWriter, code: str) -> None:
        """Tell the dialler why, then close (the transport flushes first)."""
        self.counters.incr(f"refused_{code}")
        writer.write(encode_refusal(code))
        writer.close()

    @staticmethod
    def _evict(victim: _Inbound, loop: asyncio.AbstractEventLoop) -> None:
        """End ``victim``'s handshake now: its deadline fires at once and its
        task refuses it as busy."""
        victim.evicted = True
        if victim.deadline is not None:
            victim.deadline.reschedule(loop.time())

    def _spawn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.spawn(self._handle(reader, writer))

    def close(self) -> None:
        """Stop listening and close every channel and pending handshake."""
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels.values()):
            channel.close()
        self._channels.clear()
        self._tasks.cancel()

    async def wait_closed(self) -> None:
        """Wait for the listening socket and handler tasks to finish."""
        await self._tasks.wait()
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
    max_pending_handshakes: int = 512,
    max_channels: int = 1024,
    boot_id: bytes | None = None,
) -> Listener:
    """Listen on ``host:port`` (port 0 picks one; see :attr:`Listener.port`).

    Every accepted connection must finish the handshake within
    ``options.handshake_timeout_s`` and pass ``authorize(address)``; then
    ``on_channel(channel)`` runs in its own task. Returning from it does not
    close the channel. Beyond ``max_pending_handshakes`` in progress the
    handshake that waited longest for its peer is evicted
    (``handshakes_evicted``); beyond ``max_channels`` open a newcomer is
    refused. Both are told ``busy`` (``refused_busy``; see the module docs).
    Refusals and failures are counted, never raised. The listener proves
    ``boot_id`` (default :data:`PROCESS_BOOT_ID`).
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
        boot_id=PROCESS_BOOT_ID if boot_id is None else boot_id,
    )
    server = await asyncio.start_server(listener._spawn, host, port, backlog=ACCEPT_BATCH)
    listener._server = server
    for tsock in server.sockets:  # deepen the kernel's queue, keep asyncio's batch
        with socket.socket(tsock.family, tsock.type, tsock.proto, os.dup(tsock.fileno())) as s:
            s.listen(LISTEN_QUEUE)
    return listener
