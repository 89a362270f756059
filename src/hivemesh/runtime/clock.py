"""The runtime's clock: wall-clock milliseconds, the time the core is given."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Wall-clock milliseconds (the time the core is given)."""
    return time.time_ns() // 1_000_000
