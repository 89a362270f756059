"""Transport statistics: per channel (frozen records) and per listener/dialer.

:class:`TransportCounters` is what ``hivemesh status`` shows for a listener
or a dialer: handshakes, refusals and every error by its
:attr:`~hivemesh.errors.HivemeshError.code`, plus the sum of the frame
counters of its open and closed channels. Channels keep their hot counters
as plain ints and the counters object reads them on demand, so the frame
path pays nothing for the aggregation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from hivemesh.errors import HivemeshError

__all__ = ["CHANNEL_FIELDS", "ChannelStatistics", "TransportCounters"]

#: Summable integer fields of :class:`ChannelStatistics`.
CHANNEL_FIELDS = (
    "frames_in",
    "frames_out",
    "bytes_in",
    "bytes_out",
    "records_in",
    "records_out",
    "frames_dropped",
    "send_waits",
    "send_would_block",
)


@dataclass(frozen=True)
class ChannelStatistics:
    """A snapshot of one channel.

    ``bytes_in``/``bytes_out`` count frame payload bytes (not headers or
    tags); ``records_*`` count encrypted records on the wire.
    ``frames_dropped`` counts frames that were accepted by ``send`` but never
    written, or received but never read, because the channel closed first.
    ``send_waits`` counts ``send`` calls that had to wait (backpressure);
    ``send_would_block`` counts ``send_nowait`` calls refused as full.
    ``errors`` maps an error code to how often it ended or hit this channel.
    """

    peer_address: str
    frames_in: int
    frames_out: int
    bytes_in: int
    bytes_out: int
    records_in: int
    records_out: int
    frames_dropped: int
    send_waits: int
    send_would_block: int
    send_queue_frames: int
    recv_queue_frames: int
    closed: bool
    close_reason: str | None
    errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


class _HasStatistics(Protocol):
    def statistics(self) -> ChannelStatistics: ...


class TransportCounters:
    """Counters for one listener or dialer, keyed by stable names.

    Names: ``handshakes_ok``, ``connections_accepted``, ``refused_busy``
    (told "busy": evicted or over the channel cap), ``handshakes_evicted``,
    ``channels_open``, ``channels_closed``, ``errors.<code>`` and the
    :data:`CHANNEL_FIELDS` summed over all channels ever attached.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._live: dict[int, _HasStatistics] = {}

    def incr(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        self._counts[name] = self._counts.get(name, 0) + n

    def record_error(self, exc: HivemeshError) -> None:
        """Count ``exc`` under ``errors.<code>``."""
        self.incr(f"errors.{exc.code}")

    def attach(self, channel: _HasStatistics) -> None:
        """Start reading ``channel``'s counters into snapshots."""
        self._live[id(channel)] = channel
        self.incr("channels_opened")

    def detach(self, channel: _HasStatistics) -> None:
        """Fold a closed channel's final counters into the totals."""
        if self._live.pop(id(channel), None) is None:
            return
        stats = channel.statistics()
        for name in CHANNEL_FIELDS:
            self.incr(name, getattr(stats, name))
        self.incr("channels_closed")

    def get(self, name: str) -> int:
        """One counter (live channels included)."""
        return self.snapshot().get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """Every counter, sorted by name, live channels included."""
        out = dict(self._counts)
        for name in CHANNEL_FIELDS:
            out.setdefault(name, 0)
        for channel in self._live.values():
            stats = channel.statistics()
            for name in CHANNEL_FIELDS:
                out[name] += getattr(stats, name)
        out["channels_open"] = len(self._live)
        return dict(sorted(out.items()))
