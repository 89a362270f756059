"""The contract between the journal and its views.

Theory of operation
-------------------
A *view* is a deterministic reducer over the swarm journal. The journal calls
:meth:`View.apply` exactly once for every accepted event whose ``kind`` is in
:attr:`View.kinds` (exact match, no prefixes), in per-author ``seq`` order but
in *any* interleaving across authors. Every view in this package is written so
that its visible state depends only on the *set* of events applied, never on
that interleaving: two replicas that applied the same events have equal
:meth:`View.digest` values.

``apply`` never raises for bad input. A body that is malformed, forged or out
of order is *rejected*: the view's state is left unchanged and
``rejected[error.code] += 1`` records it (codes come from
:mod:`hivemesh.errors`). Rejection itself is deterministic (it depends on the
event and on the same author's earlier events only), so replicas agree on what
was rejected too.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Protocol, runtime_checkable

from hivemesh.core.codec import pack
from hivemesh.core.event import Event
from hivemesh.errors import RemoteProtocolError

__all__ = ["View", "ViewBase", "canonical", "state_digest"]


@runtime_checkable
class View(Protocol):
    """What the journal needs from a view."""

    #: Event kinds this view consumes (exact match).
    kinds: frozenset[str]
    #: Rejected events, by :attr:`hivemesh.errors.HivemeshError.code`.
    rejected: Counter[str]

    def apply(self, event: Event) -> None:
        """Fold one accepted event into the view. Never raises for bad bodies."""
        ...

    def digest(self) -> bytes:
        """A 32-byte hash of the visible state; equal on agreeing replicas."""
        ...

    def snapshot(self) -> Any:
        """The visible state as plain Python data (dicts, lists, scalars)."""
        ...


def canonical(obj: Any) -> Any:
    """``obj`` with every dict's keys sorted (recursively), tuples as lists.

    Dicts coming out of loro or built from sets iterate in an order that may
    differ between replicas; msgpack keeps that order, so sort before hashing.
    """
    if isinstance(obj, dict):
        items = sorted(obj.items(), key=lambda kv: (type(kv[0]).__name__, kv[0]))
        return {k: canonical(v) for k, v in items}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def state_digest(tag: str, state: Any) -> bytes:
    """``blake2b-256(tag || msgpack(canonical(state)))``."""
    h = hashlib.blake2b(digest_size=32)
    h.update(tag.encode() + b"\x00")
    h.update(pack(canonical(state)))
    return h.digest()


class ViewBase:
    """Shared plumbing: the ``rejected`` counter and a count of applied events."""

    kinds: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.rejected: Counter[str] = Counter()
        #: Events folded into the view (accepted, not rejected).
        self.applied = 0

    def _reject(self, exc: RemoteProtocolError) -> None:
        self.rejected[exc.code] += 1
