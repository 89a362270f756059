"""One secure channel: frames pumped through a :class:`FrameSession`.

Theory of operation
-------------------
Sending: an idle channel writes the first frame of an event-loop turn at
once (:meth:`SecureChannel.send_nowait`); later frames queue, and a writer
task seals each batch (up to ``write_batch_bytes``) into as few records as
fit, writes once and drains under ``write_stall_timeout_s``. Receiving: the
transport's protocol opens bytes in its own callback and queues the frames,
offering them first to an inline :attr:`SecureChannel.consumer` while none
are queued (order is kept). A full receive queue pauses reading, so TCP
flow control pushes back on the sender, whose ``send`` waits
(``send_nowait`` raises :class:`~hivemesh.errors.WouldBlock`).

A channel ends with a typed :attr:`SecureChannel.close_reason` (a peer
fault, revoked trust, a stalled write, a CLOSE from either side); ``recv``
returns every frame that arrived intact, then raises
:class:`~hivemesh.errors.ConnectionClosed` chained from it. Frames lost to a
close are counted in ``frames_dropped``, except those of a **retired**
channel (:meth:`SecureChannel.retire`, the loser of a duplicate tie-break,
or one the peer retired with ``channel_superseded``): it half-closes,
keeps reading until the peer's CLOSE, and hands its unwritten frames back
(:meth:`SecureChannel.take_unsent`) to be sent on the channel that carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from types import MappingProxyType
from typing import cast

from hivemesh.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    HivemeshError,
    InvalidArgument,
    UnknownPeer,
    WouldBlock,
)
from hivemesh.transports._queue import FrameQueue
from hivemesh.transports.session import (
    ChannelOptions,
    Ending,
    FrameSession,
    close_ending,
    read_ending,
    write_ending,
)
from hivemesh.transports.stats import ChannelStatistics, TransportCounters

_log = logging.getLogger(__name__)

__all__ = ["CLOSE_GRACE_S", "Authorize", "SecureChannel"]

#: ``struct tcp_info`` (Linux): read this many bytes; ``tcpi_rtt`` (µs) is at this offset.
_TCP_INFO_BYTES = 104
_TCP_INFO_RTT_OFFSET = 68

#: How long a closing channel may take to flush its last bytes before it is aborted.
CLOSE_GRACE_S = 2.0

#: The trust policy: ``authorize(address) -> bool``.
Authorize = Callable[[str], bool]


class SecureChannel:
    """An authenticated, encrypted, framed connection to one peer.

    Created by :func:`connect` and :func:`serve`, never directly.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: FrameSession,
        *,
        peer_address: str,
        handshake_hash: bytes,
        options: ChannelOptions,
        counters: TransportCounters,
        initial_frames: list[bytes],
        peer_boot_id: bytes = b"",
        path: str = "tcp",
    ) -> None:
        #: The peer's proven hivemesh address.
        self.peer_address = peer_address
        #: The Noise handshake hash (a channel binding, same on both sides).
        self.handshake_hash = handshake_hash
        #: The peer's proven boot id: random per start of the peer, so a new
        #: one means the peer restarted (see :mod:`hivemesh.transports.noise`).
        self.peer_boot_id = peer_boot_id
        #: How the bytes travel: ``"tcp"``, ``"udp"`` (QUIC), ``"punched"``
        #: (QUIC through a punched NAT) or ``"relay:<relay address>"``.
        self.path = path
        self._writer = writer
        self._session = session
        self._opts = options
        self._counters = counters
        self._sendq = FrameQueue(options.send_queue_frames, options.send_queue_bytes)
        self._recvq = FrameQueue(options.recv_queue_frames, options.recv_queue_bytes)
        self._close_reason: HivemeshError | None = None
        self._errors: dict[str, int] = {}
        self._closed = asyncio.Event()
        self._writer_idle = asyncio.Event()
        self._writer_busy = False
        self._wrote_this_turn = False  # _write_now wrote a frame this loop turn
        self._loop = asyncio.get_running_loop()
        self._retiring = False  # retire(): CLOSE sent, still reading
        self._keep_unsent = False  # unsent frames wait for take_unsent()
        self._linger: asyncio.TimerHandle | None = None
        self.frames_in = self.bytes_in = self.frames_out = self.bytes_out = 0
        self.frames_dropped = self.send_waits = self.send_would_block = 0
        self._backlog: list[bytes] | None = None  # frames waiting for queue room
        self._backlog_task: asyncio.Task[None] | None = None
        #: Optional inline consumer (see the module docs): called from the
        #: read callback with frames that arrived while none were queued;
        #: returns True if it handled them, False to have them queued for
        #: :meth:`recv` as usual. It must not raise.
        self.consumer: Callable[[list[bytes]], bool] | None = None
        counters.attach(self)
        self._write_task = asyncio.create_task(
            self._write_loop(), name=f"hm-tx-{peer_address[:12]}"
        )
        self._start_reading(reader, initial_frames)

    # -- public API ----------------------------------------------------------

    @property
    def close_reason(self) -> HivemeshError | None:
        """Why the channel ended (``None`` while open)."""
        return self._close_reason

    @property
    def remote_endpoint(self) -> tuple[str, int] | None:
        """The ``(ip, port)`` the channel's bytes come from (a relayed
        channel: ``None``); what a peer reports as our observed address."""
        peer = self._writer.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            return (str(peer[0]), int(peer[1]))
        return None

    @property
    def rtt_ms(self) -> float | None:
        """The smoothed round-trip time its transport measured (QUIC's, or the
        kernel's ``TCP_INFO``); ``None`` where there is none (a relayed channel)."""
        probe = self._writer.get_extra_info("rtt_ms")
        if callable(probe):
            value = probe()
            return None if value is None else round(float(value), 3)
        sock = self._writer.get_extra_info("socket")
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
            (rtt_us,) = struct.unpack_from("I", info, _TCP_INFO_RTT_OFFSET)
        except (AttributeError, OSError, struct.error):  # no socket, no TCP_INFO, short
            return None
        return round(int(rtt_us) / 1000, 3)

    @property
    def is_closed(self) -> bool:
        """True once the channel has ended for any reason."""
        return self._close_reason is not None

    @property
    def is_sending(self) -> bool:
        """False once the channel stopped sending (retired or ended)."""
        return self._close_reason is None and not self._retiring

    @property
    def peer_close_code(self) -> str | None:
        """The code of the peer's CLOSE, if one arrived (``"normal"`` if clean)."""
        return self._session.peer_close

    def _closed_error(self) -> ConnectionClosed:
        reason = self._close_reason
        err = ConnectionClosed(f"channel to {self.peer_address[:12]} closed: {reason}")
        err.__cause__ = reason
        return err

    def _check_frame(self, frame: bytes) -> None:
        if self._close_reason is not None:
            raise self._closed_error()
        if len(frame) > self._opts.max_frame_bytes:
            raise InvalidArgument(
                f"frame of {len(frame)} bytes exceeds the limit {self._opts.max_frame_bytes}"
            )

    def _write_now(self, frame: bytes) -> bool:
        """Seal and write ``frame`` at once if the channel is idle and wrote
        nothing yet this loop turn (see the module docs); else False."""
        if self._wrote_this_turn or self._writer_busy or len(self._sendq) or self._retiring:
            return False  # (retiring: the queue is closed, put_nowait raises)
        transport = self._transport
        if transport.get_write_buffer_size() or transport.is_closing():
            return False
        transport.write(self._session.encode_frame(frame))
        self.frames_out += 1
        self.bytes_out += len(frame)
        self._wrote_this_turn = True
        self._loop.call_soon(self._next_turn)
        return True

    def _next_turn(self) -> None:
        self._wrote_this_turn = False

    def send_nowait(self, frame: bytes) -> None:
        """Queue ``frame`` or raise :class:`WouldBlock` if the send queue is full."""
        if type(frame) is not bytes:
            frame = bytes(frame)
        if self._close_reason is not None or len(frame) > self._opts.max_frame_bytes:
            self._check_frame(frame)
        if self._write_now(frame):
            return
        if not self._sendq.put_nowait(frame):
            self.send_would_block += 1
            raise WouldBlock(f"send queue to {self.peer_address[:12]} is full")

    async def send(self, frame: bytes, *, timeout_s: float | None = None) -> None:
        """Queue ``frame``, waiting while the send queue is full (backpressure).

        Raises :class:`DeadlineExceeded` after ``timeout_s`` (nothing queued)
        and :class:`ConnectionClosed` if the channel is or becomes closed.
        """
        self._check_frame(frame)
        frame = bytes(frame)
        if self._write_now(frame):
            return
        if not self._sendq.put_nowait(frame):
            self.send_waits += 1
            try:
                async with asyncio.timeout(timeout_s):
                    await self._sendq.put(frame)
            except TimeoutError:
                raise DeadlineExceeded(f"send queue stayed full for {timeout_s}s") from None

    def recv_nowait(self) -> bytes:
        """The next frame, or :class:`WouldBlock` if none is queued."""
        frame = self._recvq.get_nowait()
        if frame is None:
            raise WouldBlock("no frame queued")
        return frame

    async def recv(self) -> bytes:
        """The next frame. After the channel ends, queued frames are still
        returned; then :class:`ConnectionClosed` (chained from the reason)."""
        frame = self._recvq.get_nowait()
        if frame is not None:
            return frame
        return await self._recvq.get()

    async def recv_batch(self, max_frames: int = 1024) -> list[bytes]:
        """At least one and at most ``max_frames`` queued frames (waits for the first)."""
        first = await self.recv()
        out = [first]
        get = self._recvq.get_nowait
        while len(out) < max_frames:
            frame = get() if len(self._recvq) else None
            if frame is None:
                break
            out.append(frame)
        return out

    async def wait_sent(self, timeout_s: float | None = None) -> None:
        """Wait until every queued frame was handed to the kernel."""
        try:
            async with asyncio.timeout(timeout_s):
                while (len(self._sendq) or self._writer_busy) and self.is_sending:
                    self._writer_idle.clear()
                    await self._writer_idle.wait()  # set by the writer when it runs dry
                if self._close_reason is not None:
                    raise self._closed_error()
                await self._writer.drain()
        except TimeoutError:
            raise DeadlineExceeded(f"send queue not flushed within {timeout_s}s") from None
        except (ConnectionError, OSError) as exc:
            raise self._closed_error() from exc

    def close(self, reason: HivemeshError | None = None) -> None:
        """Close now. Unsent and unread frames are counted as dropped.

        The peer receives CLOSE carrying ``reason.code`` (``"normal"`` if none).
        """
        if self._close_reason is not None:
            return
        self.frames_dropped += self._recvq.close(self._closed_error, discard=True)
        self._end(close_ending(reason, retiring=self._retiring))

    def retire(self, reason: HivemeshError, *, linger_s: float = CLOSE_GRACE_S) -> None:
        """Half-close gracefully (see module docs): stop sending, send CLOSE
        carrying ``reason.code`` after what was already written, keep reading
        until the peer closes too or ``linger_s`` passes.

        Received frames stay readable; frames queued but not yet written are
        kept for :meth:`take_unsent` (not counted as dropped).
        """
        if self._close_reason is not None or self._retiring:
            return
        self._retiring = self._keep_unsent = True
        # Stop the writer between batches: a batch it already wrote stays ahead
        # of the CLOSE (same socket, same cipher, written in call order).
        self._write_task.cancel()
        self._sendq.close(self._closed_error, discard=False)
        with contextlib.suppress(Exception):
            self._writer.write(self._session.encode_close(reason.code))
        late = ConnectionClosed(f"the peer did not close within {linger_s}s of retire")
        self._linger = self._loop.call_later(linger_s, self._end, Ending(late, count=False))

    def take_unsent(self) -> list[bytes]:
        """Frames accepted by ``send`` but never written, once the channel
        stopped sending by :meth:`retire` or by the peer's ``channel_superseded``
        CLOSE; the caller now owns them (e.g. sends them on another channel).
        Empty in every other case (those frames were counted as dropped)."""
        if not self._keep_unsent:
            return []
        frames, _ = self._sendq.take_batch(self._sendq.nbytes)
        return frames

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Flush queued frames (up to ``timeout_s``), then :meth:`close`."""
        with contextlib.suppress(HivemeshError):
            await self.wait_sent(timeout_s)
        self.close()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the channel has ended and its socket is closed."""
        await self._closed.wait()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def reauthorize(self, authorize: Authorize) -> bool:
        """Re-check trust; close with :class:`UnknownPeer` if revoked. True if kept."""
        if self._close_reason is not None:
            return False
        try:
            trusted = authorize(self.peer_address)
        except Exception:  # a broken policy fails closed
            trusted = False
        if trusted:
            return True
        self._count_error(UnknownPeer.code)
        self.close(UnknownPeer(f"trust in {self.peer_address[:12]} was revoked"))
        return False

    def statistics(self) -> ChannelStatistics:
        """A frozen snapshot of this channel's counters."""
        s = self._session
        reason = self._close_reason
        return ChannelStatistics(
            peer_address=self.peer_address,
            frames_in=self.frames_in,
            frames_out=self.frames_out,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            records_in=s.records_in,
            records_out=s.records_out,
            frames_dropped=self.frames_dropped,
            send_waits=self.send_waits,
            send_would_block=self.send_would_block,
            send_queue_frames=len(self._sendq),
            recv_queue_frames=len(self._recvq),
            closed=reason is not None,
            close_reason=None if reason is None else reason.code,
            errors=MappingProxyType(dict(sorted(self._errors.items()))),
        )

    def __repr__(self) -> str:
        state = "open" if self._close_reason is None else f"closed:{self._close_reason.code}"
        return f"SecureChannel({self.peer_address[:12]}, {state})"

    # -- internals -----------------------------------------------------------

    def _count_error(self, code: str) -> None:
        self._errors[code] = self._errors.get(code, 0) + 1
        self._counters.incr(f"errors.{code}")

    def _end(self, ending: Ending) -> None:
        """Record why, tell the peer if we can, close the socket."""
        if self._close_reason is not None:
            return
        reason = self._close_reason = ending.reason
        self._keep_unsent |= ending.keep_unsent
        if self._linger is not None:
            self._linger.cancel()
        if ending.count:
            self._count_error(reason.code)
        self.frames_dropped += self._sendq.close(self._closed_error, discard=not self._keep_unsent)
        self._recvq.close(self._closed_error, discard=False)
        if ending.notify is not None and not self._writer.is_closing():
            with contextlib.suppress(Exception):
                self._writer.write(self._session.encode_close(ending.notify))
        current = asyncio.current_task()
        for task in (self._write_task, self._backlog_task):
            if task is not None and task is not current:
                task.cancel()
        transport = self._writer.transport
        self._writer.close()  # flushes what is buffered, CLOSE included ...
        if ending.abort:
            transport.abort()  # ... unless the peer stopped reading: then drop now
        else:  # ... and a peer that never reads cannot pin the socket open
            asyncio.get_running_loop().call_later(CLOSE_GRACE_S, transport.abort)
        self._closed.set()
        self._counters.detach(self)

    async def _write_loop(self) -> None:
        sendq, writer, session = self._sendq, self._writer, self._session
        batch_bytes, stall = self._opts.write_batch_bytes, self._opts.write_stall_timeout_s
        try:
            while True:
                if not len(sendq):
                    self._writer_busy = False
                    self._writer_idle.set()
                    await sendq.wait_nonempty()
                self._writer_busy = True
                frames, nbytes = sendq.take_batch(batch_bytes)
                writer.write(session.encode_frames(frames))
                self.frames_out += len(frames)
                self.bytes_out += nbytes
                async with asyncio.timeout(stall):
                    await writer.drain()
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except ConnectionClosed:
            return  # the queue was closed: the channel already ended
        except BaseException as exc:  # a stall, a socket error or a bug: never open and mute
            if not isinstance(exc, OSError):
                _log.exception("the write loop to %s failed", self.peer_address[:12])
            self._end(write_ending(exc, stall))
        finally:
            self._writer_busy = False
            self._writer_idle.set()

    def _start_reading(self, reader: asyncio.StreamReader, initial: list[bytes]) -> None:
        """Take the socket's reading over from the handshake's ``StreamReader``:
        queue the frames that came with the ACCEPT, then any bytes the reader
        buffered after the handshake, then let :class:`_ReadProtocol` feed
        :meth:`_on_data` directly."""
        transport = self._transport = cast(asyncio.Transport, self._writer.transport)
        inner = transport.get_protocol()
        # The handshake's reader may hold bytes that arrived after the last
        # handshake record (the peer may send as soon as it is accepted).
        leftover = bytes(getattr(reader, "_buffer", b""))
        getattr(reader, "_buffer", bytearray()).clear()
        transport.set_protocol(_ReadProtocol(self, inner))
        if initial:
            self._deliver(initial)
        if leftover:
            self._on_data(leftover)
        if reader.exception() is not None or transport.is_closing():
            self._on_end(exc=reader.exception())
        elif reader.at_eof() or getattr(reader, "_eof", False):
            self._on_end()
        elif getattr(reader, "_paused", False) and self._backlog is None:
            transport.resume_reading()  # the reader had paused on its full buffer

    def _deliver(self, frames: list[bytes]) -> None:
        """Queue received frames; on a full queue pause reading until a task
        has queued the rest (backpressure, nothing dropped)."""
        self.frames_in += len(frames)
        self.bytes_in += sum(map(len, frames))
        if self._backlog is not None:
            self._backlog.extend(frames)
            return
        consumer = self.consumer
        if consumer is not None and not len(self._recvq) and consumer(frames):
            return
        try:
            taken = self._recvq.put_many_nowait(frames)
        except ConnectionClosed:
            return  # our own close() closed the queue (its frames were counted)
        if taken < len(frames):
            self._backlog = frames[taken:]
            self._transport.pause_reading()
            self._backlog_task = asyncio.get_running_loop().create_task(
                self._drain_backlog(), name=f"hm-rx-{self.peer_address[:12]}"
            )

    async def _drain_backlog(self) -> None:
        try:
            while self._backlog:
                frame = self._backlog.pop(0)
                await self._recvq.put(frame)  # waits for room
        except ConnectionClosed:
            return  # our own close() closed the receive queue while we waited
        self._backlog = None
        self._backlog_task = None
        if self._close_reason is None:
            self._transport.resume_reading()

    def _on_data(self, data: bytes) -> None:
        if self._close_reason is not None:
            return
        session = self._session
        frames = session.receive_data(data)
        if frames:
            self._deliver(frames)
        if session.failure is not None or session.peer_close is not None:
            self._on_end(eof=False)

    def _on_end(self, *, eof: bool = True, exc: BaseException | None = None) -> None:
        if self._close_reason is not None:
            return
        if exc is not None:
            self._end(Ending(ConnectionClosed(f"read failed: {exc}")))
            return
        ending = read_ending(self._session, retiring=self._retiring, eof=eof)
        if ending is not None:
            self._end(ending)


class _ReadProtocol(asyncio.Protocol):
    """The socket's protocol once a channel is up: reads go straight to the
    channel; write flow control and the connection's end still reach the
    handshake's stream protocol, which the channel's ``StreamWriter`` drains on."""

    def __init__(self, channel: SecureChannel, inner: asyncio.BaseProtocol) -> None:
        self._channel = channel
        self._inner = inner

    def data_received(self, data: bytes) -> None:
        self._channel._on_data(data)

    def eof_received(self) -> bool:
        self._channel._on_end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)
        self._channel._on_end(exc=exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
