"""Where nodes listen: a view over ``node.hello`` events.

Every node appends ``node.hello`` ``{"listen": ["host:port", ...]}`` to its own
feed when it starts on a new endpoint (not on every start: an unchanged
endpoint is not re-announced). The journal replicates it like any event, so
every node learns every other node's endpoints from the journal alone, and a
restarted node can redial the swarm from its own store even when its
bootstrap address is gone. The latest hello of an author (by ``(hlc, seq)``)
wins; malformed bodies are counted and ignored.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of

__all__ = ["KIND_HELLO", "EndpointsView", "hello_body"]

KIND_HELLO = "node.hello"
_MAX_ENDPOINTS = 8


def hello_body(endpoints: list[str]) -> dict[str, Any]:
    """The body of a ``node.hello`` event announcing ``endpoints``."""
    return {"listen": list(endpoints)}


class EndpointsView:
    """``address -> [host:port, ...]`` from the newest hello of each author."""

    kinds = frozenset({KIND_HELLO})

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, int, list[str]]] = {}
        self.rejected: Counter[str] = Counter()

    def apply(self, event: Event) -> None:
        """Fold one ``node.hello`` event in (never raises)."""
        body = event.body
        listen = body.get("listen") if isinstance(body, dict) else None
        if (
            not isinstance(listen, list)
            or len(listen) > _MAX_ENDPOINTS
            or not all(isinstance(e, str) and 3 <= len(e) <= 300 and ":" in e for e in listen)
        ):
            self.rejected["malformed"] += 1
            return
        addr = address_of(event.author)
        old = self._latest.get(addr)
        if old is None or (event.hlc, event.seq) > (old[0], old[1]):
            self._latest[addr] = (event.hlc, event.seq, list(listen))

    def endpoints(self, address: str) -> list[str]:
        """The endpoints ``address`` last announced (empty if unknown)."""
        got = self._latest.get(address)
        return list(got[2]) if got else []

    def known(self) -> dict[str, list[str]]:
        """Every announced ``address -> endpoints``, sorted by address."""
        return {a: list(self._latest[a][2]) for a in sorted(self._latest)}
