"""A handshake flood for tests: raw TCP connections that never finish a handshake.

:class:`HandshakeFlood` keeps up to ``n`` connections open to a loopback
port from a background thread (epoll, non-blocking). Every other one sends
a partial first handshake message (a length prefix and 10 of its 32 bytes);
the rest send nothing. With ``refresh`` a connection the server closes is
reopened at once (a persistent attacker). Every loop is bounded: at most
``max_opens`` connections in all, and the thread ends at ``deadline_s``
whatever happens. It counts what the server told the connections it closed.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

__all__ = ["BUSY_REFUSAL", "FloodStats", "HandshakeFlood"]

#: What a hivemesh listener sends a connection it refuses for load.
BUSY_REFUSAL = b"\x00\x00\x04busy"
_PARTIAL = b"\x00\x20" + b"\x01" * 10


@dataclass
class FloodStats:
    """What the flood saw."""

    opened: int = 0
    connected: int = 0
    closed_by_server: int = 0
    busy_refusals: int = 0  # closed with exactly BUSY_REFUSAL first
    other_replies: list[bytes] = field(default_factory=list)


class HandshakeFlood:
    """Hold ``n`` half-open handshakes against ``127.0.0.1:port`` (see module docs)."""

    def __init__(
        self,
        port: int,
        n: int,
        *,
        refresh: bool = False,
        max_opens: int = 20_000,
        deadline_s: float = 120.0,
        host: str = "127.0.0.1",
    ) -> None:
        if not host.startswith("127."):
            raise ValueError("the flood only targets loopback")
        self.port = port
        self.n = n
        self.refresh = refresh
        self.max_opens = max_opens
        self.deadline = time.monotonic() + deadline_s
        self.host = host
        self.stats = FloodStats()
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._replies: dict[socket.socket, bytes] = {}
        self._thread = threading.Thread(target=self._run, name="handshake-flood", daemon=True)

    def __enter__(self) -> HandshakeFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the flood and close every connection."""
        self._stop.set()
        self._thread.join(10)

    def wait_connected(self, n: int, timeout_s: float) -> bool:
        """Wait until ``n`` connections were established (or the deadline)."""
        end = time.monotonic() + timeout_s
        while self.stats.connected < n and time.monotonic() < end:
            time.sleep(0.01)
        return self.stats.connected >= n

    def _open(self, index: int) -> None:
        if self.stats.opened >= self.max_opens:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((self.host, self.port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            return
        self.stats.opened += 1
        self._sel.register(s, selectors.EVENT_WRITE, ("connecting", index))

    def _closed(self, s: socket.socket, index: int) -> None:
        reply = self._replies.pop(s, b"")
        self.stats.closed_by_server += 1
        if reply == BUSY_REFUSAL:
            self.stats.busy_refusals += 1
        elif len(self.stats.other_replies) < 20:
            self.stats.other_replies.append(reply)
        self._sel.unregister(s)
        s.close()
        if self.refresh and not self._stop.is_set():
            self._open(index)

    def _run(self) -> None:
        try:
            for i in range(self.n):
                self._open(i)
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                for key, _ in self._sel.select(0.05):
                    s: socket.socket = key.fileobj  # type: ignore[assignment]
                    state, index = key.data
                    if state == "connecting":
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            self._sel.unregister(s)
                            s.close()
                            continue
                        self.stats.connected += 1
                        if index % 2:
                            with contextlib.suppress(OSError):
                                s.send(_PARTIAL)
                        self._sel.modify(s, selectors.EVENT_READ, ("open", index))
                        continue
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if data:
                        self._replies[s] = self._replies.get(s, b"") + data
                        continue
                    self._closed(s, index)
        finally:
            for key in list(self._sel.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._sel.close()
