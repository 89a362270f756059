"""The Peer's commands that no face offers: drivers issue them.

Every command a :class:`~hivemesh.core.peer.Peer` answers is a
:class:`~hivemesh.commands.Command`: the public ones of
:data:`hivemesh.commands.COMMANDS` (``append``, ``claim``, ``lease.acquire``,
``send``, ``ping``, ...) and these, which a driver sends on behalf of its
node's parts (the daemon's blob store, message handlers, trust and
shutdown). They have a wire name like the others, for logs and traces, but
are not in the table: no client may send them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hivemesh.commands._base import Command

__all__ = [
    "AppendMany",
    "CommitContext",
    "FetchBlob",
    "Learn",
    "Leave",
    "Request",
    "Resolve",
    "Serve",
    "StartJoin",
    "Vouch",
]


@dataclass(frozen=True, slots=True)
class AppendMany(Command):
    """Append ``items`` (``(kind, body)`` pairs) to the own feed in one batch
    (the daemon's local writes: context updates); replies with the events."""

    op: ClassVar[str] = "append.many"
    items: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class CommitContext(Command):
    """Append ``items``, the shared context's local writes exported by the
    driver, to the own feed in one batch; replies with how many. Writes the
    feed does not take go back to pending (:func:`hivemesh.core.answers.commit_items`)."""

    op: ClassVar[str] = "ctx.commit"
    items: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class FetchBlob(Command):
    """Reply with the bytes of blob ``digest``: held, or fetched from holders."""

    op: ClassVar[str] = "blob.fetch"
    digest: bytes
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Request(Command):
    """Send a request of ``kind`` to ``to``; replies with the handler's
    answer (NoHandler, RemoteProtocolError or DeadlineExceeded otherwise)."""

    op: ClassVar[str] = "request"
    to: str
    kind: str
    body: Any
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Resolve(Command):
    """Reply with the address of ``target`` (an address, or a claimed name),
    waiting up to ``timeout_s`` for a name this node does not know yet (a
    fresh node learns names as it catches up); DeadlineExceeded then."""

    op: ClassVar[str] = "resolve"
    target: str
    timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Serve(Command):
    """The driver handles requests (``plain``: plain ``{"type": kind}``
    messages) of ``kind``: they become ``Handle`` effects."""

    op: ClassVar[str] = "serve"
    kind: str
    plain: bool = False


@dataclass(frozen=True, slots=True)
class StartJoin(Command):
    """Join through ``inviter`` at ``endpoints`` with ``proof`` (a token the
    driver checked: :mod:`hivemesh.core.joins`); replies ``{inviter,
    endpoints, seconds}`` once it admitted this node, or with the cause."""

    op: ClassVar[str] = "join.start"
    inviter: str
    endpoints: tuple[str, ...]
    proof: bytes
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Vouch(Command):
    """Vouch for ``address`` into ``swarm`` (trust file updated by the driver)."""

    op: ClassVar[str] = "trust.vouch"
    address: str
    swarm: str


@dataclass(frozen=True, slots=True)
class Learn(Command):
    """The driver found ``address`` at ``endpoints`` (mDNS, an admission, the
    endpoints view at start): the Peer dials it (a ``Dial`` effect) if it
    may connect and is not this node."""

    op: ClassVar[str] = "endpoints.learn"
    address: str
    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Leave(Command):
    """Announce that this node leaves the membership (at shutdown)."""

    op: ClassVar[str] = "leave"
