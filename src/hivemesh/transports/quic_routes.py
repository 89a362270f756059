"""Which QUIC connection a datagram is for, and whether a new one may open, sans-IO.

Theory of operation
-------------------
A node's one UDP socket carries QUIC and other datagrams (STUN answers,
hole-punch primers). :class:`QuicRoutes` sorts each datagram, as a QUIC
server does, by its destination connection id:

* a datagram whose first byte has the QUIC fixed bit (0x40) clear is not
  QUIC (:attr:`Route.other`; unclaimed, it is counted ``udp_non_quic``);
* a header that does not parse is ``udp_malformed``;
* an id we issued routes to its connection (:attr:`Route.conn`);
* an Initial of at least 1,200 bytes (RFC 9000, 14.1) from an unknown id
  may open an inbound connection (:attr:`Route.open_cid`), unless
  ``max_pending`` inbound connections have no channel yet or
  ``max_channels`` connections are open (``refused_busy``);
* anything else is ``udp_unknown_connection``.

Connections are any hashable the driver picks; it registers the ids each
connection issues and retires, says when an inbound one got its channel
(:meth:`QuicRoutes.established`) and when one ended.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from aioquic._buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header

__all__ = ["MIN_INITIAL_BYTES", "QuicRoutes", "Route"]

#: Smallest datagram that may open a connection (RFC 9000, 14.1).
MIN_INITIAL_BYTES = 1200
#: Length of the connection ids we issue (aioquic's default).
HOST_CID_BYTES = 8
C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Route(Generic[C]):
    """Where a datagram goes: to ``conn``; to a new inbound connection whose
    original destination id is ``open_cid``; to the non-QUIC handler
    (``other``); or nowhere, counted as ``drop``."""

    conn: C | None = None
    open_cid: bytes | None = None
    other: bool = False
    drop: str | None = None


class QuicRoutes(Generic[C]):
    """Connection ids to connections, and inbound admission (module docs)."""

    def __init__(self, *, max_pending: int, max_channels: int) -> None:
        self.max_pending = max_pending
        self.max_channels = max_channels
        self._by_cid: dict[bytes, C] = {}
        self._cids: dict[C, set[bytes]] = {}
        self._pending: set[C] = set()

    def __len__(self) -> int:
        return len(self._cids)

    def connections(self) -> list[C]:
        """Every connection not ended."""
        return list(self._cids)

    @property
    def full(self) -> bool:
        """Whether ``max_channels`` connections are open (no dial, no accept)."""
        return len(self._cids) >= self.max_channels

    def route(self, data: bytes) -> Route[C]:
        """Where ``data``, one datagram, goes (module docs)."""
        if not data or not data[0] & 0x40:
            return Route(other=bool(data), drop="udp_non_quic")
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=HOST_CID_BYTES)
        except ValueError:
            return Route(drop="udp_malformed")
        conn = self._by_cid.get(header.destination_cid)
        if conn is not None:
            return Route(conn)
        if header.packet_type != QuicPacketType.INITIAL or len(data) < MIN_INITIAL_BYTES:
            return Route(drop="udp_unknown_connection")
        if len(self._pending) >= self.max_pending or self.full:
            return Route(drop="refused_busy")
        return Route(open_cid=header.destination_cid)

    def add(self, conn: C, cid: bytes, *, inbound: bool = False) -> None:
        """``conn`` answers to ``cid`` (``inbound``: it has no channel yet)."""
        self._cids.setdefault(conn, set()).add(cid)
        self._by_cid[cid] = conn
        if inbound:
            self._pending.add(conn)

    def retire(self, conn: C, cid: bytes) -> None:
        """``conn`` no longer answers to ``cid``."""
        self._cids.get(conn, set()).discard(cid)
        if self._by_cid.get(cid) == conn:
            del self._by_cid[cid]

    def established(self, conn: C) -> None:
        """An inbound ``conn`` got its channel: no longer a pending handshake."""
        self._pending.discard(conn)

    def remove(self, conn: C) -> None:
        """``conn`` ended: forget it and its ids."""
        self._pending.discard(conn)
        for cid in self._cids.pop(conn, ()):
            if self._by_cid.get(cid) == conn:
                del self._by_cid[cid]
