"""The runtime's clock: the time the Peer is given, in milliseconds.

Wall-clock time when the process started, advanced by the monotonic clock
since: hybrid logical clock stamps stay physical time, and a step of the
wall clock (an NTP jump, an operator's ``date -s``) never moves the Peer's
time backwards or forwards, so lease expiries and deadlines, which need only
rates, stay right.
"""

from __future__ import annotations

import time

__all__ = ["now_ms"]

_ANCHOR_NS = time.time_ns() - time.monotonic_ns()


def now_ms() -> int:
    """Milliseconds on the process's monotonic clock, anchored at wall-clock time."""
    return (time.monotonic_ns() + _ANCHOR_NS) // 1_000_000
