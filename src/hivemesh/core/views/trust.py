"""Swarm-wide trust for invite-only swarms: scoped vouches in the journal.

Theory of operation
-------------------
A node's own ``trust.json`` (:class:`hivemesh.trust.TrustStore`) names the
peers *it* admitted -- its inviter, the nodes it invited, ``trust add`` --
and the **swarms** it belongs to: one it founded (at its first invite) and
each it joined. In a swarm of more than two the others must be admitted too,
so every admission is also published in the journal, signed by the node that
made it and scoped to one swarm:

* ``trust.add``    ``{"address": a, "swarm": s}`` -- the author brings ``a``
  into swarm ``s`` (an inviter, when its invite is redeemed; a joiner, for
  the inviter whose swarm it joined; ``trust add``, into the home swarm);
* ``trust.revoke`` ``{"address": a}`` -- the author revokes ``a``.

**Consent.** A node follows a vouch only into a swarm *it* belongs to, and
only from a member of that swarm. So when a member of swarm A joins swarm X,
its vouches into X (for its inviter) mean nothing to A's other nodes, and its
vouches into A mean nothing to X's: the two swarms share that one member and
nothing else, and neither admits the other's nodes. How far a node follows
vouches is its own policy (``trust_vouches``):

* ``web`` (default): the whole web of each of its swarms -- every member a
  member brought in, transitively; so a swarm grows by one invite per
  newcomer, from any member;
* ``direct``: vouches of the nodes it vouched for itself (two hops);
* ``none``: nobody's; only the addresses in its own ``trust.json``.

Revocations win: an address revoked locally, or by any admitted member, is
refused and its own vouches no longer count; a local ``trust add`` still
wins over another member's revocation. :class:`TrustWeb` is the result:
the admitted addresses, and the members of each swarm, which also decide
whose feeds a peer may see (a peer sees the feeds of the swarms it shares
with us: :meth:`TrustWeb.shares`). Vouches without a swarm (written before
swarms existed) are counted as ``unscoped`` and followed by nobody.

Only ``invite`` trust mode uses this; in ``open`` mode any authenticated
peer is admitted and a revocation is a local decision (otherwise any node
could evict the swarm). The view is pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of, public_key_of
from hivemesh.errors import InvalidAddress

__all__ = [
    "KIND_TRUST_ADD",
    "KIND_TRUST_REVOKE",
    "VOUCH_POLICIES",
    "TrustView",
    "TrustWeb",
    "is_swarm_id",
]

KIND_TRUST_ADD = "trust.add"
KIND_TRUST_REVOKE = "trust.revoke"
#: How far a node follows vouches (module docs), with the hops each allows.
VOUCH_POLICIES: dict[str, int | None] = {"web": None, "direct": 2, "none": 0}
_SWARM_ID = re.compile(r"[0-9a-f]{32}")


def is_swarm_id(value: object) -> bool:
    """True for a swarm id: 16 random bytes as 32 lower-case hex digits."""
    return isinstance(value, str) and _SWARM_ID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class TrustWeb:
    """Whom a node admits, and who is in each of its swarms."""

    #: addresses admitted (not this node itself)
    admitted: frozenset[str]
    #: addresses revoked, locally or by an admitted member
    revoked: frozenset[str]
    #: swarm id -> its members as this node sees them (this node included)
    swarms: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: address -> bit mask of the swarms (in ``swarms`` order) it is a member of
    masks: Mapping[str, int] = field(default_factory=dict)

    def shares(self, a: str, b: str) -> bool:
        """True if ``a`` and ``b`` are both members of one of our swarms."""
        return bool(self.masks.get(a, 0) & self.masks.get(b, 0))


class TrustView:
    """Scoped vouches and revocations from the journal (see module docs)."""

    kinds = frozenset({KIND_TRUST_ADD, KIND_TRUST_REVOKE})

    def __init__(self) -> None:
        #: author -> swarm -> addresses the author brought into that swarm
        self.vouches: dict[str, dict[str, set[str]]] = {}
        #: author -> addresses it revoked
        self.revokes: dict[str, set[str]] = {}
        self.rejected: Counter[str] = Counter()
        #: bumped by every event that changed the view
        self.version = 0

    def apply(self, event: Event) -> None:
        """Fold one trust event (never raises)."""
        body = event.body
        target = body.get("address") if isinstance(body, dict) else None
        try:
            if not isinstance(target, str):
                raise InvalidAddress("missing address")
            public_key_of(target)
        except InvalidAddress:
            self.rejected["malformed"] += 1
            return
        author = address_of(event.author)
        if event.kind == KIND_TRUST_REVOKE:
            self.revokes.setdefault(author, set()).add(target)
        else:
            swarm = body.get("swarm") if isinstance(body, dict) else None
            if swarm is None:
                self.rejected["unscoped"] += 1
                return
            if not is_swarm_id(swarm):
                self.rejected["malformed"] += 1
                return
            self.vouches.setdefault(author, {}).setdefault(swarm, set()).add(target)
        self.version += 1

    def evaluate(
        self,
        trusted: Iterable[str],
        revoked: Iterable[str],
        me: str,
        swarms: Iterable[str],
        policy: str = "web",
    ) -> TrustWeb:
        """The :class:`TrustWeb` of node ``me`` with local ``trusted`` and
        ``revoked`` addresses, member of ``swarms``, following ``policy``."""
        hops = VOUCH_POLICIES[policy]
        direct, local_revoked, ours = set(trusted), set(revoked), sorted(set(swarms))
        members = self._members(me, ours, hops, local_revoked)
        everyone = set().union(*members.values()) | (direct - local_revoked)
        all_revoked = set(local_revoked)
        for author in sorted(everyone):
            all_revoked |= self.revokes.get(author, set())
        all_revoked.discard(me)
        members = self._members(me, ours, hops, all_revoked)
        admitted = set().union(*members.values()) | (direct - local_revoked)
        admitted.discard(me)
        masks: dict[str, int] = {}
        for bit, swarm in enumerate(ours):
            for address in members[swarm]:
                masks[address] = masks.get(address, 0) | 1 << bit
        return TrustWeb(
            frozenset(admitted),
            frozenset(all_revoked),
            {s: frozenset(m) for s, m in members.items()},
            masks,
        )

    def _members(
        self, me: str, swarms: list[str], hops: int | None, excluded: set[str]
    ) -> dict[str, set[str]]:
        """Each swarm's members: a breadth-first walk of its vouches from ``me``."""
        out: dict[str, set[str]] = {}
        for swarm in swarms:
            members, frontier, depth = {me}, [me], 0
            while frontier and (hops is None or depth < hops):
                depth += 1
                found: list[str] = []
                for author in frontier:
                    for target in sorted(self.vouches.get(author, {}).get(swarm, ())):
                        if target not in members and target not in excluded:
                            members.add(target)
                            found.append(target)
                frontier = found
            out[swarm] = members
        return out
