"""Majority barriers on the journal: "a majority holds my write", "I hold what a majority held".

Two halves of the same argument (a write quorum and a read quorum over the
swarm's lease voters intersect):

* ``own_seq`` -- wait until a majority of the voters hold this node's feed
  up to ``own_seq``: an event confirmed this way is seen by any later
  ``pull`` barrier, on any node.
* ``pull`` -- ask the voters for their version vectors; once a majority
  answered, wait until this node holds every feed at least as far as any of
  them did. Everything a majority held before the barrier started is then
  in this node's views.

Both have a deadline (``timeout_s``); ``deadline_exceeded`` means no
majority answered (or the missing events did not arrive) in time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command, Reply, check_timeout
from hivemesh.errors import InvalidArgument

__all__ = ["SyncMajority", "SyncMajorityReply"]


@dataclass(frozen=True, slots=True)
class SyncMajorityReply(Reply):
    """The voters, the majority needed, and who answered in time (addresses)."""

    voters: int
    majority: int
    answered: list[str]


@dataclass(frozen=True, slots=True)
class SyncMajority(Command):
    """A majority barrier on the journal (see module docs)."""

    op: ClassVar[str] = "sync.majority"
    reply: ClassVar[type[Reply]] = SyncMajorityReply
    errors: ClassVar[tuple[str, ...]] = ("backend_unavailable",)
    own_seq: int | None = None
    pull: bool = False
    timeout_s: float = 5.0

    def check(self) -> None:
        """One of the two barriers at least; a positive seq; the deadline's range."""
        check_timeout(self.op, self.timeout_s)
        if self.own_seq is None and not self.pull:
            raise InvalidArgument("sync.majority: give own_seq, pull, or both")
        if self.own_seq is not None and self.own_seq < 1:
            raise InvalidArgument("sync.majority: own_seq must be a positive int")
