"""Swarm-wide trust for invite-only swarms: vouches and revocations in the journal.

Theory of operation
-------------------
A node's own ``trust.json`` (:class:`hivemesh.trust.TrustStore`) only names
the peers *it* admitted: its inviter, the nodes it invited. In a swarm of
more than two, the others must be admitted too, or the mesh degenerates into
a star and their events are refused as untrusted. So every admission and
revocation is also published in the journal, signed by the node that made it:

* ``trust.add``    ``{"address": a}`` -- the author vouches for ``a``;
* ``trust.revoke`` ``{"address": a}`` -- the author revokes ``a``.

:class:`TrustView` folds them. A node admits an address when it is in the
*web of trust* grown from its own trusted set: a vouch counts if its author
is already admitted. Revocations win: an address revoked locally, or by any
admitted member, is refused, and its own vouches no longer count. The
computation is a closure over the (small) sets of members, recomputed only
when a trust event or the local trust file changes.

Only ``invite`` trust mode uses this; in ``open`` mode any authenticated
peer is admitted and a revocation is a local decision (otherwise any node
could evict the swarm).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of, public_key_of
from hivemesh.errors import InvalidAddress

__all__ = ["KIND_TRUST_ADD", "KIND_TRUST_REVOKE", "TrustView"]

KIND_TRUST_ADD = "trust.add"
KIND_TRUST_REVOKE = "trust.revoke"


class TrustView:
    """Vouches and revocations from the journal (see module docs)."""

    kinds = frozenset({KIND_TRUST_ADD, KIND_TRUST_REVOKE})

    def __init__(self) -> None:
        self.vouches: dict[str, set[str]] = {}  # author -> addresses it vouched for
        self.revokes: dict[str, set[str]] = {}  # author -> addresses it revoked
        self.rejected: Counter[str] = Counter()
        self.version = 0
        self._cache: tuple[Any, frozenset[str], frozenset[str]] | None = None

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
        table = self.vouches if event.kind == KIND_TRUST_ADD else self.revokes
        table.setdefault(author, set()).add(target)
        self.version += 1

    def evaluate(
        self, trusted: Iterable[str], revoked: Iterable[str], me: str
    ) -> tuple[frozenset[str], frozenset[str]]:
        """``(admitted, revoked)`` grown from the local trust sets."""
        key = (self.version, tuple(sorted(trusted)), tuple(sorted(revoked)), me)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1], self._cache[2]
        local_revoked = set(key[2])
        admitted = self._closure(set(key[1]) | {me}, local_revoked)
        all_revoked = set(local_revoked)
        for author in sorted(admitted):
            all_revoked |= self.revokes.get(author, set())
        all_revoked.discard(me)
        admitted = self._closure(set(key[1]) | {me}, all_revoked)
        result = (frozenset(admitted - {me}), frozenset(all_revoked))
        self._cache = (key, result[0], result[1])
        return result

    def _closure(self, roots: set[str], excluded: set[str]) -> set[str]:
        admitted = {a for a in roots if a not in excluded}
        frontier = sorted(admitted)
        while frontier:
            author = frontier.pop()
            for target in sorted(self.vouches.get(author, ())):
                if target not in admitted and target not in excluded:
                    admitted.add(target)
                    frontier.append(target)
        return admitted
