"""hivemesh: a leaderless coordination fabric for teams of AI agents.

Every node keeps a signed, hash-chained feed of what it did; the swarm journal
is the union of feeds; all shared state is a deterministic view over it.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
