"""Small views the simulator uses to compare replicas."""

from __future__ import annotations

from hivemesh.core.event import Event

__all__ = ["EventSetDigest"]


class EventSetDigest:
    """An order-independent digest of the set of applied events (XOR of ids)."""

    kinds = frozenset({"*"})

    def __init__(self) -> None:
        self.acc = 0
        self.count = 0

    def apply(self, event: Event) -> None:
        """Fold one event id in."""
        self.acc ^= int.from_bytes(event.id, "big")
        self.count += 1

    def digest(self) -> bytes:
        """Digest of the applied set."""
        return self.acc.to_bytes(32, "big") + self.count.to_bytes(8, "big")
