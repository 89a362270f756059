"""What a :class:`~hivemesh.core.peer.Peer` asks its driver to do.

Theory of operation
-------------------
The Peer decides; a driver (the asyncio daemon, the simulator, a test with a
list for a network) carries the decisions out. Every decision is one small
frozen record, drained in order with :meth:`Peer.effects`:

* :class:`Send`     -- put ``frame`` on the link to ``peer`` (dropped by the
  driver when there is no link: replication and SWIM repair it);
* :class:`Dial`     -- keep a link to ``address`` at ``endpoints`` (dial with
  backoff until it is up; a driver that already dials it adds the endpoints);
* :class:`Close`    -- close the link to ``peer``; with ``forget`` also stop
  dialling it (revoked, or untrusted);
* :class:`Fsync`    -- make the store's writes durable (the group commit);
* :class:`Deliver`  -- events newly applied to the journal, in order, for
  subscribers (one effect per batch: no per-event cost);
* :class:`Reply`    -- the answer to a :meth:`Peer.command` (``rid`` is what
  ``command`` returned): ``value`` or a typed ``error``;
* :class:`MessageOutcome` -- a direct message was acknowledged, or failed;
* :class:`Persist`  -- store received direct messages in the durable inbox,
  then call :meth:`Peer.persisted`;
* :class:`Handle`   -- run the driver's handler for a request or plain
  message, then call :meth:`Peer.handled`;
* :class:`LeaseLog` -- write one change of the lease voter's durable state
  to the voter log (``resource``'s token bound, the longest TTL);
* :class:`LeaseSync` -- sync the voter log, then call
  :meth:`Peer.lease_synced` with ``upto`` (replies wait for it);
* :class:`SaveVoters` -- save the lease voter set the node fixed
  (``lease_voters.json``), for its next lives;
* :class:`Redeem`   -- check a join proof with the trust store (and mark
  its invite used), then call :meth:`Peer.redeemed`;
* :class:`TrustEdit` -- trust an address, or record a swarm joined, in
  ``trust.json`` (the Peer's copy changed already);
* :class:`Log`      -- a line for the operator (``level`` as in :mod:`logging`);
* :class:`Count`    -- add ``n`` to the driver's counter ``name``.

Effects are plain data: equal decisions compare equal, which is what the
trace-equivalence check (:mod:`hivemesh.core.trace`) relies on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hivemesh.core.direct import InboxMessage
from hivemesh.core.event import Event
from hivemesh.errors import HivemeshError

__all__ = [
    "Close",
    "Count",
    "Deliver",
    "Dial",
    "Effect",
    "Fsync",
    "Handle",
    "LeaseLog",
    "LeaseSync",
    "Log",
    "MessageOutcome",
    "Persist",
    "Redeem",
    "Reply",
    "SaveVoters",
    "Send",
    "TrustEdit",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``frame`` to ``peer`` over its link."""

    peer: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class Dial:
    """Keep a link to ``address``, dialling ``endpoints`` (``host:port``)."""

    address: str
    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Close:
    """Close the link to ``peer`` (module docs for the two options).

    ``code`` is the stable error code the peer's CLOSE frame carries (None:
    a plain close).
    """

    peer: str
    reason: str
    code: str | None = None
    forget: bool = False


@dataclass(frozen=True, slots=True)
class Fsync:
    """Commit the store: make every write so far durable (the group commit)."""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Events newly applied to the journal (own and received), in order."""

    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to command ``rid``: ``value``, or ``error`` if it failed."""

    rid: int
    value: Any = None
    error: HivemeshError | None = None

    def __eq__(self, other: object) -> bool:
        # errors compare by class, code and text (exceptions compare by identity)
        if not isinstance(other, Reply):
            return NotImplemented
        return (self.rid, self.value, _error_key(self.error)) == (
            other.rid,
            other.value,
            _error_key(other.error),
        )

    def __hash__(self) -> int:
        return hash((self.rid, _error_key(self.error)))


@dataclass(frozen=True, slots=True)
class MessageOutcome:
    """Direct message ``msg_id`` to ``to`` was acknowledged (``acked``) or
    failed (``reason``), after ``attempts`` transmissions."""

    msg_id: str
    to: str
    acked: bool
    attempts: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Persist:
    """Store ``messages`` in the durable inbox (one commit), then report
    ``batch`` with :meth:`Peer.persisted`."""

    batch: int
    messages: tuple[InboxMessage, ...]


@dataclass(frozen=True, slots=True)
class Handle:
    """Run the handler for ``kind`` on a message from ``sender``, then report
    ``key`` with :meth:`Peer.handled` (``plain``: a ``{"type": kind}``
    message, whose ``data`` is the whole message; else a request's body)."""

    key: int
    sender: str
    msg_id: str
    kind: str
    data: Any
    plain: bool


@dataclass(frozen=True, slots=True)
class LeaseLog:
    """Write ``(resource, bound, max_ttl_ms)`` to the lease voter's log (not
    yet synced: :class:`LeaseSync` follows before any reply depends on it)."""

    resource: str
    bound: int
    max_ttl_ms: int


@dataclass(frozen=True, slots=True)
class LeaseSync:
    """Sync the lease voter's log, then report with
    ``Peer.lease_synced(upto, error, now)`` (``upto``: the writes asked for
    so far; a failed write or sync is reported with its ``error``)."""

    upto: int


@dataclass(frozen=True, slots=True)
class SaveVoters:
    """Save the lease voter set this node fixed (read again at its next start)."""

    voters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Redeem:
    """Check ``proof`` from ``peer`` against the invites we issued (marking
    the one it matches used), then report with ``Peer.redeemed``."""

    peer: str
    proof: bytes


@dataclass(frozen=True, slots=True)
class TrustEdit:
    """Trust ``address`` (``note`` says why), or, with ``swarm``, record that
    this node joined ``swarm`` through ``address``, in ``trust.json``."""

    address: str
    note: str = ""
    swarm: str | None = None


@dataclass(frozen=True, slots=True)
class Log:
    """A line for the operator's log (``level``: ``debug``, ``info``, ``warning``)."""

    level: str
    message: str


@dataclass(frozen=True, slots=True)
class Count:
    """Add ``n`` to the counter ``name``."""

    name: str
    n: int = 1


def _error_key(error: HivemeshError | None) -> tuple[str, str, str] | None:
    return None if error is None else (type(error).__name__, error.code, str(error))


Effect = (
    Send
    | Dial
    | Close
    | Fsync
    | Deliver
    | Reply
    | MessageOutcome
    | Persist
    | Handle
    | LeaseLog
    | LeaseSync
    | SaveVoters
    | Redeem
    | TrustEdit
    | Log
    | Count
)
