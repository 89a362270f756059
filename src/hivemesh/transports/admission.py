"""Which inbound handshakes may run when too many arrive at once, sans-IO.

Theory of operation
-------------------
A listener runs at most ``max_pending`` handshakes at a time. A connection
costs an attacker almost nothing: one that connects and then says nothing,
or sends half a handshake message, holds a slot until the handshake
deadline. If a full listener simply refused newcomers, a flood of such
connections would keep every legitimate peer out for deadline after
deadline (and the peer's dialler saw only "closed during the handshake").

The rule here instead: a newcomer is always admitted; when that would exceed
the bound, one pending handshake is **evicted**, and told ``busy`` (its
dialler backs off and retries). The victim is the handshake that has waited
longest for its peer -- the oldest *last progress*, where progress is being
accepted or receiving a complete handshake message -- chosen among the
sources (peer IP addresses) that hold the most pending handshakes:

* a connection that says nothing never progresses, so it is the first to go;
* a legitimate peer answers each handshake message within one round trip,
  so it is evicted only if ``max_pending`` newer connections arrive from
  sources at least as heavy as its own within that round trip;
* one flooding host only ever evicts its own connections once it holds more
  than any other source, so it cannot push out other hosts' handshakes.

The evicted are told why before they are closed, in place of the next
handshake message (:func:`encode_refusal`; the wire format is
:mod:`hivemesh.transports.stream_handshake`'s); the dialler raises
:func:`refusal_error` for it: :class:`~hivemesh.errors.PeerBusy` for
:data:`BUSY`, :class:`~hivemesh.errors.HandshakeError` naming any other code.

No newcomer is made to wait behind the flood's deadlines. The object only
decides: the driver (:mod:`hivemesh.transports.tcp`) passes the time in,
closes what it is told to evict and counts it. Keys are any hashable the
driver picks; ``source`` is a string naming the peer's host.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from hivemesh.errors import HandshakeError, HivemeshError, InvalidArgument, PeerBusy

__all__ = ["BUSY", "REFUSAL_MARK", "HandshakeAdmission", "encode_refusal", "refusal_error"]

#: The first bytes of a refusal (see :mod:`hivemesh.transports.stream_handshake`).
REFUSAL_MARK = b"\x00\x00"
#: The refusal code for "too many handshakes or channels: retry later".
BUSY = "busy"


def encode_refusal(code: str) -> bytes:
    """The wire bytes telling a dialler why it is refused (see the module docs)."""
    body = code.encode("ascii", "replace")[:255]
    return REFUSAL_MARK + bytes([len(body)]) + body


def refusal_error(code: str) -> HivemeshError:
    """The dialler's error for a refusal carrying ``code``."""
    if code == BUSY:
        return PeerBusy("the peer is busy (too many connections in progress); retry later")
    return HandshakeError(f"the peer refused the connection: {code!r}")


class HandshakeAdmission:
    """Admit inbound handshakes up to ``max_pending``, evicting as described above.

    Each source keeps its pending handshakes in order of last progress (an
    ordered dict; progress moves a handshake to the end), so choosing a
    victim costs one look at each source, not at each handshake.
    """

    def __init__(self, max_pending: int) -> None:
        if max_pending < 1:
            raise InvalidArgument("max_pending must be at least 1")
        self.max_pending = max_pending
        self._source: dict[Hashable, str] = {}
        self._progress: dict[Hashable, float] = {}
        self._by_source: dict[str, OrderedDict[Hashable, None]] = {}
        #: Handshakes evicted so far.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._source)

    def __contains__(self, key: object) -> bool:
        return key in self._source

    def admit(self, key: Hashable, source: str, now: float) -> Hashable | None:
        """Admit a new handshake; return the key of the one to evict, if any.

        The evicted handshake is already forgotten here: the caller closes it.
        """
        if key in self._source:
            raise InvalidArgument(f"handshake {key!r} is already pending")
        victim = None
        if len(self._source) >= self.max_pending:
            victim = self._victim(source)
            self.finish(victim)
            self.evicted += 1
        self._source[key] = source
        self._progress[key] = now
        self._by_source.setdefault(source, OrderedDict())[key] = None
        return victim

    def received(self, key: Hashable, message: int, now: float) -> None:
        """Handshake message ``message`` (0, 1, 2) arrived whole on ``key``:
        progress; after the last (2) it is past eviction (about to be a channel)."""
        if message == 2:
            self.finish(key)
        else:
            self.progress(key, now)

    def progress(self, key: Hashable, now: float) -> None:
        """A complete handshake message arrived on ``key``."""
        source = self._source.get(key)
        if source is not None:
            self._progress[key] = now
            self._by_source[source].move_to_end(key)

    def finish(self, key: Hashable) -> None:
        """``key`` is no longer pending (done, failed or evicted); idempotent."""
        source = self._source.pop(key, None)
        if source is None:
            return
        del self._progress[key]
        queue = self._by_source[source]
        del queue[key]
        if not queue:
            del self._by_source[source]

    def _victim(self, newcomer: str) -> Hashable:
        # The newcomer counts for its own source: a flood's next connection
        # evicts the flood's oldest one even when another source holds as many.
        best: tuple[int, float] | None = None
        victim: Hashable = None
        for source, queue in self._by_source.items():
            oldest = next(iter(queue))
            rank = (-(len(queue) + (source == newcomer)), self._progress[oldest])
            if best is None or rank < best:
                best, victim = rank, oldest
        return victim
