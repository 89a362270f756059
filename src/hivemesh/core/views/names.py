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

Each author's live claims depend only on that author's own events, which the
journal applies in ``seq`` order; the winner is a ``min`` over them. So the
view is identical for every interleaving, duplication-free replay or split of
the same events. A claim that arrives late with an earlier ``hlc`` does take
the name over: callers that need a stable answer wait a settle window (as the
planner does for claims).

Names must match :data:`NAME_PATTERN` (lowercase DNS-label style, 1..63
characters); anything else is rejected as :class:`~hivemesh.errors.InvalidName`.
"""

from __future__ import annotations

import re
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of, public_key_of
from hivemesh.core.views.base import ViewBase, state_digest
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
    """name -> address, earliest ``(hlc, author)`` live claim wins."""

    kinds = frozenset({KIND_CLAIM, KIND_RELEASE})

    def __init__(self) -> None:
        super().__init__()
        # name -> author -> hlc of its live claim
        self._claims: dict[str, dict[bytes, int]] = {}

    @staticmethod
    def claim(name: str) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` of an event claiming ``name`` for its author."""
        return KIND_CLAIM, {"n": _local(name)}

    @staticmethod
    def release(name: str) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` of an event releasing its author's claim."""
        return KIND_RELEASE, {"n": _local(name)}

    def apply(self, event: Event) -> None:
        """Fold one claim or release (never raises for bad bodies)."""
        if event.kind not in self.kinds:
            return
        try:
            name = _parse(event.body)
        except RemoteProtocolError as exc:
            self._reject(exc)
            return
        if event.kind == KIND_CLAIM:
            self._claims.setdefault(name, {}).setdefault(event.author, event.hlc)
        else:
            held = self._claims.get(name)
            if held is not None:
                held.pop(event.author, None)
                if not held:
                    del self._claims[name]
        self.applied += 1

    def _winner(self, name: str) -> bytes | None:
        held = self._claims.get(name)
        if not held:
            return None
        return min(held.items(), key=lambda ah: (ah[1], ah[0]))[0]

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
        held = self._claims.get(name, {})
        return [(h, address_of(a)) for a, h in sorted(held.items(), key=lambda ah: (ah[1], ah[0]))]

    def snapshot(self) -> dict[str, str]:
        """``{name: owner address}``."""
        out: dict[str, str] = {}
        for name in sorted(self._claims):
            addr = self.resolve(name)
            if addr is not None:
                out[name] = addr
        return out

    def digest(self) -> bytes:
        """Hash of every live claim (which determines every owner)."""
        return state_digest(
            "names",
            {n: sorted([h, a] for a, h in held.items()) for n, held in self._claims.items()},
        )


def _local(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidArgument(f"bad name {name!r:.80}: must match {NAME_PATTERN.pattern}")
    return name
