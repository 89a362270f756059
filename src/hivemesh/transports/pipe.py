"""A byte stream that is not a socket (a QUIC stream, a relayed circuit) as
an asyncio transport, so the handshake and :class:`~hivemesh.transports.channel.SecureChannel`
run over it unchanged.

The owner passes ``send(data)`` (bytes towards the peer), ``buffered()``
(how many are not gone yet: above ``high_water`` the protocol's writes pause,
at ``low_water`` they resume; the owner calls :meth:`PipeTransport.check_writable`
when bytes leave) and ``on_close()``, and feeds what arrives with
:meth:`~PipeTransport.feed`, :meth:`~PipeTransport.feed_eof` and
:meth:`~PipeTransport.lost`. Bytes fed while reading is paused are held
(bounded by the carrier's own flow control) and handed over on resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["PipeTransport", "open_pipe"]


class PipeTransport(asyncio.Transport):
    """An asyncio transport over ``send``/``feed`` callbacks (see module docs)."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        buffered: Callable[[], int],
        on_close: Callable[[], None],
        *,
        extra: dict[str, Any] | None = None,
        high_water: int = 1 << 20,
        low_water: int = 1 << 18,
    ) -> None:
        super().__init__(extra)
        self._send = send
        self._buffered = buffered
        self._on_close = on_close
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        self._lost = False
        self._paused_reading = False
        self._paused_writing = False
        self._held: list[bytes] = []
        self._held_eof = False
        self._high = high_water
        self._low = low_water

    # -- asyncio.Transport -------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._on_close()
        asyncio.get_running_loop().call_soon(self.lost, None)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self._paused_reading = True

    def resume_reading(self) -> None:
        if not self._paused_reading:
            return
        self._paused_reading = False
        held, self._held = self._held, []
        for data in held:
            self._deliver(data)
        if self._held_eof:
            self._held_eof = False
            self.feed_eof()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._send(bytes(data))
        self.check_writable()

    def get_write_buffer_size(self) -> int:
        return self._buffered()

    def check_writable(self) -> None:
        """Pause or resume the protocol's writes by the bytes still buffered."""
        if self._protocol is None or self._lost:
            return
        size = self._buffered()
        if not self._paused_writing and size > self._high:
            self._paused_writing = True
            self._protocol.pause_writing()
        elif self._paused_writing and size <= self._low:
            self._paused_writing = False
            self._protocol.resume_writing()

    def _deliver(self, data: bytes) -> None:
        assert self._protocol is not None
        self._protocol.data_received(data)  # type: ignore[attr-defined]

    def feed(self, data: bytes) -> None:
        """Bytes arrived from the peer."""
        if self._lost or not data:
            return
        if self._paused_reading:
            self._held.append(data)
            return
        self._deliver(data)

    def feed_eof(self) -> None:
        """The peer finished sending."""
        if self._lost:
            return
        if self._paused_reading:
            self._held_eof = True
            return
        assert self._protocol is not None
        self._protocol.eof_received()  # type: ignore[attr-defined]

    def lost(self, exc: Exception | None) -> None:
        """The underlying stream ended (``exc``: why, ``None``: cleanly)."""
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._protocol is not None:
            self._protocol.connection_lost(exc)


def open_pipe(transport: PipeTransport) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A ``StreamReader``/``StreamWriter`` pair over ``transport``, as
    :func:`asyncio.open_connection` returns for a socket."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer
