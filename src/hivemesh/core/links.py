"""Which channel carries a peer's link: the rule, as a table (sans-IO).

Theory of operation
-------------------
A node keeps one channel per peer address, its *link*. Every channel comes
with the peer's **boot id**, random per start of the peer and proven in the
handshake (:mod:`hivemesh.transports.noise`). When a new authenticated
channel arrives from a peer that has an open link, the boot ids tell apart
three cases, and :meth:`Lives.judge` returns what to do::

    link      newcomer's life                verdict
    none      any                            ADOPT    it becomes the link
    open      same as the link's, ranks less SWITCH   it replaces the link (dial race)
    open      same as the link's, ranks more KEEP     it is retired (dial race)
    open      later than the link's          RESTART  the peer restarted: the link is
                                                      its previous life's, half-open;
                                                      close it now, adopt the newcomer
    open      earlier than the link's        STALE    a dial delayed from before the
                                                      restart: refuse it

*Same life* is the simultaneous-dial case: both ends keep the channel of
smaller :func:`channel_rank` (dialled by the pair's smaller address first,
then the handshake hash), a total order both ends compute alike.

*Later* and *earlier*: boot ids are random, so they carry no order of their
own. The order is the one in which this node first saw them, per peer: a boot
id never seen before is the newest life. :class:`Lives` remembers the last
:data:`MAX_LIVES` boot ids of up to :data:`MAX_PEERS` peers (least recently
judged forgotten first), so its memory is bounded however many identities
connect.

Assumption: one process per identity. Where the order can be wrong: a dial
from a life this node never saw, delayed until after the channel of a newer
life (a restart in the middle of a handshake). It is then taken as newest and
replaces the live link, and the live life is refused as STALE while the
wrongly adopted link lasts: until the dead process's host resets it (at once,
if the host is up) or the failure detector drops it as silent. That costs one
failure detection, never a lock-out, since with no open link any life is
adopted. Two processes sharing one key (a misconfiguration) settle the same
way: the one seen first is refused while the other's link is up.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = [
    "MAX_LIVES",
    "MAX_PEERS",
    "Link",
    "Lives",
    "Rank",
    "Verdict",
    "channel_rank",
]

#: Boot ids remembered per peer.
MAX_LIVES = 8
#: Peers whose boot ids are remembered.
MAX_PEERS = 4096

#: A channel's tie-break rank (smaller wins): see :func:`channel_rank`.
Rank = tuple[int, bytes]


def channel_rank(
    local: str, peer: str, dialer: str, handshake_hash: bytes, *, relayed: bool = False
) -> Rank:
    """The tie-break rank of a channel between ``local`` and ``peer`` (smaller wins).

    Both ends compute the same value for the same channel: a direct channel
    before a relayed one (both ends know a channel is relayed: it runs
    through a relay circuit on both), then the pair's smaller address
    dialling first, then the Noise handshake hash. So a punched or direct
    channel replaces a relayed link in place.
    """
    first = 0 if dialer == min(local, peer) else 1
    return ((2 if relayed else 0) + first, bytes(handshake_hash))


class Verdict(enum.Enum):
    """What to do with a new channel (see the module docs' table)."""

    ADOPT = "adopt"
    SWITCH = "switch"
    KEEP = "keep"
    RESTART = "restart"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class Link:
    """What the rule needs to know of a peer's open link."""

    boot_id: bytes
    rank: Rank


class Lives:
    """Per peer, the boot ids seen, in the order first seen (see module docs)."""

    def __init__(self, *, max_peers: int = MAX_PEERS, max_lives: int = MAX_LIVES) -> None:
        self._max_peers = max_peers
        self._max_lives = max_lives
        self._lives: OrderedDict[str, deque[bytes]] = OrderedDict()

    def judge(self, peer: str, boot_id: bytes, rank: Rank, link: Link | None) -> Verdict:
        """The verdict on a new channel from ``peer`` (``link``: its open link,
        if any). Records ``boot_id`` as seen; it never changes the order of
        boot ids seen before."""
        newcomer = self._see(peer, boot_id)
        if link is None:
            return Verdict.ADOPT
        if boot_id == link.boot_id:
            return Verdict.SWITCH if rank < link.rank else Verdict.KEEP
        current = self._index(peer, link.boot_id)
        if current is None or newcomer > current:
            return Verdict.RESTART
        return Verdict.STALE

    def lives(self, peer: str) -> tuple[bytes, ...]:
        """The boot ids seen from ``peer``, oldest first."""
        return tuple(self._lives.get(peer, ()))

    def forget(self, peer: str) -> None:
        """Drop what is known of ``peer`` (revoked, forgotten)."""
        self._lives.pop(peer, None)

    def __len__(self) -> int:
        return len(self._lives)

    def _see(self, peer: str, boot_id: bytes) -> int:
        """Record ``boot_id`` for ``peer``; return its position (oldest 0)."""
        lives = self._lives.get(peer)
        if lives is None:
            lives = self._lives[peer] = deque(maxlen=self._max_lives)
            while len(self._lives) > self._max_peers:
                self._lives.popitem(last=False)
        else:
            self._lives.move_to_end(peer)
        if boot_id not in lives:
            lives.append(boot_id)
        return lives.index(boot_id)

    def _index(self, peer: str, boot_id: bytes) -> int | None:
        lives = self._lives.get(peer, ())
        return lives.index(boot_id) if boot_id in lives else None
