"""When a failed task starts again, and when it has hung: the supervisor's rules.

Theory of operation
-------------------
The driver runs every long-lived task under a supervisor
(:mod:`hivemesh.runtime.supervise`); what a failure *means* is decided here,
from the task's :class:`Policy` and the times passed in (seconds on the
driver's monotonic clock). No clock, no event loop, no I/O.

:class:`Restarts` keeps one task's failures within ``window_s``:

==============================================  ==============================
failure                                         verdict
==============================================  ==============================
the policy does not restart                     :class:`GiveUp` (fatal)
more than ``max_restarts`` within ``window_s``  :class:`GiveUp`, saying how
                                                many
otherwise, the n-th within the window           :class:`Restart` after
                                                ``backoff_min_s * 2**(n-1)``,
                                                at most ``backoff_max_s``
==============================================  ==============================

:func:`stalled_for` says whether a running task that beats has hung: no beat
for longer than ``stall_s``. :class:`TaskHealth` is one task's record
(running, failures, restarts, last error, beats): it reports a stall once,
until the task beats again, and says when a beat ends one.

:class:`Streak` says which failures in a row of an operation that is retried
(the group commit on a full disk, every few ms) are logged: the first, then
every :attr:`Streak.every`-th, and the end of the streak once it works again;
all are counted. The log must neither flood (it may be on the full disk) nor
hide the failure.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = [
    "FATAL",
    "RESTART",
    "RESTART_WATCHED",
    "GiveUp",
    "Policy",
    "Restart",
    "Restarts",
    "Streak",
    "TaskHealth",
    "stalled_for",
]


@dataclass(frozen=True, slots=True)
class Policy:
    """What a failure of a supervised task means (module docs)."""

    #: start the task again (else the first failure is fatal)
    restart: bool
    #: failures within ``window_s`` tolerated before the next is fatal
    max_restarts: int = 5
    window_s: float = 60.0
    backoff_min_s: float = 0.05
    backoff_max_s: float = 2.0
    #: if set, the task beats at least this often (seconds); a longer
    #: silence is a stall (:func:`stalled_for`)
    stall_s: float | None = None


#: Restart with backoff; fatal after more than 5 failures in 60 s.
RESTART = Policy(restart=True)
#: :data:`RESTART`, and a stall is reported after 30 s without a beat.
RESTART_WATCHED = Policy(restart=True, stall_s=30.0)
#: The first failure ends the daemon.
FATAL = Policy(restart=False)


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the task again after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The failure is fatal; ``why`` completes the message (may be empty)."""

    why: str


class Restarts:
    """One task's recent failures under ``policy`` (module docs)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._recent: deque[float] = deque()

    def failed(self, now_s: float) -> Restart | GiveUp:
        """The task failed at ``now_s``: restart it (after a delay) or give up."""
        p, recent = self.policy, self._recent
        recent.append(now_s)
        while recent and recent[0] < now_s - p.window_s:
            recent.popleft()
        if not p.restart:
            return GiveUp("")
        if len(recent) > p.max_restarts:
            return GiveUp(f" ({len(recent)} failures in {p.window_s:g} s)")
        return Restart(min(p.backoff_max_s, p.backoff_min_s * 2 ** (len(recent) - 1)))


def stalled_for(last_beat_s: float | None, now_s: float, stall_s: float) -> float | None:
    """How long a task has been silent, if that is longer than ``stall_s``
    (a stall); None while it beats often enough, or before its first beat."""
    if last_beat_s is None:
        return None
    quiet_s = now_s - last_beat_s
    return quiet_s if quiet_s > stall_s else None


class Streak:
    """Failures in a row of a retried operation: which to log (module docs)."""

    def __init__(self, every: int = 100) -> None:
        self.every = every
        #: failures since the last success (0: healthy)
        self.failing = 0

    def failed(self) -> bool:
        """One more failure; True if it is to be logged."""
        self.failing += 1
        return self.failing == 1 or self.failing % self.every == 0

    def ok(self) -> int:
        """A success: the length of the streak it ends (0 if none), to log."""
        ended, self.failing = self.failing, 0
        return ended


class TaskHealth:
    """One supervised task's record (module docs); times are ``now_s``."""

    def __init__(self) -> None:
        self.failures = 0
        self.restarts = 0
        self.running = False
        self.last_error = ""
        self.last_beat: float | None = None
        self.stalled = False

    def started(self, now_s: float) -> None:
        """The task (re)starts: running, and its silence counts from now."""
        self.running, self.last_beat = True, now_s

    def beat(self, now_s: float) -> bool:
        """The task made progress; True if that ends a reported stall."""
        self.last_beat = now_s
        ended, self.stalled = self.stalled, False
        return ended

    def stall(self, now_s: float, stall_s: float) -> float | None:
        """A stall to report now: how long the running task has been silent;
        None if it is not stalled, or that stall was reported already."""
        if not self.running or self.stalled:
            return None
        quiet_s = stalled_for(self.last_beat, now_s, stall_s)
        self.stalled = quiet_s is not None
        return quiet_s

    def failed(self, error: str) -> None:
        """The task failed with ``error`` (``Type: message``)."""
        self.failures += 1
        self.last_error = error

    def snapshot(self, now_s: float) -> dict[str, object]:
        """For ``status``: running, failures, restarts, last error, stalled, beat age."""
        beat = None if self.last_beat is None else round(now_s - self.last_beat, 3)
        return {
            "running": self.running,
            "failures": self.failures,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "stalled": self.stalled,
            "beat_s_ago": beat,
        }
