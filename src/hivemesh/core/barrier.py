"""The majority barrier's rules (``sync.majority``), sans-IO.

Theory of operation
-------------------
A barrier asks the swarm's lease voters for their journal's version vector
(the driver sends the requests and waits: :mod:`hivemesh.runtime.majority`);
:class:`Barrier` decides everything about the answers:

* an answer counts when it is a version vector (``{author hex: seq}``;
  malformed entries are dropped) and, with ``own_seq``, holds our feed at
  least that far -- otherwise the voter is asked again until the deadline;
* this node counts for itself when it is a voter; the barrier is reached
  once ``len(voters) // 2 + 1`` voters counted (any two majorities of the
  same voter set intersect);
* with ``pull``, the node must then hold every feed as far as the largest
  answer, except its own and those of authors it does not trust (it would
  never accept their events): :meth:`Barrier.missing` lists what it lacks.

No I/O, no clock: the driver passes what it got.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Barrier", "author_hex", "clean_vv"]


def author_hex(x: object) -> bool:
    """A feed id as a peer sends it: 64 lowercase hex digits."""
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def clean_vv(answer: Any) -> dict[str, int] | None:
    """The version vector in a ``journal.heads`` answer, malformed entries
    dropped; None when the answer holds none (a node without the handler)."""
    vv = answer.get("vv") if isinstance(answer, dict) else None
    if not isinstance(vv, dict):
        return None
    return {a: s for a, s in vv.items() if author_hex(a) and type(s) is int}


class Barrier:
    """One ``sync.majority`` barrier over ``voters`` (see module docs)."""

    def __init__(self, voters: Iterable[str], me: str, me_hex: str, own_seq: int | None) -> None:
        self.voters = sorted(voters)
        self.majority = len(self.voters) // 2 + 1
        self.me_hex = me_hex
        self.own_seq = own_seq
        self.answered: list[str] = [me] if me in self.voters else []
        self.others = [v for v in self.voters if v != me]
        self.target: dict[str, int] = {}

    def holds_own(self, vv: dict[str, int]) -> bool:
        """Whether ``vv`` satisfies the own-seq half (else ask that voter again)."""
        return self.own_seq is None or vv.get(self.me_hex, 0) >= self.own_seq

    def answer(self, voter: str, vv: dict[str, int]) -> None:
        """``voter`` answered with ``vv``, which :meth:`holds_own`."""
        self.answered.append(voter)
        for a, s in vv.items():
            self.target[a] = max(self.target.get(a, 0), s)

    @property
    def reached(self) -> bool:
        """A majority counted."""
        return len(self.answered) >= self.majority

    def missing(
        self, held: Callable[[str], int], trusted: Callable[[bytes], bool] | None
    ) -> dict[str, int]:
        """Feeds (author hex -> seq) this node holds less of than the majority
        answered (``held(author_hex)`` -> its seq), its own and untrusted ones aside."""
        return {
            a: s
            for a, s in sorted(self.target.items())
            if a != self.me_hex and (trusted is None or trusted(bytes.fromhex(a))) and held(a) < s
        }
