"""Fleet health: turn membership and metrics into deduplicated alerts.

Theory of operation
-------------------
:class:`HealthMonitor` is pure logic (no I/O, no clock): each call to
:meth:`HealthMonitor.evaluate` gets a snapshot -- the membership view (node
state and last heartbeat), per-agent and per-tool call counts, failures and
p99 latency over a recent window, and each sender's spool backlog -- plus
``now_ms``, and returns the alert **transitions** it caused.

Rules (thresholds in :class:`Thresholds`), each with a stable dedup key:

=================  ==================================  ========================
rule               fires when                          key
=================  ==================================  ========================
``node_down``      membership says the node is dead    ``node_down:<address>``
``no_heartbeat``   alive/suspect but silent too long   ``no_heartbeat:<address>``
``error_rate``     failures/calls above the threshold  ``error_rate:<by>:<key>``
                   (with at least ``min_calls``)
``latency``        p99 above the threshold             ``latency:<by>:<key>``
``backlog``        a sender's spool backlog above the  ``backlog:<sender>``
                   limit, or grown in each of the
                   last ``backlog_growth_evals`` evals
=================  ==================================  ========================

An alert fires once when its condition appears (a condition that persists
does not fire again: deduplication by key) and resolves once when the
condition has been absent for ``resolve_after_ms`` (hysteresis against
flapping). Transitions go to the notifiers (:mod:`.alerting`) and the store
(``hivemesh alerts``). State is plain data, so a restarted monitor can be
rebuilt from the stored alerts with :meth:`HealthMonitor.restore`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Literal

__all__ = ["Alert", "CallStats", "HealthMonitor", "NodeStatus", "Thresholds", "Transition"]

Severity = Literal["critical", "error", "warning", "info"]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One member as the membership view sees it."""

    address: str
    state: Literal["alive", "suspect", "dead"]
    last_heartbeat_ms: int
    name: str = ""
    #: The node's telemetry spool backlog as its heartbeat reports it (None if unknown):
    #: the only way to see a backlog grow while the collector is unreachable.
    spool_backlog: int | None = None


@dataclass(frozen=True, slots=True)
class CallStats:
    """Calls of one agent or tool over the health window."""

    by: Literal["agent", "tool"]
    key: str
    calls: int
    failures: int
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When rules fire."""

    heartbeat_timeout_ms: int = 30_000
    error_rate: float = 0.2
    min_calls: int = 10
    latency_p99_ms: float = 60_000.0
    backlog_max: int = 50_000
    backlog_growth_evals: int = 5
    backlog_growth_min: int = 1_000
    resolve_after_ms: int = 0
    window_ms: int = 300_000


@dataclass(frozen=True, slots=True)
class Alert:
    """A firing (or just resolved) alert."""

    key: str
    rule: str
    subject: str
    severity: Severity
    summary: str
    value: float
    started_ms: int
    updated_ms: int
    status: Literal["firing", "resolved"] = "firing"

    def as_row(self) -> dict[str, Any]:
        """The dict stored in the ``alerts`` table."""
        return {
            "key": self.key,
            "rule": self.rule,
            "subject": self.subject,
            "severity": self.severity,
            "status": self.status,
            "summary": self.summary,
            "value": self.value,
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
        }


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert that started firing or was resolved at ``at_ms``."""

    alert: Alert
    status: Literal["firing", "resolved"]
    at_ms: int


@dataclass
class _Cond:
    rule: str
    subject: str
    severity: Severity
    summary: str
    value: float


@dataclass
class HealthMonitor:
    """Evaluates health snapshots into alert transitions; see the module docstring."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    _active: dict[str, Alert] = field(default_factory=dict)
    _clear_since: dict[str, int] = field(default_factory=dict)
    _backlogs: dict[str, list[int]] = field(default_factory=dict)

    def active(self) -> list[Alert]:
        """Firing alerts, sorted by key."""
        return [self._active[k] for k in sorted(self._active)]

    def restore(self, alerts: Iterable[Mapping[str, Any]]) -> None:
        """Re-adopt firing alerts from the store (after a restart)."""
        for a in alerts:
            if a.get("status") == "firing":
                self._active[str(a["key"])] = Alert(
                    key=str(a["key"]), rule=str(a["rule"]), subject=str(a["subject"]),
                    severity=a["severity"], summary=str(a["summary"]),
                    value=float(a["value"] or 0.0), started_ms=int(a["started_ms"]),
                    updated_ms=int(a["updated_ms"]),
                )  # fmt: skip

    def evaluate(
        self,
        now_ms: int,
        members: Sequence[NodeStatus] = (),
        calls: Sequence[CallStats] = (),
        backlogs: Mapping[str, int] | None = None,
    ) -> list[Transition]:
        """Apply the rules to one snapshot; return new firing and resolved transitions."""
        merged = dict(backlogs or {})
        for m in members:
            if m.spool_backlog is not None:
                merged[m.address] = max(merged.get(m.address, 0), m.spool_backlog)
        conds = self._conditions(now_ms, members, calls, merged)
        out: list[Transition] = []
        for key in sorted(conds):
            c = conds[key]
            self._clear_since.pop(key, None)
            cur = self._active.get(key)
            if cur is None:
                alert = Alert(
                    key, c.rule, c.subject, c.severity, c.summary, c.value, now_ms, now_ms
                )
                self._active[key] = alert
                out.append(Transition(alert, "firing", now_ms))
            else:
                self._active[key] = replace(
                    cur, value=c.value, summary=c.summary, updated_ms=now_ms
                )
        hold = self.thresholds.resolve_after_ms
        for key in sorted(set(self._active) - set(conds)):
            since = self._clear_since.setdefault(key, now_ms)
            if now_ms - since >= hold:
                cur = self._active.pop(key)
                self._clear_since.pop(key, None)
                done = replace(cur, status="resolved", updated_ms=now_ms)
                out.append(Transition(done, "resolved", now_ms))
        return out

    def _conditions(
        self,
        now_ms: int,
        members: Sequence[NodeStatus],
        calls: Sequence[CallStats],
        backlogs: Mapping[str, int],
    ) -> dict[str, _Cond]:
        th = self.thresholds
        conds: dict[str, _Cond] = {}
        for m in sorted(members, key=lambda m: m.address):
            label = m.name or m.address[:12]
            silent = now_ms - m.last_heartbeat_ms
            if m.state == "dead":
                conds[f"node_down:{m.address}"] = _Cond(
                    "node_down", m.address, "critical", f"node {label} is down", float(silent)
                )
            elif silent > th.heartbeat_timeout_ms:
                conds[f"no_heartbeat:{m.address}"] = _Cond(
                    "no_heartbeat", m.address, "error",
                    f"no heartbeat from {label} for {silent / 1000:.0f}s", float(silent),
                )  # fmt: skip
        for c in sorted(calls, key=lambda c: (c.by, c.key)):
            if c.calls >= th.min_calls and c.calls > 0:
                rate = c.failures / c.calls
                if rate > th.error_rate:
                    conds[f"error_rate:{c.by}:{c.key}"] = _Cond(
                        "error_rate", f"{c.by}:{c.key}", "error",
                        f"{c.by} {c.key}: {rate:.0%} of {c.calls} calls failed", rate,
                    )  # fmt: skip
            if c.p99_ms is not None and c.p99_ms > th.latency_p99_ms:
                conds[f"latency:{c.by}:{c.key}"] = _Cond(
                    "latency", f"{c.by}:{c.key}", "warning",
                    f"{c.by} {c.key}: p99 latency {c.p99_ms:.0f} ms", float(c.p99_ms),
                )  # fmt: skip
        for sender in sorted(backlogs):
            b = backlogs[sender]
            hist = self._backlogs.setdefault(sender, [])
            hist.append(b)
            del hist[: -(th.backlog_growth_evals + 1)]
            growing = (
                len(hist) == th.backlog_growth_evals + 1
                and all(x < y for x, y in pairwise(hist))
                and b >= th.backlog_growth_min
            )
            if b > th.backlog_max or growing:
                conds[f"backlog:{sender}"] = _Cond(
                    "backlog", sender, "warning",
                    f"telemetry spool of {sender[:12]} holds {b} records"
                    + (" and keeps growing" if growing else ""),
                    float(b),
                )  # fmt: skip
        return conds
