"""A STUN Binding client (RFC 8489, compatible with RFC 5389 servers), sans-IO.

Theory of operation
-------------------
A node may ask a standard STUN server which ``ip:port`` its UDP socket
appears from: the *mapped address*, what a NAT between them made of it.
This module holds the bytes and the rules; the daemon's driver
(:mod:`hivemesh.runtime.paths`) sends from the node's own QUIC socket, so
the mapping observed is the one peers use, and hands answers back here.

* :func:`binding_request` encodes a Binding request with the caller's
  random 96-bit transaction id (the module draws no randomness) and,
  by default, a FINGERPRINT.
* :func:`decode` checks the framing strictly and raises
  :class:`~hivemesh.errors.StunMalformed` on any breach: the two leading
  zero bits, the magic cookie, a length equal to the datagram's rest and a
  multiple of 4, at most :data:`MAX_MESSAGE` bytes, every attribute (with
  its padding) inside the message, nothing after a FINGERPRINT and a
  FINGERPRINT that matches (RFC 8489, 14.7).
* :func:`parse_binding_response` accepts only the success answer to *our*
  request: another transaction id, an error response (ERROR-CODE is read
  for the message), another method or class, an unknown
  comprehension-required attribute (RFC 8489, 6.3.4) or no mapped address
  raise :class:`~hivemesh.errors.StunMismatch`. XOR-MAPPED-ADDRESS wins;
  MAPPED-ADDRESS is the fallback for RFC 3489-era servers (which still
  send the magic cookie's bytes when they speak RFC 5389). IPv4 and IPv6.
* :class:`BindingTransaction` is one request's life: it is sent at once,
  retransmitted after ``rto_s`` doubling (at most ``max_sends`` sends),
  and fails at ``timeout_s`` after its start. A datagram that does not
  answer it raises and leaves it open (a spoofed or garbled datagram must
  not end a transaction), so the driver counts the error by its code.
* :class:`Transactions` holds the open transactions, each with its
  server's address, and says which one a datagram answers: it must carry
  an open transaction's id and come from that server's address, else
  :class:`~hivemesh.errors.StunMismatch`; an answer to one of the last
  finished transactions (a retransmission's) is *late*, not an error.

No authentication (a Binding request needs none); a STUN server is trusted
only as far as the caller decides (docs/nat.md: one server is one vote).
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections import deque

from hivemesh.errors import InvalidArgument, StunMalformed, StunMismatch

__all__ = [
    "BINDING_ERROR",
    "BINDING_REQUEST",
    "BINDING_SUCCESS",
    "FINGERPRINT",
    "HEADER_LEN",
    "MAGIC_COOKIE",
    "MAPPED_ADDRESS",
    "MAX_MESSAGE",
    "TRANSACTION_ID_LEN",
    "XOR_MAPPED_ADDRESS",
    "BindingTransaction",
    "StunMessage",
    "Transactions",
    "binding_request",
    "decode",
    "encode",
    "encode_address",
    "is_stun",
    "parse_binding_response",
]

HostPort = tuple[str, int]

MAGIC_COOKIE = 0x2112A442
_COOKIE = MAGIC_COOKIE.to_bytes(4, "big")
HEADER_LEN = 20
TRANSACTION_ID_LEN = 12
#: The largest response accepted (bytes): a Binding answer is under 100.
MAX_MESSAGE = 1280

BINDING_REQUEST = 0x0001
BINDING_SUCCESS = 0x0101
BINDING_ERROR = 0x0111

MAPPED_ADDRESS = 0x0001
XOR_MAPPED_ADDRESS = 0x0020
ERROR_CODE = 0x0009
FINGERPRINT = 0x8028
_FINGERPRINT_XOR = 0x5354554E
#: Comprehension-required attributes we know and ignore in a Binding answer
#: (RFC 3489's addresses, authentication ones a server may add).
_IGNORED_REQUIRED = frozenset(
    {0x0002, 0x0003, 0x0004, 0x0005, 0x0006, 0x0008, 0x0014, 0x0015, 0x001C, 0x001D, 0x001E}
)
_FAMILY_LEN = {0x01: 4, 0x02: 16}


class StunMessage:
    """A decoded STUN message: type, transaction id, attributes in order."""

    __slots__ = ("attributes", "msg_type", "transaction_id")

    def __init__(
        self, msg_type: int, transaction_id: bytes, attributes: tuple[tuple[int, bytes], ...]
    ) -> None:
        self.msg_type = msg_type
        self.transaction_id = transaction_id
        self.attributes = attributes

    def first(self, attr_type: int) -> bytes | None:
        """The value of the first attribute of ``attr_type`` (``None``: absent)."""
        return next((v for t, v in self.attributes if t == attr_type), None)


def _check_txid(transaction_id: bytes) -> None:
    if len(transaction_id) != TRANSACTION_ID_LEN:
        raise InvalidArgument(f"a STUN transaction id is {TRANSACTION_ID_LEN} bytes")


def is_stun(data: bytes) -> bool:
    """Whether ``data`` looks like STUN (the two zero bits and the magic
    cookie): how a datagram on the QUIC socket is told apart (RFC 7983)."""
    return len(data) >= HEADER_LEN and not data[0] & 0xC0 and data[4:8] == _COOKIE


def encode(
    msg_type: int,
    transaction_id: bytes,
    attributes: tuple[tuple[int, bytes], ...] = (),
    *,
    fingerprint: bool = False,
) -> bytes:
    """A STUN message (attributes padded to 4 bytes; FINGERPRINT last if asked)."""
    _check_txid(transaction_id)
    if not 0 <= msg_type <= 0x3FFF:
        raise InvalidArgument("a STUN message type has 14 bits")
    body = b"".join(
        struct.pack("!HH", t, len(v)) + v + b"\0" * (-len(v) % 4) for t, v in attributes
    )
    length = len(body) + (8 if fingerprint else 0)
    out = struct.pack("!HHI", msg_type, length, MAGIC_COOKIE) + transaction_id + body
    if fingerprint:
        crc = (zlib.crc32(out) ^ _FINGERPRINT_XOR) & 0xFFFFFFFF
        out += struct.pack("!HHI", FINGERPRINT, 4, crc)
    return out


def binding_request(transaction_id: bytes, *, fingerprint: bool = True) -> bytes:
    """A Binding request with the caller's random 96-bit ``transaction_id``."""
    return encode(BINDING_REQUEST, transaction_id, fingerprint=fingerprint)


def encode_address(attr_type: int, host: str, port: int, transaction_id: bytes) -> bytes:
    """The value of a (XOR-)MAPPED-ADDRESS attribute for ``host:port``."""
    _check_txid(transaction_id)
    ip = ipaddress.ip_address(host)
    raw = ip.packed
    if attr_type == XOR_MAPPED_ADDRESS:
        port ^= MAGIC_COOKIE >> 16
        raw = bytes(a ^ b for a, b in zip(raw, _COOKIE + transaction_id, strict=False))
    return struct.pack("!BBH", 0, 0x01 if ip.version == 4 else 0x02, port) + raw


def decode(data: bytes) -> StunMessage:
    """Parse and bound-check one STUN message (see the module docs)."""
    n = len(data)
    if n < HEADER_LEN:
        raise StunMalformed(f"a STUN message of {n} bytes is shorter than its header")
    if n > MAX_MESSAGE:
        raise StunMalformed(f"a STUN message of {n} bytes is over {MAX_MESSAGE}")
    msg_type, length = struct.unpack_from("!HH", data, 0)
    if msg_type & 0xC000:
        raise StunMalformed("the two leading bits of a STUN message are not zero")
    if data[4:8] != _COOKIE:
        raise StunMalformed("no STUN magic cookie")
    if length != n - HEADER_LEN or length % 4:
        raise StunMalformed(f"STUN length {length} does not fit a {n}-byte datagram")
    attributes: list[tuple[int, bytes]] = []
    pos, sealed = HEADER_LEN, False
    while pos < n:
        if sealed:
            raise StunMalformed("a STUN attribute after FINGERPRINT")
        if n - pos < 4:  # unreachable while the length is a multiple of 4: kept as a bound
            raise StunMalformed("a truncated STUN attribute header")
        attr_type, attr_len = struct.unpack_from("!HH", data, pos)
        start = pos + 4
        end = start + attr_len + (-attr_len % 4)
        if end > n:
            raise StunMalformed(f"STUN attribute 0x{attr_type:04x} runs past the message")
        value = data[start : start + attr_len]
        if attr_type == FINGERPRINT:
            if attr_len != 4:
                raise StunMalformed("a FINGERPRINT is 4 bytes")
            expected = (zlib.crc32(data[:pos]) ^ _FINGERPRINT_XOR) & 0xFFFFFFFF
            if int.from_bytes(value, "big") != expected:
                raise StunMalformed("the STUN FINGERPRINT does not match")
            sealed = True
        attributes.append((attr_type, value))
        pos = end
    return StunMessage(msg_type, data[8:HEADER_LEN], tuple(attributes))


def _address(value: bytes, transaction_id: bytes, *, xor: bool) -> HostPort:
    if len(value) < 4:
        raise StunMalformed("a truncated STUN address")
    family, port = value[1], int.from_bytes(value[2:4], "big")
    size = _FAMILY_LEN.get(family)
    if size is None:
        raise StunMalformed(f"STUN address family {family} is neither IPv4 nor IPv6")
    raw = value[4:]
    if len(raw) != size:
        raise StunMalformed(f"a STUN address of family {family} has {len(raw)} bytes")
    if xor:
        port ^= MAGIC_COOKIE >> 16
        raw = bytes(a ^ b for a, b in zip(raw, _COOKIE + transaction_id, strict=False))
    if port == 0:
        raise StunMalformed("a STUN mapped address with port 0")
    return str(ipaddress.ip_address(raw)), port


def parse_binding_response(data: bytes, transaction_id: bytes) -> HostPort:
    """Our mapped ``(ip, port)`` from the answer to the request ``transaction_id``."""
    _check_txid(transaction_id)
    msg = decode(data)
    if msg.transaction_id != transaction_id:
        raise StunMismatch("a STUN answer to another transaction")
    if msg.msg_type == BINDING_ERROR:
        raw = msg.first(ERROR_CODE) or b""
        code = (raw[2] & 0x7) * 100 + raw[3] if len(raw) >= 4 else 0
        reason = raw[4:].decode("utf-8", "replace")[:128]
        raise StunMismatch(f"the STUN server refused: {code} {reason}".rstrip())
    if msg.msg_type != BINDING_SUCCESS:
        raise StunMismatch(f"STUN message type 0x{msg.msg_type:04x} is no Binding success")
    for attr_type, _ in msg.attributes:
        if attr_type < 0x8000 and attr_type not in (
            MAPPED_ADDRESS,
            XOR_MAPPED_ADDRESS,
            ERROR_CODE,
            *_IGNORED_REQUIRED,
        ):
            raise StunMismatch(f"unknown comprehension-required STUN attribute 0x{attr_type:04x}")
    xored = msg.first(XOR_MAPPED_ADDRESS)
    if xored is not None:
        return _address(xored, transaction_id, xor=True)
    plain = msg.first(MAPPED_ADDRESS)
    if plain is not None:
        return _address(plain, transaction_id, xor=False)
    raise StunMismatch("a STUN Binding success without a mapped address")


class BindingTransaction:
    """One Binding request to one server: when to (re)send, when to give up,
    and its answer (see the module docs). Times are the caller's clock (s)."""

    def __init__(
        self,
        transaction_id: bytes,
        now: float,
        *,
        rto_s: float = 0.5,
        max_sends: int = 4,
        timeout_s: float = 5.0,
        fingerprint: bool = True,
    ) -> None:
        if rto_s <= 0 or max_sends < 1 or timeout_s <= 0:
            raise InvalidArgument("rto_s and timeout_s must be > 0, max_sends >= 1")
        self.transaction_id = transaction_id
        self.request = binding_request(transaction_id, fingerprint=fingerprint)
        #: When the transaction fails if unanswered.
        self.deadline = now + timeout_s
        #: The mapped address, once answered.
        self.mapped: HostPort | None = None
        #: Whether the deadline passed unanswered.
        self.timed_out = False
        self.sends = 0
        self._rto_s = rto_s
        self._max_sends = max_sends
        self._next_send = now

    @property
    def done(self) -> bool:
        """Answered or timed out."""
        return self.mapped is not None or self.timed_out

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """The request, when a (re)send is due at ``now``; else nothing."""
        if self.done or self.sends >= self._max_sends or now < self._next_send:
            return []
        self._next_send = now + self._rto_s * 2**self.sends
        self.sends += 1
        return [self.request]

    def handle_timer(self, now: float) -> None:
        """Give up once ``now`` reaches the deadline unanswered."""
        if not self.done and now >= self.deadline:
            self.timed_out = True

    def next_deadline(self) -> float | None:
        """When to call :meth:`datagrams_to_send` / :meth:`handle_timer` next."""
        if self.done:
            return None
        if self.sends < self._max_sends:
            return min(self._next_send, self.deadline)
        return self.deadline

    def receive(self, data: bytes) -> HostPort:
        """Take a datagram; the mapped address if it answers this request,
        else :class:`~hivemesh.errors.StunMalformed` or
        :class:`~hivemesh.errors.StunMismatch` (the transaction stays open)."""
        if self.done:
            raise StunMismatch("a STUN answer to a finished transaction")
        self.mapped = parse_binding_response(data, self.transaction_id)
        return self.mapped


class Transactions:
    """The open Binding transactions by id, each with its server's address
    (module docs): which one a datagram answers."""

    def __init__(self, *, late: int = 16) -> None:
        self._open: dict[bytes, tuple[BindingTransaction, HostPort]] = {}
        self._finished: deque[bytes] = deque(maxlen=late)  # answers may come late

    def open(self, tx: BindingTransaction, server: HostPort) -> None:
        """Expect answers to ``tx`` from ``server``."""
        self._open[tx.transaction_id] = (tx, server)

    def close(self, tx: BindingTransaction) -> None:
        """``tx`` is over: a later answer to it is late."""
        if self._open.pop(tx.transaction_id, None) is not None:
            self._finished.append(tx.transaction_id)

    def receive(self, data: bytes, addr: HostPort) -> BindingTransaction | None:
        """The transaction ``data`` (a STUN message) answered, or None for a
        late answer; :class:`~hivemesh.errors.StunMismatch` or
        :class:`~hivemesh.errors.StunMalformed` when it answers none."""
        txid = data[8:20]
        pending = self._open.get(txid)
        if pending is None and txid in self._finished:
            return None
        if pending is None:
            raise StunMismatch(f"a STUN message from {addr[0]}:{addr[1]} answers nothing")
        if tuple(addr[:2]) != pending[1]:
            raise StunMismatch(f"a STUN answer from {addr[0]}:{addr[1]}, not the server")
        pending[0].receive(data)
        return pending[0]
