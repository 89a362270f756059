"""A relay client's side of its relay channel, sans-IO: circuits, reservation, output.

Theory of operation
-------------------
A node that uses a relay keeps one :class:`ClientCircuits` per relay
channel (the relay's own side is :class:`~hivemesh.transports.relay_policy.RelayTable`).
The asyncio client (:mod:`hivemesh.transports.relay`) feeds it every frame
of the relay channel (:meth:`ClientCircuits.receive`) and carries out what
it answers, and takes the frames to send from it in order
(:meth:`ClientCircuits.take`) as the channel has room.

* **Inputs.** A frame is decoded and checked here: a malformed one is
  counted ``relay_malformed``; DATA for no connected circuit
  ``relay_data_unknown_circuit``; a PUNCH whose claimed sender is not the
  circuit's other end ``punch_refused_spoofed``; a REFUSED is counted
  ``relay_refused_<code>``; anything else out of place ``relay_unexpected``.
  What is left becomes one :class:`Event` for the driver.
* **Outputs.** One queue of frames, in the order they were asked for:
  RESERVE, CONNECT, PUNCH, a circuit's DATA (cut into
  :data:`~hivemesh.transports.relay_wire.DATA_CHUNK_BYTES` pieces) and its
  CLOSE, which so always follows what that end wrote. :meth:`buffered`
  says how many bytes of a circuit wait in it (its pipe's write buffer).
* **Ends.** A circuit ends by our close (CLOSE queued after its data), by
  the relay's CLOSE, or with the relay channel (:meth:`channel_ended`);
  then its queued DATA is dropped and it is forgotten.

Circuit ids we pick are below the relay's
:data:`~hivemesh.transports.relay_policy.RELAY_CIRCUIT_BIT`; the relay
numbers incoming circuits with it set.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from hivemesh.errors import DecodeError
from hivemesh.transports.relay_wire import (
    Kind,
    Message,
    Punch,
    data_frames,
    decode,
    encode,
    parse_hostport,
)
from hivemesh.transports.stats import TransportCounters

__all__ = ["ClientCircuits", "Event", "Happened"]

HostPort = tuple[str, int]


class Happened(enum.Enum):
    """What a relay frame means to the driver (:class:`Event`)."""

    DATA = "data"  # bytes of ``cid`` for its pipe
    OBSERVED = "observed"  # the relay sees us at ``addr``
    RESERVED = "reserved"  # the reservation answer (:attr:`ClientCircuits.reserved`)
    CONNECTED = "connected"  # the circuit ``cid`` we opened is up
    REFUSED = "refused"  # opening ``cid`` was refused (``text``: the code)
    INCOMING = "incoming"  # ``text`` opened circuit ``cid`` to us
    ENDED = "ended"  # the relay closed ``cid`` (``text``: the code)
    PUNCH = "punch"  # ``text`` (``cid``'s other end) offers ``candidates``


@dataclass(frozen=True, slots=True)
class Event:
    """One thing the driver acts on (see :class:`Happened`)."""

    what: Happened
    cid: int = 0
    text: str = ""
    data: bytes = b""
    addr: HostPort | None = None
    candidates: tuple[HostPort, ...] = ()


@dataclass(eq=False, slots=True)
class _Circuit:
    peer: str
    connected: bool  # CONNECTED came (ours) or INCOMING did (theirs)
    queued: int = 0  # bytes of its DATA not taken yet


class ClientCircuits:
    """The circuits on one relay channel, seen from a client (module docs)."""

    def __init__(self, address: str, counters: TransportCounters | None = None) -> None:
        #: Our own address (what our PUNCH messages claim).
        self.address = address
        self.counters = counters if counters is not None else TransportCounters()
        #: Whether the relay granted our reservation (others may reach us).
        self.reserved = False
        self._circuits: dict[int, _Circuit] = {}
        self._out: deque[tuple[int, bytes]] = deque()
        self._next_cid = 1

    # -- commands --------------------------------------------------------------

    def reserve(self) -> None:
        """Ask (again) to be reachable through the relay."""
        self._out.append((0, encode(Message(Kind.RESERVE))))

    def open(self, target: str) -> int:
        """Open a circuit to ``target``; its id (CONNECTED or REFUSED follows)."""
        cid, self._next_cid = self._next_cid, self._next_cid + 1
        self._circuits[cid] = _Circuit(target, connected=False)
        self._out.append((0, encode(Message(Kind.CONNECT, cid, text=target))))
        return cid

    def punch(self, cid: int, candidates: tuple[HostPort, ...]) -> None:
        """Offer our ``candidates`` to the other end of circuit ``cid``."""
        punch = Punch(self.address, candidates)
        self._out.append((0, encode(Message(Kind.PUNCH, cid, punch=punch))))

    def send(self, cid: int, data: bytes) -> None:
        """Queue ``data`` on circuit ``cid`` (nothing once it ended)."""
        circuit = self._circuits.get(cid)
        if circuit is None:
            return
        for frame in data_frames(cid, data):
            self._out.append((cid, frame))
            circuit.queued += len(frame)

    def close(self, cid: int) -> bool:
        """Our end of ``cid`` closed: CLOSE follows its queued data. False if
        it had already ended."""
        if self._circuits.pop(cid, None) is None:
            return False
        self._out.append((0, encode(Message(Kind.CLOSE, cid, text="normal"))))
        return True

    def channel_ended(self) -> list[int]:
        """The relay channel ended: every circuit with it (their ids), and
        the reservation; nothing queued is sent."""
        ended = sorted(self._circuits)
        self._circuits.clear()
        self._out.clear()
        self.reserved = False
        return ended

    # -- output ---------------------------------------------------------------

    def take(self) -> tuple[int, bytes] | None:
        """The next frame to send and the circuit whose buffer it leaves (0:
        none), or ``None`` if nothing is queued."""
        if not self._out:
            return None
        cid, frame = self._out.popleft()
        circuit = self._circuits.get(cid) if cid else None
        if circuit is not None:
            circuit.queued -= len(frame)
        return cid, frame

    def buffered(self, cid: int) -> int:
        """Bytes of circuit ``cid`` queued and not taken yet."""
        circuit = self._circuits.get(cid)
        return 0 if circuit is None else circuit.queued

    def circuit_of(self, peer: str) -> int | None:
        """The id of an open circuit with ``peer``, if any."""
        return next((cid for cid, c in sorted(self._circuits.items()) if c.peer == peer), None)

    def accepted(self, cid: int, address: str) -> bool:
        """Whether the end-to-end handshake on incoming circuit ``cid`` proved
        the address the relay named in INCOMING (else ``relay_source_mismatch``:
        the relay named someone else; a circuit that ended meanwhile is not)."""
        circuit = self._circuits.get(cid)
        if circuit is None or circuit.peer == address:
            return circuit is not None
        self.counters.incr("relay_source_mismatch")
        return False

    def is_open(self, cid: int) -> bool:
        """Whether circuit ``cid`` has not ended."""
        return cid in self._circuits

    # -- input ----------------------------------------------------------------

    def receive(self, frame: bytes) -> Event | None:
        """A frame from the relay: what the driver does, if anything (module docs)."""
        try:
            msg = decode(frame)
        except DecodeError:
            self.counters.incr("relay_malformed")
            return None
        kind, cid = msg.kind, msg.circuit
        circuit = self._circuits.get(cid) if cid else None
        if kind == Kind.DATA:
            if circuit is not None and circuit.connected:
                return Event(Happened.DATA, cid, data=msg.data)
            self.counters.incr("relay_data_unknown_circuit")
        elif kind == Kind.OBSERVED:
            try:
                return Event(Happened.OBSERVED, addr=parse_hostport(msg.text))
            except DecodeError:
                self.counters.incr("relay_malformed")
        elif kind in (Kind.RESERVED, Kind.REFUSED) and cid == 0:
            self.reserved = kind == Kind.RESERVED
            if not self.reserved:
                self.counters.incr(f"relay_refused_{msg.text}")
            return Event(Happened.RESERVED)
        elif kind == Kind.CONNECTED and circuit is not None and not circuit.connected:
            circuit.connected = True
            return Event(Happened.CONNECTED, cid)
        elif kind == Kind.REFUSED and circuit is not None:
            self.counters.incr(f"relay_refused_{msg.text}")
            # a refused CONNECT; a refused PUNCH leaves the circuit open
            return Event(Happened.REFUSED, cid, text=msg.text)
        elif kind == Kind.INCOMING and cid and cid not in self._circuits:
            self._circuits[cid] = _Circuit(msg.text, connected=True)
            return Event(Happened.INCOMING, cid, text=msg.text)
        elif kind == Kind.CLOSE and circuit is not None:
            del self._circuits[cid]
            self._out = deque(item for item in self._out if item[0] != cid)
            return Event(Happened.ENDED, cid, text=msg.text)
        elif kind == Kind.PUNCH and circuit is not None and msg.punch is not None:
            if msg.punch.claimed == circuit.peer:
                return Event(Happened.PUNCH, cid, circuit.peer, candidates=msg.punch.candidates)
            self.counters.incr("punch_refused_spoofed")
        else:
            self.counters.incr("relay_unexpected")
        return None
