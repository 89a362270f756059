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

Adoption: what the driver does with both channels
-------------------------------------------------
:meth:`Lives.adopt` turns the verdict into an :class:`Adoption`, everything
the driver (:mod:`hivemesh.runtime.connections`) then carries out: the fate
of the newcomer (:class:`New`), of the peer's current link (:class:`Old`),
of frames held for a handover (:class:`Held`), whether the peer is reported
down and up, and the counters to bump. The current link is *open*, *ended
superseded* (the peer retired it with CLOSE ``channel_superseded``, its
reader not run yet) or *ended* otherwise (:class:`State`)::

    newcomer / link                          new     old          reported
    already retired by the peer              DRAIN   -            -
    STALE                                    REFUSE  -            -
    KEEP                                     RETIRE  -            -
    SWITCH (open link, better rank)          LINK    RETIRE       -
    no link                                  LINK    -            up
    ended link, another life (or RESTART)    LINK    RESTARTED    down, up
    ended superseded link, same life         LINK    HANDED_OVER  -
    ended link, same life                    LINK    ENDED        down, up

*Retiring loses nothing silently*: a retired channel is half-closed, keeps
reading until the peer closes, and its unsent frames move to the winner
(RETIRE, HANDED_OVER). The peer may read our CLOSE ``channel_superseded``
while the retired channel is still its only link (its own winning dial has
not returned yet): it then holds frames for us in a bounded
:class:`Handover` instead of reporting us down. When the newcomer arrives
with a handover open, its frames MOVE to it if it is of the same life; if
the peer restarted meanwhile they are DROPped and the peer is reported down
and up. A link whose channel ended never wins a tie-break: it is replaced.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from hivemesh.core.identity import short

__all__ = [
    "MAX_LIVES",
    "MAX_PEERS",
    "Adoption",
    "Handover",
    "Held",
    "Link",
    "Lives",
    "New",
    "Old",
    "Rank",
    "State",
    "Verdict",
    "channel_rank",
    "path_words",
]

#: Boot ids remembered per peer.
MAX_LIVES = 8
#: Peers whose boot ids are remembered.
MAX_PEERS = 4096

#: A channel's tie-break rank (smaller wins): see :func:`channel_rank`.
Rank = tuple[int, bytes]


def path_words(path: str) -> str:
    """A channel's path (``tcp``, ``udp``, ``relay:<address>``, ...) in words:
    ``direct TCP``, ``direct UDP``, ``relayed via <relay>``, or as given."""
    if path.startswith("relay:"):
        return f"relayed via {short(path[6:])}"
    return {"tcp": "direct TCP", "udp": "direct UDP"}.get(path, path)


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


class State(enum.Enum):
    """A current link's state (see :meth:`Lives.adopt`)."""

    OPEN = "open"
    SUPERSEDED = "superseded"  # ended: the peer retired it for a better channel
    ENDED = "ended"  # ended otherwise (EOF, error), its reader not run yet


class New(enum.Enum):
    """What becomes of the newcomer."""

    LINK = "link"  # it becomes the peer's link
    RETIRE = "retire"  # half-closed: a better link exists (KEEP)
    REFUSE = "refuse"  # closed with ``stale_boot`` (STALE)
    DRAIN = "drain"  # already retired by the peer: read what arrived, never the link


class Old(enum.Enum):
    """What becomes of the peer's current link."""

    NONE = "none"  # none, or it stays the link
    RETIRE = "retire"  # half-closed; its unsent frames move to the newcomer
    RESTARTED = "restarted"  # a previous life's: closed now (``peer_restarted``)
    HANDED_OVER = "handed_over"  # retired by the peer for the newcomer: unsent frames move
    ENDED = "ended"  # ended otherwise: discarded


class Held(enum.Enum):
    """What becomes of frames held for a handover."""

    NONE = "none"  # no handover was open
    MOVE = "move"  # onto the newcomer: the winner came
    DROP = "drop"  # counted ``dropped_on_close``: the peer restarted meanwhile


@dataclass(frozen=True, slots=True)
class Link:
    """What the rule needs to know of a peer's current link."""

    boot_id: bytes
    rank: Rank
    state: State = State.OPEN


@dataclass(frozen=True, slots=True)
class Adoption:
    """The plan for a new channel (module docs' second table)."""

    verdict: Verdict | None  # None: the newcomer was already retired (DRAIN)
    new: New
    old: Old = Old.NONE
    held: Held = Held.NONE
    down: bool = False  # report the peer down (before up)
    up: bool = False  # report the peer up
    counters: tuple[str, ...] = ()


@dataclass(slots=True)
class Handover:
    """Frames held for a peer that retired our only link, until its winner
    comes (bounded like a send queue: :meth:`hold` refuses past the bounds)."""

    max_frames: int
    max_bytes: int
    boot_id: bytes  # the life of the peer that retired our link
    opened_mono: float  # when the retired link opened
    frames: deque[bytes] = field(default_factory=deque)
    nbytes: int = 0

    def hold(self, frame: bytes) -> bool:
        """Hold ``frame``; False (nothing held) when it does not fit."""
        if len(self.frames) >= self.max_frames or self.nbytes + len(frame) > self.max_bytes:
            return False
        self.frames.append(frame)
        self.nbytes += len(frame)
        return True


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

    def adopt(
        self,
        peer: str,
        boot_id: bytes,
        rank: Rank,
        link: Link | None,
        *,
        handover: bytes | None = None,
        sending: bool = True,
    ) -> Adoption:
        """The plan for a new channel from ``peer`` (module docs' second table).

        ``link``: the peer's current link, open or ended; ``handover``: the
        boot id of the life whose frames are held for a handover, if one is
        open; ``sending``: False when the peer already retired the newcomer.
        """
        if not sending:
            return Adoption(None, New.DRAIN, counters=("channel_ended_before_adopt",))
        is_open = link is not None and link.state is State.OPEN
        verdict = self.judge(peer, boot_id, rank, link if is_open else None)
        if verdict is Verdict.STALE:
            return Adoption(verdict, New.REFUSE, counters=("stale_boot_refused",))
        if verdict is Verdict.KEEP:
            return Adoption(verdict, New.RETIRE, counters=("duplicate_channel_closed",))
        counters: list[str] = []
        old, restarted = Old.NONE, False
        if verdict is Verdict.SWITCH:
            old = Old.RETIRE
            counters.append("channel_replaced")
        elif link is not None:  # RESTART, or ADOPT past an ended link
            if link.boot_id != boot_id:
                old, restarted = Old.RESTARTED, True
                counters.append("peer_restarted")
            elif link.state is State.SUPERSEDED:
                old = Old.HANDED_OVER
                counters.append("handover_completed")
            else:
                old, restarted = Old.ENDED, True
        held = Held.NONE
        if handover is not None:
            if handover != boot_id:  # its winner never comes: the peer restarted
                held, restarted = Held.DROP, True
                counters.append("peer_restarted")
            else:
                held = Held.MOVE
                counters.append("handover_completed")
        up = (link is None or restarted) and held is not Held.MOVE
        return Adoption(verdict, New.LINK, old, held, restarted, up, tuple(counters))

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
