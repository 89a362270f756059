"""Commands for telemetry: record a metric, start sending, query the collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hivemesh.commands._base import Command, Reply, check_timeout
from hivemesh.errors import InvalidArgument

__all__ = [
    "METRIC_KINDS",
    "MetricsQuery",
    "MetricsRecord",
    "MetricsRecordReply",
    "MetricsSend",
    "MetricsSendReply",
]

#: Record kinds (the telemetry schema's ``KINDS``; a test keeps them equal).
METRIC_KINDS = ("counter", "gauge", "llm_call", "task", "timer", "tool_call")
#: What ``metrics`` answers.
QUERIES = ("alerts", "gaps", "query", "senders", "stats", "top")


@dataclass(frozen=True, slots=True)
class MetricsRecordReply(Reply):
    """The spool seqs of the records; ``stored`` once the collector stored
    them (with ``wait_s``), else None."""

    recorded: int
    first_seq: int
    last_seq: int
    stored: bool | None


@dataclass(frozen=True, slots=True)
class MetricsRecord(Command):
    """Record a metric on this node (sent to the ``metrics-collector``)."""

    op: ClassVar[str] = "metrics.record"
    reply: ClassVar[type[Reply]] = MetricsRecordReply
    errors: ClassVar[tuple[str, ...]] = ("spool_full", "telemetry_refused")
    name: str
    value: float = 1.0
    kind: str = "gauge"
    count: int = 1
    attrs: dict[str, Any] = field(default_factory=dict)
    unit: str = ""
    agent: str | None = None
    wait_s: float | None = None

    def check(self) -> None:
        """Kind, count and wait ranges."""
        if self.kind not in METRIC_KINDS:
            raise InvalidArgument(f"metrics.record: kind must be one of {list(METRIC_KINDS)}")
        if not 0 < self.count <= 10_000:
            raise InvalidArgument("count must be 1..10000")
        if self.wait_s is not None:
            check_timeout(self.op, self.wait_s, "wait_s")

    def deadline_s(self) -> float | None:
        """Waiting for the collector is the request's deadline."""
        return self.wait_s


@dataclass(frozen=True, slots=True)
class MetricsSendReply(Reply):
    """False if the node was already sending."""

    started: bool


@dataclass(frozen=True, slots=True)
class MetricsSend(Command):
    """Start sending spooled telemetry to the collector."""

    op: ClassVar[str] = "metrics.send"
    reply: ClassVar[type[Reply]] = MetricsSendReply


@dataclass(frozen=True, slots=True)
class MetricsQuery(Command):
    """Ask this node's collector store: ``what`` is one of :data:`QUERIES`."""

    op: ClassVar[str] = "metrics"
    what: str
    sql: str | None = None
    by: str = "agent"
    since_ms: int | None = None
    limit: int = 20
    all: bool = False

    def check(self) -> None:
        """A known query; ``sql`` for ``query``."""
        if self.what not in QUERIES:
            raise InvalidArgument(f"what must be one of {list(QUERIES)}")
        if self.what == "query" and self.sql is None:
            raise InvalidArgument("query needs sql")
