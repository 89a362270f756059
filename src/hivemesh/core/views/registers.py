"""Max-registers: monotone integers for fencing tokens and epochs.

Theory of operation
-------------------
A fencing token must only ever grow: a side effect guarded by token ``t`` is
refused once any token ``> t`` has been seen. A last-writer-wins register is
the wrong tool (a concurrent write with a *smaller* token but a larger clock or
peer id would win and move the token backwards), so tokens live here instead.

Each ``reg.max`` event carries ``{"k": key, "v": value}``. The register's value
is the maximum ``v`` over every accepted event for ``k``: ``max`` is
commutative, associative and idempotent, so any order, duplication or split of
the same events gives the same value. The author of the maximum is kept for
diagnostics; equal values from two authors resolve to the larger author key.

To take the next token a writer reads :meth:`MaxRegisterView.next_value`, then
appends ``MaxRegisterView.encode(key, value)`` to its feed. Two writers that do
so concurrently may pick the same value; uniqueness needs a lease (see
``hivemesh.leases``), this view only guarantees monotonicity.

Rejected (counted, state unchanged): a body that is not a map with exactly a
string ``k`` matching :data:`KEY_PATTERN` (:class:`~hivemesh.errors.InvalidName`)
and an integer ``v`` in ``0 .. 2**63 - 1`` (:class:`~hivemesh.errors.DecodeError`).
"""

from __future__ import annotations

import re
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.core.views.base import ViewBase, state_digest
from hivemesh.errors import DecodeError, InvalidArgument, InvalidName, RemoteProtocolError

__all__ = ["KEY_PATTERN", "KIND_MAX", "MAX_VALUE", "MaxRegisterView"]

KIND_MAX = "reg.max"
#: Register keys: 1..128 characters of ``[A-Za-z0-9._:/-]``.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._:/-]{1,128}\Z")
MAX_VALUE = (1 << 63) - 1


def _parse(body: Any) -> tuple[str, int]:
    if type(body) is not dict or set(body) != {"k", "v"}:
        raise DecodeError("reg.max body must be {k, v}")
    key, value = body["k"], body["v"]
    if type(key) is not str or not KEY_PATTERN.match(key):
        raise InvalidName(f"bad register key {key!r:.80}")
    if type(value) is not int or not 0 <= value <= MAX_VALUE:
        raise DecodeError("reg.max value must be an int in 0..2**63-1")
    return key, value


class MaxRegisterView(ViewBase):
    """Grow-only integer registers: value = max over all events."""

    kinds = frozenset({KIND_MAX})

    def __init__(self) -> None:
        super().__init__()
        self._regs: dict[str, tuple[int, bytes]] = {}

    @staticmethod
    def encode(key: str, value: int) -> tuple[str, dict[str, Any]]:
        """The ``(kind, body)`` of an event raising ``key`` to at least ``value``."""
        try:
            _parse({"k": key, "v": value})
        except RemoteProtocolError as exc:
            raise InvalidArgument(str(exc)) from None
        return KIND_MAX, {"k": key, "v": value}

    def apply(self, event: Event) -> None:
        """Fold one ``reg.max`` event (never raises for bad bodies)."""
        if event.kind != KIND_MAX:
            return
        try:
            key, value = _parse(event.body)
        except RemoteProtocolError as exc:
            self._reject(exc)
            return
        cur = self._regs.get(key)
        if cur is None or (value, event.author) > cur:
            self._regs[key] = (value, event.author)
        self.applied += 1

    def value(self, key: str) -> int | None:
        """The current maximum for ``key``, or ``None`` if never written."""
        cur = self._regs.get(key)
        return None if cur is None else cur[0]

    def next_value(self, key: str) -> int:
        """One more than the current maximum (1 for a fresh register)."""
        cur = self.value(key)
        return 1 if cur is None else cur + 1

    def holder(self, key: str) -> str | None:
        """The address of the author of the current maximum."""
        cur = self._regs.get(key)
        return None if cur is None else address_of(cur[1])

    def snapshot(self) -> dict[str, int]:
        """``{key: value}`` for every register."""
        return {k: self._regs[k][0] for k in sorted(self._regs)}

    def digest(self) -> bytes:
        """Hash of every register's value and the author holding it."""
        return state_digest("reg.max", {k: [v, a] for k, (v, a) in sorted(self._regs.items())})
