"""The names view: human names bound to node addresses.

Theory of operation
-------------------
A node binds a name to its own address by appending ``name.claim`` with body
``{"n": name}`` to its feed and gives it up with ``name.release``
``{"n": name}``. The feed's head signature makes each claim a signed record:
nobody can claim a name *for* another address, and the address in a record is
always its event's author.

Per name, each author has at most one *live* claim: the ``hlc`` of its first
claim since its last release (claiming again while holding keeps the original
timestamp; releasing then claiming again starts a new, later claim). The
owner of a name is the live claim with the smallest ``(hlc, author)``: first
come, first served, ties to the smaller author key.

**Backdating does not win.** An author's ``hlc`` is its own word, so a claim
is ordered by ``order_hlc = max(hlc, first_witness - MAX_DRIFT_MS)``, where
``first_witness`` is when another node first testified, in its own feed, to
holding the claim (:mod:`hivemesh.core.witness`; nodes witness every
``name.claim`` they receive from others, in the same step). An honest claim
is witnessed within moments and keeps its own ``hlc``; a claim stamped
``hlc=1`` is ordered no earlier than ``MAX_DRIFT_MS`` (the clock bound)
before an honest node first saw it, so it cannot take a name held for longer
than that. A live claim that its own ``hlc`` would have made owner but the
rule did not is an attempted takeover: :meth:`NamesView.takeovers` lists
them (``hivemesh status`` counts and shows them). A claim nobody else has
witnessed yet (a one-node swarm, or events stored before this rule) keeps
its own ``hlc``.

Each author's live claims depend only on that author's own events, which the
journal applies in ``seq`` order, and witnesses are a set; the winner is a
``min`` over them. So the view is identical for every interleaving,
duplication-free replay or split of the same events. A claim that arrives
late, honestly stamped earlier, does take the name over: callers that need a
stable answer wait a settle window (as the planner does for claims).

Names must match :data:`NAME_PATTERN` (lowercase DNS-label style, 1..63
characters); anything else is rejected as :class:`~hivemesh.errors.InvalidName`.
"""

from __future__ import annotations

import re
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.hlc import MAX_DRIFT_MS
from hivemesh.core.identity import address_of, public_key_of
from hivemesh.core.views.base import ViewBase, state_digest
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex
from hivemesh.errors import DecodeError, InvalidArgument, InvalidName, RemoteProtocolError

__all__ = ["KIND_CLAIM", "KIND_RELEASE", "NAME_PATTERN", "NamesView"]

KIND_CLAIM = "name.claim"
KIND_RELEASE = "name.release"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")


def _parse(body: Any) -> str:
    if type(body) is not dict or set(body) != {"n"}:
        raise DecodeError("name body must be {n}")
    name = body["n"]
    if type(name) is not str or not NAME_PATTERN.match(name):
        raise InvalidName(f"bad name {name!r:.80}")
    return name


class NamesView(ViewBase):
    """name -> address: the live claim with the earliest ``(order_hlc, author)``."""

    kinds = frozenset({KIND_CLAIM, KIND_RELEASE, KIND_WITNESS})
    #: Kinds the node must witness for this view's order (core.witness).
    witnessed_kinds = frozenset({KIND_CLAIM})
    #: How much earlier than its first witness a claim may be ordered.
    window_ms = MAX_DRIFT_MS

    def __init__(self) -> None:
        super().__init__()
        # name -> author -> (hlc, seq) of its live claim
        self._claims: dict[str, dict[bytes, tuple[int, int]]] = {}
        self.witnesses = WitnessIndex(self.rejected)

    @staticmethod
    def claim(name: str) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` of an event claiming ``name`` for its author."""
        return KIND_CLAIM, {"n": _local(name)}

    @staticmethod
    def release(name: str) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` of an event releasing its author's claim."""
        return KIND_RELEASE, {"n": _local(name)}

    def apply(self, event: Event) -> None:
        """Fold one claim, release or witness (never raises for bad bodies)."""
        if event.kind == KIND_WITNESS:
            self.witnesses.apply(event)
            return
        if event.kind not in self.kinds:
            return
        try:
            name = _parse(event.body)
        except RemoteProtocolError as exc:
            self._reject(exc)
            return
        if event.kind == KIND_CLAIM:
            self._claims.setdefault(name, {}).setdefault(event.author, (event.hlc, event.seq))
        else:
            held = self._claims.get(name)
            if held is not None:
                held.pop(event.author, None)
                if not held:
                    del self._claims[name]
        self.applied += 1

    def _ordered(self, name: str) -> list[tuple[int, bytes, int]]:
        """Live claims on ``name`` as ``(order_hlc, author, hlc)``, winner first."""
        order = self.witnesses.order
        w = self.window_ms
        held = self._claims.get(name, {})
        return sorted((order(a, seq, h, w), a, h) for a, (h, seq) in held.items())

    def _winner(self, name: str) -> bytes | None:
        if not self._claims.get(name):
            return None
        return self._ordered(name)[0][1]

    def resolve(self, name: str) -> str | None:
        """The address that owns ``name``, or ``None``."""
        author = self._winner(name)
        return None if author is None else address_of(author)

    def names_of(self, address: str) -> list[str]:
        """The names ``address`` currently owns, sorted."""
        pub = public_key_of(address)
        return sorted(n for n in self._claims if self._winner(n) == pub)

    def claimants(self, name: str) -> list[tuple[int, str]]:
        """Every live claim on ``name`` as ``(hlc, address)``, winner first."""
        return [(h, address_of(a)) for _o, a, h in self._ordered(name)]

    def takeovers(self) -> list[dict[str, Any]]:
        """Attempted takeovers: live claims whose own ``hlc`` would own the name
        but whose first witness came too late for it (backdated, or unseen
        for longer than :attr:`window_ms`). Sorted by name, then claimant."""
        out: list[dict[str, Any]] = []
        for name in sorted(self._claims):
            ordered = self._ordered(name)
            owner_hlc, owner = ordered[0][2], ordered[0][1]
            for order_hlc, a, h in ordered[1:]:
                if (h, a) < (owner_hlc, owner):
                    out.append(
                        {
                            "name": name,
                            "claimant": address_of(a),
                            "owner": address_of(owner),
                            "claimed_hlc": h,
                            "ordered_hlc": order_hlc,
                        }
                    )
        return out

    def snapshot(self) -> dict[str, str]:
        """``{name: owner address}``."""
        out: dict[str, str] = {}
        for name in sorted(self._claims):
            addr = self.resolve(name)
            if addr is not None:
                out[name] = addr
        return out

    def digest(self) -> bytes:
        """Hash of every live claim in its order (which determines every owner)."""
        return state_digest(
            "names", {n: [[o, a, h] for o, a, h in self._ordered(n)] for n in self._claims}
        )


def _local(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidArgument(f"bad name {name!r:.80}: must match {NAME_PATTERN.pattern}")
    return name
