"""Signed envelopes for node-to-node frames carried by an untrusted broker.

Theory of operation
-------------------
In peer-to-peer mode a frame's sender is proven by the Noise channel it came
on. A broker (NATS, Redis) proves nothing: anyone who may publish on the
server can put any bytes on any subject. So every node-to-node message in
broker mode is an *envelope*::

    [ENVELOPE_VERSION, kind, sender_public_key, boot_id, to, ts_ms, frames, sig]

``sig`` is the sender's Ed25519 signature over the domain tag, the swarm
name and every other field, so an envelope cannot be moved to another
swarm, another recipient (``to``: an address, ``""`` for a broadcast), or
attributed to another sender or life (``boot_id``, random per node start).
``ts_ms`` is the sender's wall clock: an envelope stamped more than
``window_ms`` away from the receiver's clock is refused
(:class:`~hivemesh.errors.StaleEnvelope`), which bounds how long a captured
envelope can be replayed. Inside the window a replay delivers frames the
receiver already had; every protocol above is idempotent to that (journal
batches by seq, direct messages by id, SWIM by incarnation and sequence).

Kinds: ``HELLO`` (I am here, with this life: a broadcast on the swarm's
presence subject, or a directed answer), ``FRAMES`` (protocol frames for
``to``), ``BYE`` (I am leaving; ``to`` may be ``""``), ``TELEMETRY`` (one
telemetry batch in the collectors' queue, ``to`` ``""``; it may wait in the
queue for long, so it is opened without the time window and its replays are
the collector's ``(sender, seq)`` de-duplication's business).

One signature covers every frame queued for one recipient at once, so its
cost (a sign ~35 us, a verify ~105 us) is amortised like the journal's batch
signatures. Pure functions: no clock, no I/O (the caller passes ``now_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hivemesh.core.codec import MAX_FRAME_BYTES, pack, unpack
from hivemesh.core.identity import Identity, address_of, verify
from hivemesh.errors import (
    BadSignature,
    BrokerMisrouted,
    DecodeError,
    StaleEnvelope,
    UnsupportedVersion,
)

__all__ = [
    "BYE",
    "ENVELOPE_VERSION",
    "FRAMES",
    "HELLO",
    "TELEMETRY",
    "Envelope",
    "open_envelope",
    "seal_envelope",
]

ENVELOPE_VERSION = 1
HELLO = 1
FRAMES = 2
BYE = 3
TELEMETRY = 4
_KINDS = frozenset({HELLO, FRAMES, BYE, TELEMETRY})
_DOMAIN = b"hivemesh/broker-envelope/1\x00"
#: Default bound on |sender clock - receiver clock| for an envelope.
DEFAULT_WINDOW_MS = 60_000


@dataclass(frozen=True, slots=True)
class Envelope:
    """A verified envelope."""

    kind: int
    sender: str  # address
    boot_id: bytes
    to: str
    ts_ms: int
    frames: list[bytes]


def _signed(
    swarm: str, kind: int, pub: bytes, boot: bytes, to: str, ts: int, frames: list[bytes]
) -> bytes:
    return _DOMAIN + pack([swarm, kind, pub, boot, to, ts, frames])


def seal_envelope(
    identity: Identity,
    swarm: str,
    kind: int,
    boot_id: bytes,
    to: str,
    ts_ms: int,
    frames: list[bytes],
) -> bytes:
    """Encode and sign one envelope from ``identity``."""
    pub = identity.public
    sig = identity.sign(_signed(swarm, kind, pub, boot_id, to, ts_ms, frames))
    return pack([ENVELOPE_VERSION, kind, pub, boot_id, to, ts_ms, frames, sig])


def open_envelope(
    data: bytes,
    swarm: str,
    me: str,
    now_ms: int,
    *,
    window_ms: int = DEFAULT_WINDOW_MS,
) -> Envelope:
    """Decode and verify an envelope received by ``me`` (raises a
    :class:`~hivemesh.errors.RemoteProtocolError`: ``malformed``,
    ``bad_version``, ``bad_signature``, ``broker_misrouted``, ``stale_envelope``)."""
    obj = unpack(data, limit=MAX_FRAME_BYTES)
    if type(obj) is not list or len(obj) != 8:
        raise DecodeError("envelope must be an array of 8")
    version, kind, pub, boot, to, ts, frames, sig = obj
    if version != ENVELOPE_VERSION:
        raise UnsupportedVersion(f"envelope version {version!r}")
    if (
        kind not in _KINDS
        or type(pub) is not bytes
        or len(pub) != 32
        or type(boot) is not bytes
        or len(boot) > 64
        or type(to) is not str
        or type(ts) is not int
        or type(frames) is not list
        or not all(type(f) is bytes for f in frames)
        or type(sig) is not bytes
    ):
        raise DecodeError("envelope fields have wrong types")
    if to and to != me:
        raise BrokerMisrouted(f"envelope for {to[:12]} delivered to {me[:12]}")
    if not verify(pub, sig, _signed(swarm, kind, pub, boot, to, ts, frames)):
        raise BadSignature("envelope signature does not verify")
    if abs(ts - now_ms) > window_ms:
        raise StaleEnvelope(f"envelope stamped {ts - now_ms:+d} ms from our clock")
    return Envelope(kind, address_of(pub), boot, to, ts, frames)
