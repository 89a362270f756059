"""Acknowledged direct messages between nodes, with one-hop relaying.

Theory of operation
-------------------
:class:`Direct` rides on a core :class:`~hivemesh.core.node.Node` (it
registers the ``DIRECT``/``DIRECT_ACK`` frame handlers and sends through
:meth:`Node.send`). It is sans-IO like the node: time comes in as ``now_ms``,
randomness from the injected ``Random``.

**Sending.** :meth:`Direct.send` queues a msgpack value for an address and
returns its ``msg_id`` = ``"<boot>-<counter>"``: ``boot`` is 48 bits drawn
once from the injected rng (so ids from a restarted sender do not collide
with its previous life), ``counter`` counts up; no uuid4. The message is
(re)transmitted with exponential backoff (``retry_initial_ms`` doubling up
to ``retry_max_ms``) until a ``DIRECT_ACK`` arrives, giving a
:class:`DirectAcked` result, or until its deadline, giving a
:class:`DirectFailed` result (``reason`` ``"deadline"``, or ``"no_route"`` if
no route ever existed). Delivery is therefore at-least-once on the wire and
exactly-once into the inbox (see dedup below) while the receiver's dedup
memory holds the id.

**Routing** is deliberately simple. If the destination is one of the node's
peers, the message goes straight to it. Otherwise it goes to one relay, a
peer chosen from ``relays(destination)`` (by default every peer; the runtime
passes "peers that membership reports up"), a different one on each
retransmission, with a hop budget of ``max_hops`` (1: one relay). A relay
forwards to the destination if it is its peer and drops it otherwise
(counted ``unroutable``); the ack returns the same way. When a link comes
up (:meth:`Direct.link_up`: a first link, a reconnect, or a peer that
restarted behind a half-open link), messages for that peer, those whose
last attempt went through it and those that had no route are sent again at
once with a fresh backoff instead of waiting out theirs (counted
``resent_on_link_up``).

**Who sent it.** A message received *directly* must name its transport
peer as sender (the channel is bound to the peer's key), else
:class:`~hivemesh.errors.ForgedSender`. A relay is not taken at its word: a
message routed through one carries the sender's Ed25519 signature over
``(msg_id, sender, destination, data)``, and its ack the destination's
signature over ``(msg_id, sender, destination)``; a relayed message or ack
without a valid signature is refused (``ForgedSender``, counted), so a
relay can drop or delay traffic but neither forge a message nor fake its
acknowledgement. Direct hops need no signature and carry none. With an
``admit(address)`` policy, a relayed message from a sender it refuses (a
node that reached us through a member of two swarms, say) is refused
(:class:`~hivemesh.errors.UntrustedAuthor`, counted) and not acknowledged.

**Receiving.** A message for us is deduplicated by ``(sender, msg_id)`` (a
bounded memory, entries kept ``dedup_ttl_ms``); a duplicate is acked again
(the first ack may have been lost) but not stored twice. New messages go to
a bounded inbox. A full inbox is backpressure, not loss: the message is
neither stored nor acked (counted ``inbox_full``), so the sender retries
until the application drains the inbox or the deadline passes.

**Acked when stored.** With ``DirectConfig.ack_when_stored`` the ack waits
until the application says the message is durable: it takes messages with
:meth:`Direct.drain_inbox`, stores them, then calls :meth:`Direct.stored`
(the acks go out) or, when storing failed, :meth:`Direct.release` (the
message is forgotten, so its retransmission is taken as new). Meanwhile a
retransmission is neither stored again nor acked (counted
``duplicate_unstored``). So an acknowledged message is one the receiver
has stored, and an application that cannot keep up withholds acks.

Wire frames: ``DIRECT`` (20) ``msg_id, sender, destination, data, hops[, sig]``;
``DIRECT_ACK`` (21) ``msg_id, sender, destination, hops[, sig]`` (``sender``
is the original sender the ack travels back to; ``sig`` is present on relayed
routes).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING, Any

from hivemesh.core.codec import pack
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.identity import public_key_of, verify
from hivemesh.core.pex import check_address
from hivemesh.errors import (
    DecodeError,
    ForgedSender,
    FrameTooLarge,
    InvalidArgument,
    QueueFull,
    UntrustedAuthor,
)

if TYPE_CHECKING:
    from hivemesh.core.node import Node

__all__ = [
    "Direct",
    "DirectAcked",
    "DirectConfig",
    "DirectFailed",
    "DirectResult",
    "InboxMessage",
]

_MAX_ID_CHARS = 64
_MSG_DOMAIN = b"hivemesh/direct/v1"
_ACK_DOMAIN = b"hivemesh/direct-ack/v1"


def _msg_digest(msg_id: str, sender: str, dest: str, data: Any) -> bytes:
    return _MSG_DOMAIN + pack([msg_id, sender, dest, data])


def _ack_digest(msg_id: str, sender: str, dest: str) -> bytes:
    return _ACK_DOMAIN + pack([msg_id, sender, dest])


def _signed_by(address: str, sig: Any, message: bytes) -> bool:
    return type(sig) is bytes and verify(public_key_of(address), sig, message)


@dataclass(frozen=True, slots=True)
class DirectConfig:
    """Direct-message tuning. Units are in the names."""

    retry_initial_ms: int = 250
    retry_max_ms: int = 4000
    deadline_ms: int = 30_000
    max_data_bytes: int = 256 * 1024
    max_pending: int = 1024
    inbox_capacity: int = 10_000
    dedup_capacity: int = 65_536
    dedup_ttl_ms: int = 120_000
    max_hops: int = 1
    #: Ack only once the application stored the message (see module docs).
    ack_when_stored: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.retry_initial_ms <= self.retry_max_ms:
            raise InvalidArgument("need 0 < retry_initial_ms <= retry_max_ms")
        if self.deadline_ms <= 0 or self.max_pending <= 0 or self.inbox_capacity <= 0:
            raise InvalidArgument("deadline, pending and inbox bounds must be > 0")
        if not 0 <= self.max_hops <= 4:
            raise InvalidArgument("max_hops must be 0..4")


@dataclass(frozen=True, slots=True)
class InboxMessage:
    """A message delivered to this node (``relayed_by`` is None when direct)."""

    sender: str
    msg_id: str
    data: Any
    received_ms: int
    relayed_by: str | None


@dataclass(frozen=True, slots=True)
class DirectAcked:
    """The destination acknowledged ``msg_id``."""

    msg_id: str
    to: str
    attempts: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class DirectFailed:
    """``msg_id`` was not acknowledged before its deadline."""

    msg_id: str
    to: str
    attempts: int
    at_ms: int
    reason: str


DirectResult = DirectAcked | DirectFailed


@dataclass(slots=True)
class _Pending:
    msg_id: str
    to: str
    data: Any
    deadline_at_ms: int
    next_at_ms: int
    rto_ms: int
    salt: int
    attempts: int = 0
    routed: bool = False
    hop: str | None = None  # where the last attempt went (None: no route)
    sig: bytes | None = None  # made on the first relayed attempt


class Direct:
    """Acknowledged direct messaging on top of a core node."""

    def __init__(
        self,
        node: Node,
        rng: Random,
        config: DirectConfig | None = None,
        *,
        relays: Callable[[str], list[str]] | None = None,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        self.node = node
        self.address = node.address
        self._admit = admit
        self.rng = rng
        self.config = config or DirectConfig()
        self.counters: Counter[str] = Counter()
        self._relays = relays
        self._boot = rng.getrandbits(48)
        self._counter = 0
        self._pending: dict[str, _Pending] = {}
        self._results: list[DirectResult] = []
        self._inbox: deque[InboxMessage] = deque()
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()
        #: Acks withheld until the application stored the message: key -> (peer, frame).
        self._unacked: dict[tuple[str, str], tuple[str, bytes]] = {}
        node.register_handler(FrameType.DIRECT, self._on_direct)
        node.register_handler(FrameType.DIRECT_ACK, self._on_ack)

    # -- sender side -----------------------------------------------------------------

    def send(self, to: str, data: Any, now_ms: int, *, deadline_ms: int | None = None) -> str:
        """Queue ``data`` (a msgpack value) for ``to``; returns the message id.

        Raises :class:`InvalidArgument` for a bad address, self, unencodable
        or oversize data, and :class:`QueueFull` when ``max_pending`` messages
        are already awaiting acknowledgement.
        """
        try:
            check_address(to, "destination")
        except DecodeError as exc:
            raise InvalidArgument(str(exc)) from None
        if to == self.address:
            raise InvalidArgument("cannot send a direct message to ourselves")
        try:
            size = len(pack(data))
        except ValueError as exc:
            raise InvalidArgument(f"data is not msgpack-encodable: {exc}") from None
        if size > self.config.max_data_bytes:
            raise InvalidArgument(f"data is {size} bytes, limit {self.config.max_data_bytes}")
        if len(self._pending) >= self.config.max_pending:
            self.counters["send_queue_full"] += 1
            raise QueueFull(f"{len(self._pending)} direct messages await acknowledgement")
        self._counter += 1
        msg_id = f"{self._boot:012x}-{self._counter}"
        ttl = self.config.deadline_ms if deadline_ms is None else deadline_ms
        salt = self.rng.randrange(1 << 16)
        p = _Pending(msg_id, to, data, now_ms + ttl, now_ms, self.config.retry_initial_ms, salt)
        self._pending[msg_id] = p
        self._transmit(p, now_ms)
        return msg_id

    def pending(self) -> int:
        """Messages awaiting acknowledgement."""
        return len(self._pending)

    def link_up(self, peer: str, now_ms: int) -> int:
        """A link to ``peer`` came up: retransmit now, with a fresh backoff,
        every pending message for ``peer``, or last sent through it, or that
        had no route (see the module docs). Returns how many were sent again."""
        n = 0
        for msg_id in sorted(self._pending):
            p = self._pending[msg_id]
            if (p.to == peer or p.hop in (None, peer)) and now_ms < p.deadline_at_ms:
                p.rto_ms = self.config.retry_initial_ms
                self._transmit(p, now_ms)
                n += 1
        self.counters["resent_on_link_up"] += n
        return n

    def results(self) -> list[DirectResult]:
        """Acked/failed outcomes since the last call, in order (drains)."""
        out, self._results = self._results, []
        return out

    def _transmit(self, p: _Pending, now_ms: int) -> None:
        p.attempts += 1
        p.next_at_ms = now_ms + p.rto_ms
        p.rto_ms = min(p.rto_ms * 2, self.config.retry_max_ms)
        hop = p.hop = self._route(p.to, p.salt + p.attempts)
        if hop is None:
            self.counters["no_route"] += 1
            return
        p.routed = True
        if hop == p.to:
            frame = encode_frame(FrameType.DIRECT, p.msg_id, self.address, p.to, p.data, 0)
        else:
            if p.sig is None:
                p.sig = self.node.identity.sign(_msg_digest(p.msg_id, self.address, p.to, p.data))
            frame = encode_frame(
                FrameType.DIRECT, p.msg_id, self.address, p.to, p.data, self.config.max_hops, p.sig
            )
        self.node.send(hop, frame)

    def _route(self, to: str, turn: int) -> str | None:
        peers = self.node.peers
        if to in peers:
            return to
        if self.config.max_hops < 1:
            return None
        candidates = peers if self._relays is None else self._relays(to)
        candidates = sorted(c for c in candidates if c in peers and c != to)
        if not candidates:
            return None
        # A different relay on each attempt, starting at a random one.
        return candidates[turn % len(candidates)]

    # -- receiver side -----------------------------------------------------------------

    def inbox(self) -> list[InboxMessage]:
        """Messages delivered and not yet drained, oldest first."""
        return list(self._inbox)

    def drain_inbox(self, limit: int | None = None) -> list[InboxMessage]:
        """Remove and return up to ``limit`` (default all) inbox messages."""
        n = len(self._inbox) if limit is None else min(limit, len(self._inbox))
        return [self._inbox.popleft() for _ in range(n)]

    def stored(self, messages: list[InboxMessage]) -> None:
        """``messages`` (drained) are durable: send their withheld acks."""
        for m in messages:
            got = self._unacked.pop((m.sender, m.msg_id), None)
            if got is not None:
                self.node.send(*got)

    def release(self, messages: list[InboxMessage]) -> None:
        """Storing ``messages`` (drained) failed: forget them unacked, so the
        sender's retransmission is taken as a new message."""
        for m in messages:
            key = (m.sender, m.msg_id)
            if self._unacked.pop(key, None) is not None:
                self._seen.pop(key, None)
                self.counters["released"] += 1

    def _on_direct(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) not in (5, 6):
            raise DecodeError("DIRECT takes msg_id, sender, destination, data, hops[, sig]")
        msg_id, sender, dest, data, hops = fields[:5]
        sig = fields[5] if len(fields) == 6 else None
        self._check_id(msg_id)
        check_address(sender, "DIRECT sender")
        check_address(dest, "DIRECT destination")
        if type(hops) is not int or not 0 <= hops <= 4:
            raise DecodeError("DIRECT hops must be 0..4")
        if len(pack(data)) > self.config.max_data_bytes:
            raise FrameTooLarge("DIRECT data over the size limit")
        if dest != self.address:
            tail = () if sig is None else (sig,)
            frame = encode_frame(FrameType.DIRECT, msg_id, sender, dest, data, hops - 1, *tail)
            self._relay(peer, dest, hops, frame)
            return
        relayed_by: str | None = None
        if sender != peer:
            if self.config.max_hops < 1:
                raise ForgedSender(f"direct message from {peer[:12]} claims sender {sender[:12]}")
            if not _signed_by(sender, sig, _msg_digest(msg_id, sender, dest, data)):
                raise ForgedSender(
                    f"message relayed by {peer[:12]} lacks a valid signature of {sender[:12]}"
                )
            if self._admit is not None and not self._admit(sender):
                raise UntrustedAuthor(f"message relayed by {peer[:12]} from {sender[:12]}")
            relayed_by = peer
        key = (sender, msg_id)
        if key in self._unacked:  # not stored yet: its ack comes when it is
            self.counters["duplicate_unstored"] += 1
            return
        if key in self._seen:
            self.counters["duplicate"] += 1
        elif len(self._inbox) >= self.config.inbox_capacity:
            self.counters["inbox_full"] += 1
            return  # no ack: the sender retries (backpressure, not loss)
        else:
            self._remember(key, now_ms)
            self._inbox.append(InboxMessage(sender, msg_id, data, now_ms, relayed_by))
            self.counters["delivered"] += 1
            if self.config.ack_when_stored:
                self._unacked[key] = (peer, self._ack_frame(msg_id, sender, relayed_by))
                return
        self.node.send(peer, self._ack_frame(msg_id, sender, relayed_by))

    def _ack_frame(self, msg_id: str, sender: str, relayed_by: str | None) -> bytes:
        if relayed_by is None:
            return encode_frame(FrameType.DIRECT_ACK, msg_id, sender, self.address, 0)
        ack_sig = self.node.identity.sign(_ack_digest(msg_id, sender, self.address))
        return encode_frame(
            FrameType.DIRECT_ACK, msg_id, sender, self.address, self.config.max_hops, ack_sig
        )

    def _on_ack(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) not in (4, 5):
            raise DecodeError("DIRECT_ACK takes msg_id, sender, destination, hops[, sig]")
        msg_id, sender, dest, hops = fields[:4]
        sig = fields[4] if len(fields) == 5 else None
        self._check_id(msg_id)
        check_address(sender, "DIRECT_ACK sender")
        check_address(dest, "DIRECT_ACK destination")
        if type(hops) is not int or not 0 <= hops <= 4:
            raise DecodeError("DIRECT_ACK hops must be 0..4")
        if sender != self.address:
            tail = () if sig is None else (sig,)
            frame = encode_frame(FrameType.DIRECT_ACK, msg_id, sender, dest, hops - 1, *tail)
            self._relay(peer, sender, hops, frame)
            return
        p = self._pending.get(msg_id)
        if p is None or p.to != dest:
            self.counters["stale_ack"] += 1
            return
        if peer != dest and not _signed_by(dest, sig, _ack_digest(msg_id, sender, dest)):
            raise ForgedSender(f"ack relayed by {peer[:12]} lacks a valid signature of {dest[:12]}")
        del self._pending[msg_id]
        self._results.append(DirectAcked(msg_id, p.to, p.attempts, now_ms))
        self.counters["acked"] += 1

    def _relay(self, peer: str, to: str, hops: int, frame: bytes) -> None:
        if hops < 1:
            self.counters["hop_limit"] += 1
        elif to not in self.node.peers or to == peer:
            self.counters["unroutable"] += 1
        else:
            self.node.send(to, frame)
            self.counters["relayed"] += 1

    @staticmethod
    def _check_id(msg_id: Any) -> None:
        if type(msg_id) is not str or not 0 < len(msg_id) <= _MAX_ID_CHARS:
            raise DecodeError("msg_id must be a short string")

    def _remember(self, key: tuple[str, str], now_ms: int) -> None:
        self._seen[key] = now_ms + self.config.dedup_ttl_ms
        if len(self._seen) > self.config.dedup_capacity:
            self._seen.popitem(last=False)
            self.counters["dedup_evicted"] += 1

    # -- timers ------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When :meth:`handle_timer` should next run, or None when idle."""
        if not self._pending:
            return next(iter(self._seen.values())) if self._seen else None
        times = [min(p.next_at_ms, p.deadline_at_ms) for p in self._pending.values()]
        if self._seen:
            times.append(next(iter(self._seen.values())))
        return min(times) if times else None

    def handle_timer(self, now_ms: int) -> None:
        """Retransmit due messages, fail expired ones, forget old dedup entries."""
        for msg_id in list(self._pending):
            p = self._pending[msg_id]
            if now_ms >= p.deadline_at_ms:
                del self._pending[msg_id]
                reason = "deadline" if p.routed else "no_route"
                self._results.append(DirectFailed(msg_id, p.to, p.attempts, now_ms, reason))
                self.counters["failed"] += 1
            elif now_ms >= p.next_at_ms:
                self._transmit(p, now_ms)
                self.counters["retransmits"] += 1
        while self._seen and next(iter(self._seen.values())) <= now_ms:
            self._seen.popitem(last=False)
