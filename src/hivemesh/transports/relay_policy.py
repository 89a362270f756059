"""What a relay admits and forwards, sans-IO: reservations, circuits, limits.

Theory of operation
-------------------
A node with the relay role keeps a :class:`RelayTable`. Every input names
the peer it came from by its *proven* address (the relay channel's Noise
identity), never by anything the peer claims, and carries ``now`` (seconds,
monotonic). Each method answers with a decision; the asyncio relay
(:mod:`hivemesh.transports.relay`) carries it out. Every refusal is counted
in :attr:`RelayTable.counters` under ``relay_refused_<code>``.

* ``reserve(peer)``: the peer becomes reachable through us, at most
  ``max_reservations`` peers.
* ``connect(src, src_cid, target, online=...)``: a circuit from ``src`` to a
  reserved ``target`` whose relay channel is up (``online``); at most
  ``max_circuits_per_peer`` per peer (either end) and ``max_circuits`` in
  all. Circuits are numbered per leg: ``src`` names its leg (below
  :data:`RELAY_CIRCUIT_BIT`), we name the target's (with that bit set), so
  ids a node picks and ids the relay picks never collide.
* ``data(src, cid, size, now)``: forward ``size`` bytes of a circuit to its
  other leg. Over ``max_data_bytes`` in one message is refused (the circuit
  closes: its end-to-end stream cannot skip bytes). Each source peer has a
  token bucket of ``bytes_per_s`` (burst ``burst_bytes``): the answer's
  ``delay_s`` says how long to hold the bytes first (shaping, counted
  ``relay_throttled``), so a busy peer slows down instead of losing data.
* ``punch(src, cid, claimed, candidates, now)``: forward hole-punch
  candidates to the other leg. Refused when ``claimed`` is not ``src``
  (``spoofed``), when the circuit is not ``src``'s (``foreign``), with more
  than ``max_candidates`` (``candidates``) or sooner than
  ``punch_interval_s`` after the last one on that circuit (``punch_rate``).
  :func:`punch_candidates` says what each end is told: the other end gets
  the sender's address as the relay observed it first, then the sender's
  own candidates (at most ``max_candidates``); the sender gets the other
  end's observed address.

The driver's inputs are ``link_up(peer, observed)``, ``receive(peer,
frame, now)`` and ``link_down(peer)``; each answers a :class:`Forward`: the
relay messages to send to which peers, after ``delay_s`` (shaping). The
methods above are the rules those inputs apply. A peer has one relay
channel: a new one replaces the old, whose circuits end with it (a peer's
circuits and reservation live no longer than the channel they were made on).

The relay reads nothing of the circuit's bytes: they are an end-to-end Noise
stream between the two ends, who prove their identities to each other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hivemesh.errors import DecodeError, InvalidArgument
from hivemesh.transports.relay_wire import Kind, Message, Punch, decode

__all__ = [
    "RELAY_CIRCUIT_BIT",
    "Circuit",
    "DataVerdict",
    "Forward",
    "RelayLimits",
    "RelayTable",
    "punch_candidates",
]

HostPort = tuple[str, int]
#: A message for one peer's relay channel.
Send = tuple[str, Message]

#: Circuit ids on one relay channel: the client numbers the circuits it opens
#: below this bit, the relay numbers incoming ones with it set, so the two
#: never collide on a node that both opens and accepts circuits.
RELAY_CIRCUIT_BIT = 1 << 31


@dataclass(frozen=True)
class RelayLimits:
    """Bounds of a relay (defaults: a modest node helping a few peers)."""

    max_reservations: int = 64
    max_circuits: int = 256
    max_circuits_per_peer: int = 8
    bytes_per_s: int = 16 << 20
    burst_bytes: int = 4 << 20
    max_data_bytes: int = 64 << 10
    max_candidates: int = 8
    punch_interval_s: float = 1.0

    def __post_init__(self) -> None:
        for name, value in sorted(vars(self).items()):
            if not value > 0:
                raise InvalidArgument(f"RelayLimits.{name} must be positive, got {value!r}")


@dataclass(slots=True)
class Circuit:
    """A circuit between ``a`` (who opened it, its id ``a_cid``) and ``b``."""

    a: str
    a_cid: int
    b: str
    b_cid: int
    bytes_forwarded: int = 0
    last_punch: float = float("-inf")

    def other(self, peer: str, cid: int) -> tuple[str, int]:
        """The other leg of the leg ``(peer, cid)``."""
        return (self.b, self.b_cid) if (peer, cid) == (self.a, self.a_cid) else (self.a, self.a_cid)


@dataclass(frozen=True, slots=True)
class DataVerdict:
    """Forward to ``(peer, cid)`` after ``delay_s``, or refuse with ``refused``
    (``oversize``: the circuit closed, and ``(peer, cid)`` is its other leg)."""

    peer: str = ""
    cid: int = 0
    delay_s: float = 0.0
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class Forward:
    """What the relay does for one input: wait ``delay_s``, then send ``sends``."""

    sends: tuple[Send, ...] = ()
    delay_s: float = 0.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass
class RelayTable:
    """The relay's state and rules (see the module docs)."""

    limits: RelayLimits = field(default_factory=RelayLimits)
    counters: Counter[str] = field(default_factory=Counter)
    reservations: set[str] = field(default_factory=set)
    #: Peers whose relay channel is up, and the address each is seen from.
    online: dict[str, HostPort | None] = field(default_factory=dict)
    _legs: dict[tuple[str, int], Circuit] = field(default_factory=dict)
    _next_cid: int = 1
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    # -- the driver's inputs: a relay channel up or down, a frame on it -------

    def link_up(self, peer: str, observed: HostPort | None) -> Forward:
        """``peer``'s relay channel is up, its bytes seen from ``observed``.
        One that replaces ``peer``'s previous channel ends that channel's
        circuits and reservation as :meth:`link_down` does (their other legs
        hear CLOSE ``replaced``; ``peer`` learns it as its old channel closes),
        counted ``relay_channels_replaced``."""
        sends: tuple[Send, ...] = ()
        if peer in self.online:
            self.counters["relay_channels_replaced"] += 1
            sends = self.link_down(peer, "replaced").sends
        self.online[peer] = observed
        if observed is not None:
            sends += ((peer, Message(Kind.OBSERVED, text=f"{observed[0]}:{observed[1]}")),)
        return Forward(sends)

    def link_down(self, peer: str, code: str = "peer_gone") -> Forward:
        """``peer``'s relay channel ended: its circuits' other legs hear CLOSE ``code``."""
        self.online.pop(peer, None)
        gone = self.drop_peer(peer)
        return Forward(tuple((o, Message(Kind.CLOSE, c, text=code)) for o, c in gone))

    def receive(self, peer: str, frame: bytes, now: float) -> Forward:
        """A frame from ``peer``'s relay channel: what to send, to whom."""
        try:
            msg = decode(frame)
        except DecodeError:
            self._refuse("malformed")
            return Forward()
        cid = msg.circuit
        if msg.kind == Kind.DATA:
            v = self.data(peer, cid, len(msg.data), now)
            if v.refused is None:
                return Forward(((v.peer, Message(Kind.DATA, v.cid, data=msg.data)),), v.delay_s)
            sends: tuple[Send, ...] = ((peer, Message(Kind.CLOSE, cid, text=v.refused)),)
            if v.peer:  # an oversize circuit closed: its other leg hears it too
                sends += ((v.peer, Message(Kind.CLOSE, v.cid, text=v.refused)),)
            return Forward(sends)
        if msg.kind == Kind.RESERVE:
            code = self.reserve(peer)
            return Forward(
                ((peer, Message(Kind.RESERVED if code is None else Kind.REFUSED, text=code or "")),)
            )
        if msg.kind == Kind.CONNECT:
            code, circuit = self.connect(peer, cid, msg.text, online=msg.text in self.online)
            if circuit is None:
                return Forward(((peer, Message(Kind.REFUSED, cid, text=code or "?")),))
            incoming = Message(Kind.INCOMING, circuit.b_cid, text=peer)
            return Forward(((circuit.b, incoming), (peer, Message(Kind.CONNECTED, cid))))
        if msg.kind == Kind.CLOSE:
            other = self.close(peer, cid)
            return Forward(
                () if other is None else ((other[0], Message(Kind.CLOSE, other[1], text=msg.text)),)
            )
        if msg.kind == Kind.PUNCH and msg.punch is not None:
            return self._forward_punch(peer, cid, msg.punch, now)
        self.counters["relay_refused_unexpected"] += 1
        return Forward()

    def _forward_punch(self, peer: str, cid: int, punch: Punch, now: float) -> Forward:
        code, (other, ocid) = self.punch(peer, cid, punch.claimed, len(punch.candidates), now)
        if code is not None:
            return Forward(((peer, Message(Kind.REFUSED, cid, text=code)),))
        mine, theirs = self.online.get(peer), self.online.get(other)
        forward, back = punch_candidates(mine, punch.candidates, theirs, self.limits.max_candidates)
        return Forward(
            (
                (other, Message(Kind.PUNCH, ocid, punch=Punch(peer, forward))),
                (peer, Message(Kind.PUNCH, cid, punch=Punch(other, back))),
            )
        )

    # -- the rules -------------------------------------------------------------

    def _refuse(self, code: str) -> str:
        self.counters[f"relay_refused_{code}"] += 1
        return code

    def circuit(self, peer: str, cid: int) -> Circuit | None:
        """The circuit whose leg ``(peer, cid)`` is, if open."""
        return self._legs.get((peer, cid))

    def reserve(self, peer: str) -> str | None:
        """Make ``peer`` reachable; ``None`` or the refusal code."""
        if peer not in self.reservations and len(self.reservations) >= self.limits.max_reservations:
            return self._refuse("reservations")
        self.reservations.add(peer)
        self.counters["relay_reservations"] += 1
        return None

    def connect(
        self, src: str, src_cid: int, target: str, *, online: bool = True
    ) -> tuple[str | None, Circuit | None]:
        """Open a circuit ``src -> target`` (``online``: its relay channel is
        up): ``(None, circuit)`` or ``(code, None)``."""
        if target == src or target not in self.reservations or not online:
            return self._refuse("no_reservation"), None
        if (src, src_cid) in self._legs or not 0 < src_cid < RELAY_CIRCUIT_BIT:
            return self._refuse("bad_circuit"), None
        if len(self._legs) // 2 >= self.limits.max_circuits:
            return self._refuse("circuits"), None
        per = self.limits.max_circuits_per_peer
        if self._count(src) >= per or self._count(target) >= per:
            return self._refuse("circuits_per_peer"), None
        b_cid = RELAY_CIRCUIT_BIT | self._next_cid  # never a number a client picks
        self._next_cid = self._next_cid % (RELAY_CIRCUIT_BIT - 1) + 1
        circuit = Circuit(src, src_cid, target, b_cid)
        self._legs[(src, src_cid)] = circuit
        self._legs[(target, b_cid)] = circuit
        self.counters["relay_circuits_opened"] += 1
        return None, circuit

    def _count(self, peer: str) -> int:
        return sum(1 for (p, _) in self._legs if p == peer)

    def data(self, src: str, cid: int, size: int, now: float) -> DataVerdict:
        """Where ``size`` bytes on leg ``(src, cid)`` go, and after what delay."""
        circuit = self._legs.get((src, cid))
        if circuit is None:
            return DataVerdict(refused=self._refuse("unknown_circuit"))
        if size > self.limits.max_data_bytes:  # both legs close: tell the other one too
            peer, other = self.close(src, cid) or ("", 0)
            return DataVerdict(peer, other, refused=self._refuse("oversize"))
        bucket = self._buckets.get(src)
        if bucket is None:
            bucket = self._buckets[src] = _Bucket(float(self.limits.burst_bytes), now)
        rate, burst = self.limits.bytes_per_s, self.limits.burst_bytes
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        bucket.tokens -= size
        delay = 0.0 if bucket.tokens >= 0 else -bucket.tokens / rate
        if delay:
            self.counters["relay_throttled"] += 1
        circuit.bytes_forwarded += size
        self.counters["relay_bytes"] += size
        self.counters["relay_messages"] += 1
        peer, other = circuit.other(src, cid)
        return DataVerdict(peer, other, delay)

    def punch(
        self, src: str, cid: int, claimed: str, candidates: int, now: float
    ) -> tuple[str | None, tuple[str, int]]:
        """Whether to forward a PUNCH, and to which leg."""
        if claimed != src:
            return self._refuse("spoofed"), ("", 0)
        circuit = self._legs.get((src, cid))
        if circuit is None:
            return self._refuse("foreign"), ("", 0)
        if candidates > self.limits.max_candidates:
            return self._refuse("candidates"), ("", 0)
        if now - circuit.last_punch < self.limits.punch_interval_s:
            return self._refuse("punch_rate"), ("", 0)
        circuit.last_punch = now
        self.counters["relay_punches"] += 1
        return None, circuit.other(src, cid)

    def close(self, src: str, cid: int) -> tuple[str, int] | None:
        """Close the circuit of leg ``(src, cid)``; the other leg to notify, if any."""
        circuit = self._legs.pop((src, cid), None)
        if circuit is None:
            return None
        other = circuit.other(src, cid)
        self._legs.pop(other, None)
        self.counters["relay_circuits_closed"] += 1
        return other

    def drop_peer(self, peer: str) -> list[tuple[str, int]]:
        """``peer``'s relay channel ended: forget its reservation and circuits;
        the other legs to notify."""
        self.reservations.discard(peer)
        self._buckets.pop(peer, None)
        return [o for (p, cid) in sorted(self._legs) if p == peer and (o := self.close(p, cid))]


def punch_candidates(
    mine: HostPort | None,
    given: tuple[HostPort, ...],
    theirs: HostPort | None,
    max_candidates: int,
) -> tuple[tuple[HostPort, ...], tuple[HostPort, ...]]:
    """``(to the other end, back to the sender)`` for a PUNCH whose sender
    the relay sees at ``mine`` and the other end at ``theirs`` (module docs)."""
    forward = ((mine,) if mine else ()) + tuple(c for c in given if c != mine)
    return forward[:max_candidates], ((theirs,) if theirs else ())
