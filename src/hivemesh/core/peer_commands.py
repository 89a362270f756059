"""The typed commands a :class:`~hivemesh.core.peer.Peer` answers.

Each command is a frozen record; :meth:`Peer.command` dispatches on its type
through one table and answers with a :class:`~hivemesh.core.effects.Reply`
carrying the request id ``command`` returned. A command the Peer can answer
at once replies before ``command`` returns; the others (a claim waiting to
settle, a blob being fetched, a direct message waiting for its ack) reply
when their input arrives, or with
:class:`~hivemesh.errors.DeadlineExceeded` at ``timeout_ms``.

(The swarm-wide command table, :mod:`hivemesh.commands`, will carry these;
until then they live here, next to the machine that answers them.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AcceptFeedLoss",
    "Append",
    "Claim",
    "ClaimDone",
    "FetchBlob",
    "Leave",
    "Ping",
    "ReleaseClaim",
    "Request",
    "Revoke",
    "SendDirect",
    "Serve",
    "Vouch",
    "WaitDecided",
]


@dataclass(frozen=True, slots=True)
class Append:
    """Append one event to the own feed; replies with the :class:`Event`."""

    kind: str
    body: Any


@dataclass(frozen=True, slots=True)
class Claim:
    """Register intent on ``resource``; replies with the claim's seq (an
    existing live claim of ours is reused)."""

    resource: str


@dataclass(frozen=True, slots=True)
class ReleaseClaim:
    """Release our live claims on ``resource``; replies with how many."""

    resource: str


@dataclass(frozen=True, slots=True)
class ClaimDone:
    """Report ``resource`` finished; replies with the ``claim.done`` event."""

    resource: str


@dataclass(frozen=True, slots=True)
class WaitDecided:
    """Reply with the winner's address once the claim on ``resource`` settled."""

    resource: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class FetchBlob:
    """Reply with the bytes of blob ``digest``: held, or fetched from holders."""

    digest: bytes
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class SendDirect:
    """Send a direct message; replies ``{msg_id, to, acked, attempts}`` once
    acknowledged (or DeadlineExceeded)."""

    to: str
    data: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Revoke:
    """Publish that we revoke ``address``, and cut it off now.

    The driver records the revocation in the trust file first and passes the
    new content in (:meth:`Peer.trust_changed`)."""

    address: str


@dataclass(frozen=True, slots=True)
class Vouch:
    """Vouch for ``address`` into ``swarm`` (trust file updated by the driver)."""

    address: str
    swarm: str


@dataclass(frozen=True, slots=True)
class Leave:
    """Announce that this node leaves the membership (at shutdown)."""


@dataclass(frozen=True, slots=True)
class AcceptFeedLoss:
    """The operator gives up the part of the own feed no peer can supply
    (``hivemesh feed accept-loss``); replies with what was lost."""


@dataclass(frozen=True, slots=True)
class Request:
    """Send a request of ``kind`` to ``to``; replies with the handler's
    answer (NoHandler, RemoteProtocolError or DeadlineExceeded otherwise)."""

    to: str
    kind: str
    body: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Serve:
    """The driver handles requests (``plain``: plain ``{"type": kind}``
    messages) of ``kind``: they become ``Handle`` effects."""

    kind: str
    plain: bool = False


@dataclass(frozen=True, slots=True)
class Ping:
    """Ping linked peer ``to``; replies (None) when its pong arrives."""

    to: str
    timeout_ms: int
