"""Every exception hivemesh raises, in one tree.

The split follows h11: whose fault is it?

* :class:`LocalProtocolError` -- *we* (or the caller) did something illegal:
  a bug to fix or a bad argument. Never caused by a peer.
* :class:`RemoteProtocolError` -- a *peer* sent something invalid: malformed or
  oversize frames, bad signatures, broken hash chains, gaps, replays, forged
  or foreign operations, untrusted authors. The receiver counts it (by
  :attr:`HivemeshError.code`) and drops the input; it never crashes and never
  stores it.
* :class:`StoreError` -- the durable store is unusable (torn, tampered).
* :class:`TransportError` -- a connection failed: handshake, identity
  mismatch, deadline.
* :class:`CoordinationError` -- leases, claims and fencing.

Every class carries a short stable ``code`` used as the counter name in
``hivemesh status`` and on the control socket, where a client maps an error
back to its class by that code (:mod:`hivemesh.error_codes`), never by the
class name.

Each application keeps its own errors, subclasses of these categories, in
its own ``errors`` module: the lease client's (:mod:`hivemesh.leases.errors`),
the LLM providers' (:mod:`hivemesh.llm.errors`), telemetry's
(:mod:`hivemesh.telemetry.errors`), the MCP tool client's
(:mod:`hivemesh.tools.errors`) and the web tools' (:mod:`hivemesh.webtools.errors`).
So the core, which imports this module, knows nothing about them.

::

    HivemeshError
    ├── LocalProtocolError
    │   ├── InvalidArgument
    │   ├── ConfigError
    │   ├── InvalidAddress
    │   ├── QueueFull
    │   ├── BenchWorkerFailed      (bench fanout area)
    │   ├── FeedNotWritable        (own feed: writes refused, see hivemesh.core.ownfeed)
    │   │   ├── FeedRecovering     behind its mark: recovering it from peers
    │   │   └── FeedDiverged       another history of it exists: operator decides
    │   └── InviteError
    │       ├── InviteMalformed
    │       │   └── InviteNonCanonical
    │       ├── InviteBadSignature
    │       ├── InviteExpired
    │       ├── InviteUsed
    │       ├── InviteUnknown
    │       └── InviteRevoked
    ├── RemoteProtocolError
    │   ├── DecodeError
    │   │   ├── FrameTooLarge
    │   │   └── StunMalformed      a STUN response that breaks RFC 8489 framing
    │   ├── StunMismatch           a well-formed STUN message that does not answer our request
    │   ├── UnsupportedVersion
    │   ├── BadSignature
    │   ├── BrokenChain
    │   ├── GapError
    │   ├── ReplayError
    │   ├── ForkError
    │   ├── UntrustedAuthor
    │   ├── ClockAhead             (an event beyond the clock bound: deferred)
    │   ├── ForeignOperations
    │   ├── BlobMismatch
    │   ├── OpsOutOfOrder
    │   ├── InvalidName
    │   ├── BadRecord
    │   ├── ForgedSender
    │   ├── BrokerMisrouted       (broker mode: a message on another author's subject)
    │   └── StaleEnvelope         (broker mode: a signed envelope outside its time window)
    ├── StoreError
    │   └── StoreCorrupt
    ├── TransportError
    │   ├── HandshakeError
    │   ├── PeerIdentityMismatch
    │   ├── UnknownPeer
    │   ├── ConnectionClosed
    │   │   └── ChannelSuperseded   (connection manager: a duplicate channel lost the tie-break)
    │   ├── DeadlineExceeded
    │   ├── PeerUnreachable
    │   ├── WouldBlock
    │   └── DaemonNotRunning       (runtime area)
    └── CoordinationError
        └── BackendUnavailable

    planner:
    InvalidPlanEvent(RemoteProtocolError)     a plan.* body that fails validation
    -- hardening (load and local input) --
    TransportError
    ├── PeerBusy                 the peer refused the connection for load
    └── SelfConnection           the dialled endpoint is this node itself
    InvalidArgument
    ├── UnknownCommand           a control request names no command of the table
    ├── InputTooLarge            a request or value over its size limit
    ├── InputTooDeep             JSON nested deeper than allowed
    └── InvalidEncoding          text that is not valid UTF-8
    TransportError
    └── NoHandler              the node asked serves no requests of that kind
    -- restarts (boot ids in the handshake) --
    UnsupportedHandshake(HandshakeError, UnsupportedVersion)  identity payload of another version
    ConnectionClosed
    ├── PeerRestarted            the peer restarted: this channel was its previous life's
    └── StaleBoot                a channel from an earlier life than the linked one: refused
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "BadRecord",
    "BadSignature",
    "BenchWorkerFailed",
    "BlobMismatch",
    "BrokenChain",
    "BrokerMisrouted",
    "ChannelSuperseded",
    "ClockAhead",
    "ConfigError",
    "ConnectionClosed",
    "ContextBroken",
    "ContextCatchingUp",
    "CoordinationError",
    "DaemonNotRunning",
    "DeadlineExceeded",
    "DecodeError",
    "FeedDiverged",
    "FeedNotWritable",
    "FeedRecovering",
    "ForeignOperations",
    "ForgedSender",
    "ForkError",
    "FrameTooLarge",
    "GapError",
    "HandshakeError",
    "HivemeshError",
    "InputTooDeep",
    "InputTooLarge",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidEncoding",
    "InvalidName",
    "InvalidPlanEvent",
    "InviteBadSignature",
    "InviteError",
    "InviteExpired",
    "InviteMalformed",
    "InviteNonCanonical",
    "InviteRevoked",
    "InviteUnknown",
    "InviteUsed",
    "LocalProtocolError",
    "NoHandler",
    "OpsOutOfOrder",
    "PeerBusy",
    "PeerIdentityMismatch",
    "PeerRestarted",
    "PeerUnreachable",
    "QueueFull",
    "RemoteProtocolError",
    "ReplayError",
    "SelfConnection",
    "StaleBoot",
    "StaleEnvelope",
    "StoreCorrupt",
    "StoreError",
    "StunMalformed",
    "StunMismatch",
    "TransportError",
    "UnknownCommand",
    "UnknownPeer",
    "UnsupportedHandshake",
    "UnsupportedVersion",
    "UntrustedAuthor",
    "ViewCheckpointInvalid",
    "WouldBlock",
]


class HivemeshError(Exception):
    """Base of every hivemesh exception."""

    code = "error"


# -- our fault ---------------------------------------------------------------


class LocalProtocolError(HivemeshError):
    """The caller or this node did something illegal (a bug or bad argument)."""

    code = "local_protocol_error"


class InvalidArgument(LocalProtocolError, ValueError):
    """An argument is out of range or of the wrong form."""

    code = "invalid_argument"


class ConfigError(LocalProtocolError):
    """Configuration (file, flags, environment) is invalid."""

    code = "config_error"


class InvalidAddress(LocalProtocolError, ValueError):
    """A string is not a valid hivemesh address (bad prefix, length or checksum)."""

    code = "invalid_address"


# -- the peer's fault: count and drop ----------------------------------------


class RemoteProtocolError(HivemeshError):
    """A peer sent invalid input. Count it, drop it, maybe drop the peer."""

    code = "remote_protocol_error"


class DecodeError(RemoteProtocolError):
    """Bytes are not a well-formed frame or event of this protocol version."""

    code = "malformed"


class FrameTooLarge(DecodeError):
    """A frame or field is over its size limit."""

    code = "oversize"


class StunMalformed(DecodeError):
    """A datagram claiming to be a STUN response breaks RFC 8489's framing:
    bad length, magic cookie, attribute bounds, address family or FINGERPRINT."""

    code = "stun_malformed"


class StunMismatch(RemoteProtocolError):
    """A well-formed STUN message that is not the success answer to our
    Binding request: another transaction id, another method or class, an
    error response, or no mapped address."""

    code = "stun_mismatch"


class UnsupportedVersion(RemoteProtocolError):
    """A frame or event carries a protocol version we do not speak."""

    code = "bad_version"


class BadSignature(RemoteProtocolError):
    """A feed head signature does not verify against its author's key."""

    code = "bad_signature"


class BrokenChain(RemoteProtocolError):
    """An event's ``prev_hash`` does not match the hash of its predecessor."""

    code = "broken_chain"


class GapError(RemoteProtocolError):
    """Events arrived with a gap after the last sequence number we hold."""

    code = "gap"


class ReplayError(RemoteProtocolError):
    """Events we already hold arrived again (harmless, counted)."""

    code = "replay"


class ForkError(RemoteProtocolError):
    """An author signed two different events at the same sequence number."""

    code = "fork"


class UntrustedAuthor(RemoteProtocolError):
    """Events from an author that this node's trust policy does not admit."""

    code = "untrusted_author"


class ClockAhead(RemoteProtocolError):
    """A batch carries an HLC beyond the receiver's clock bound.

    It is not refused: the receiver holds it (and the author's later events
    behind it) until its physical clock reaches ``release_ms``, then applies
    it (:mod:`hivemesh.core.deferral`). ``hlc`` is the batch's largest HLC,
    ``seq`` the first event that carries an implausible one.
    """

    code = "clock_ahead"

    def __init__(self, message: str, *, hlc: int, seq: int, release_ms: int) -> None:
        super().__init__(message)
        self.hlc = hlc
        self.seq = seq
        self.release_ms = release_ms


class ForeignOperations(RemoteProtocolError):
    """A CRDT update inside an event carries operations of another author."""

    code = "foreign_ops"


class BlobMismatch(RemoteProtocolError):
    """Blob bytes do not hash to the content address they were sent for."""

    code = "blob_mismatch"


# -- storage -----------------------------------------------------------------


class StoreError(HivemeshError):
    """The durable store failed."""

    code = "store_error"


class StoreCorrupt(StoreError):
    """The store file is torn, tampered with, or not a hivemesh store."""

    code = "store_corrupt"


# -- transport ---------------------------------------------------------------


class TransportError(HivemeshError):
    """A connection failed."""

    code = "transport_error"


class HandshakeError(TransportError):
    """The secure handshake failed (garbage, wrong protocol, bad crypto)."""

    code = "handshake_failed"


class PeerIdentityMismatch(TransportError):
    """The peer proved a different key than the address we dialled (MITM?)."""

    code = "identity_mismatch"


class UnknownPeer(TransportError):
    """The peer authenticated but is not trusted by this node."""

    code = "unknown_peer"


class ConnectionClosed(TransportError):
    """The connection closed before the operation finished."""

    code = "connection_closed"


class DeadlineExceeded(TransportError, TimeoutError):
    """A network call did not finish before its deadline."""

    code = "deadline_exceeded"


# -- coordination ------------------------------------------------------------


class CoordinationError(HivemeshError):
    """Leases, claims, fencing."""

    code = "coordination_error"


class BackendUnavailable(CoordinationError):
    """A lease backend (quorum, Redis, NATS) could not be reached in time."""

    code = "backend_unavailable"


# -- views --


class OpsOutOfOrder(RemoteProtocolError):
    """A CRDT update does not continue exactly where its author's last one ended."""

    code = "ops_out_of_order"


class InvalidName(RemoteProtocolError):
    """A name, key or context name in an event does not match its strict pattern."""

    code = "invalid_name"


# -- transports --------------------------------------------------------------


class BadRecord(RemoteProtocolError):
    """An encrypted transport record failed authentication.

    It was tampered with, replayed, reordered, truncated or forged: the
    receiving nonce no longer matches. The connection is closed.
    """

    code = "bad_record"


class PeerUnreachable(TransportError):
    """A dial failed before any byte was exchanged (refused, no route)."""

    code = "unreachable"


class WouldBlock(TransportError):
    """A ``*_nowait`` call found its bounded queue full (or empty); nothing changed."""

    code = "would_block"


# -- membership, direct messages, trust --------------------------------------


class QueueFull(LocalProtocolError):
    """A bounded queue is full; retry later (the ``_nowait`` style of trio)."""

    code = "queue_full"


class ForgedSender(RemoteProtocolError):
    """A peer sent a direct message claiming another sender without relaying."""

    code = "forged_sender"


class BrokerMisrouted(RemoteProtocolError):
    """Broker mode: a message arrived on a subject (or for a recipient) that
    does not match its signed content -- published under another author's
    subject, or replayed to another node. The broker is not trusted."""

    code = "broker_misrouted"


class StaleEnvelope(RemoteProtocolError):
    """Broker mode: a signed node-to-node envelope stamped too far from our
    clock (a replay of an old one, or a sender's clock far off)."""

    code = "stale_envelope"


class InviteError(LocalProtocolError, ValueError):
    """An invite token or join proof cannot be used."""

    code = "invite_error"


class InviteMalformed(InviteError):
    """The invite token is not a well-formed hivemesh invite."""

    code = "invite_malformed"


class InviteNonCanonical(InviteMalformed):
    """The invite token is not in its one canonical encoding (padding, alphabet,
    a non-minimal msgpack form, trailing bytes, whitespace, case)."""

    code = "invite_noncanonical"


class InviteBadSignature(InviteError):
    """The invite's signature does not verify against the inviter's key."""

    code = "invite_bad_signature"


class InviteExpired(InviteError):
    """The invite's expiry time has passed."""

    code = "invite_expired"


class InviteUsed(InviteError):
    """The invite was already used by another node.

    Like every ``Invite*`` refusal of a join, it is also the CLOSE code with
    which the inviter ends the joiner's channel, so the joiner learns why.
    """

    code = "invite_used"


class InviteUnknown(InviteError):
    """The inviter holds no invite matching the join proof (a foreign or forged
    token, or one forgotten long after it expired)."""

    code = "invite_unknown"


class InviteRevoked(InviteError):
    """The inviter revoked the joining node, so no invite admits it."""

    code = "invite_revoked"


# -- planner (issue 6) ---------------------------------------------------------


class InvalidPlanEvent(RemoteProtocolError):
    """A ``plan.*`` event body fails validation; the plan view ignores and counts it."""

    code = "plan_invalid"


# -- leases --------------------------------------------------------------------


# -- telemetry ---------------------------------------------------------------


class NoHandler(TransportError):
    """The node a request went to serves no requests of that kind (it answered so).

    For telemetry: the node that holds the name ``metrics-collector`` does not
    run a collector.
    """

    code = "no_handler"


# -- runtime -----------------------------------------------------------------


class DaemonNotRunning(TransportError):
    """No node daemon answers on the data dir's control socket."""

    code = "daemon_not_running"


# -- bench fanout ------------------------------------------------------------


class BenchWorkerFailed(LocalProtocolError):
    """A benchmark worker process died, refused a request or answered garbage."""

    code = "bench_worker_failed"


# -- connection manager (simultaneous dials) ------------------------------------


class ChannelSuperseded(ConnectionClosed):
    """A duplicate channel to a peer lost the tie-break and was retired.

    Sent as the CLOSE code of the losing channel, so the peer knows the
    other channel carries on (it waits for it instead of reporting us down).
    """

    code = "channel_superseded"


# -- tools (MCP client) and web tools ------------------------------------------


# -- hardening: load and malformed local input ----------------------------------


class PeerBusy(TransportError):
    """The peer refused the connection for load (too many handshakes or
    channels in progress); retry later, with backoff."""

    code = "peer_busy"


class SelfConnection(TransportError):
    """The dialled endpoint is this node itself (e.g. its own address in its
    bootstrap list); there is nothing to connect to."""

    code = "self_connection"


class UnknownCommand(InvalidArgument):
    """A request named no command of :data:`hivemesh.commands.COMMANDS`."""

    code = "unknown_command"


class InputTooLarge(InvalidArgument):
    """A request, argument or value is over its size limit."""

    code = "too_large"


class InputTooDeep(InvalidArgument):
    """A JSON value is nested deeper than the control protocol allows."""

    code = "too_deep"


class InvalidEncoding(InvalidArgument):
    """Text (a key, a name, a value) that is not valid UTF-8."""

    code = "bad_encoding"


# -- own feed (a node never forks its own feed) ----------------------------------


class FeedNotWritable(LocalProtocolError):
    """This node refuses to append to its own feed until it holds all of it.

    The message says why and what to do (see :mod:`hivemesh.core.ownfeed`);
    nothing was appended.
    """

    code = "feed_not_writable"


class FeedRecovering(FeedNotWritable):
    """The store is behind the feed's durable mark (deleted, restored from an
    older copy, damaged): the missing part is being recovered from peers."""

    code = "feed_recovering"


class ContextCatchingUp(FeedNotWritable):
    """This node's own earlier operations on a context are held, waiting for
    operations of other authors they depend on (typically after a restore
    from a backup): a write now would reuse their operation ids. Retry once
    the missing operations arrive; nothing was written."""

    code = "context_catching_up"


class ContextBroken(StoreError):
    """The CRDT engine failed on a context (a loro panic) and that context's
    document can no longer be used in this process; other contexts still
    work. Restarting the node rebuilds it from the journal."""

    code = "context_broken"


class FeedDiverged(FeedNotWritable):
    """A different, validly signed history of this node's feed exists (in the
    store or at a peer): an operator must decide (``hivemesh feed accept-loss``)."""

    code = "feed_diverged"


# -- restarts: boot ids in the handshake ----------------------------------------


class UnsupportedHandshake(HandshakeError, UnsupportedVersion):
    """The peer's handshake identity payload is of a version this node does
    not speak (e.g. version 1, from a hivemesh without boot ids): upgrade the
    older side."""

    code = "handshake_version"


class PeerRestarted(ConnectionClosed):
    """The peer restarted: a channel from its new life (another boot id)
    replaced this one, which belonged to its previous life (half-open)."""

    code = "peer_restarted"


class StaleBoot(ConnectionClosed):
    """A channel from an earlier life of the peer than the one linked (a dial
    delayed from before its restart); refused, it never replaces the link."""

    code = "stale_boot"


# -- restarts: view checkpoints ---------------------------------------------------


class ViewCheckpointInvalid(StoreError):
    """A view checkpoint cannot be used: torn or altered (checksum), of
    another format or node, or not a prefix of the journal it sits beside.
    Never raised to a caller: the node logs it, counts it and replays the
    whole journal instead (:mod:`hivemesh.stores.viewcheckpoint`).
    ``reason`` names the kind of damage for counters (``checksum``,
    ``format``, ``node``, ``journal``, ``store``, ``other``)."""

    code = "view_checkpoint_invalid"

    def __init__(self, message: str, reason: str = "other") -> None:
        super().__init__(message)
        self.reason = reason
