"""Alert delivery: Slack and PagerDuty Events v2 webhooks, and the health role driver.

Theory of operation
-------------------
:func:`slack_payload` and :func:`pagerduty_payload` turn a
:class:`~.health.Transition` into the JSON each service expects: a Slack
incoming-webhook message (``text`` plus a coloured attachment), and a
PagerDuty Events API v2 event (``trigger`` with a ``payload``, or ``resolve``),
whose ``dedup_key`` is the alert key so PagerDuty pairs the two.

:class:`WebhookNotifier` queues transitions (bounded; overflow dropped and
counted) and POSTs them in order, each with a deadline, retrying transient
failures (connection errors, timeouts, HTTP 429 and 5xx) with exponential
backoff up to ``max_attempts``; a 4xx other than 429 is permanent (counted,
not retried).

:class:`HealthService` is the ``health-monitor`` role's asyncio loop: every
``interval_s`` it reads the collector's figures (on the collector's writer
thread), asks the membership source for the member list, evaluates the
:class:`~.health.HealthMonitor`, stores the alerts and hands transitions to
the notifiers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hivemesh.errors import InvalidArgument
from hivemesh.telemetry.health import CallStats, HealthMonitor, NodeStatus, Transition

__all__ = [
    "HealthService",
    "NotifierStats",
    "WebhookNotifier",
    "pagerduty_payload",
    "slack_payload",
]

_SLACK_COLOURS = {
    "critical": "#b00020",
    "error": "#e01e5a",
    "warning": "#ecb22e",
    "info": "#2eb67d",
}


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")


def slack_payload(t: Transition, *, source: str = "hivemesh") -> dict[str, Any]:
    """A Slack incoming-webhook message for one transition."""
    a = t.alert
    firing = t.status == "firing"
    head = ("FIRING" if firing else "RESOLVED") + f" [{a.severity}] {a.summary}"
    return {
        "text": head,
        "attachments": [
            {
                "color": _SLACK_COLOURS[a.severity] if firing else "#2eb67d",
                "title": a.rule,
                "text": a.summary,
                "fields": [
                    {"title": "subject", "value": a.subject, "short": True},
                    {"title": "since", "value": _iso(a.started_ms), "short": True},
                    {"title": "key", "value": a.key, "short": False},
                ],
                "footer": source,
                "ts": t.at_ms // 1000,
            }
        ],
    }


def pagerduty_payload(
    t: Transition, routing_key: str, *, source: str = "hivemesh"
) -> dict[str, Any]:
    """A PagerDuty Events API v2 event (``trigger`` or ``resolve``) for one transition."""
    a = t.alert
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger" if t.status == "firing" else "resolve",
        "dedup_key": a.key,
    }
    if t.status == "firing":
        event["payload"] = {
            "summary": a.summary[:1024],
            "source": source,
            "severity": a.severity,
            "timestamp": _iso(a.started_ms),
            "component": a.subject,
            "group": "hivemesh",
            "class": a.rule,
            "custom_details": {"value": a.value, "key": a.key},
        }
    return event


@dataclass(frozen=True, slots=True)
class NotifierStats:
    """Counters of one webhook notifier."""

    sent: int
    failed: int
    dropped: int
    retries: int
    queued: int


class WebhookNotifier:
    """Delivers transitions to one webhook URL in Slack or PagerDuty format."""

    def __init__(
        self,
        url: str,
        kind: Literal["slack", "pagerduty"] = "slack",
        *,
        routing_key: str = "",
        source: str = "hivemesh",
        timeout_s: float = 5.0,
        max_attempts: int = 4,
        backoff_s: float = 0.2,
        queue_max: int = 1000,
    ) -> None:
        if kind == "pagerduty" and not routing_key:
            raise InvalidArgument("a PagerDuty notifier needs a routing_key")
        if not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"webhook URL must be http(s): {url!r}")
        self.url, self.kind, self.routing_key, self.source = url, kind, routing_key, source
        self.timeout_s, self.max_attempts, self.backoff_s = timeout_s, max_attempts, backoff_s
        self._queue: asyncio.Queue[Transition] = asyncio.Queue(maxsize=queue_max)
        self._sent = self._failed = self._dropped = self._retries = 0

    def payload(self, t: Transition) -> dict[str, Any]:
        """The JSON body for ``t`` in this notifier's format."""
        if self.kind == "pagerduty":
            return pagerduty_payload(t, self.routing_key, source=self.source)
        return slack_payload(t, source=self.source)

    def submit(self, transitions: Sequence[Transition]) -> None:
        """Queue transitions (never blocks; a full queue drops and counts)."""
        for t in transitions:
            try:
                self._queue.put_nowait(t)
            except asyncio.QueueFull:
                self._dropped += 1

    def _post(self, body: bytes) -> int:
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    async def deliver(self, t: Transition) -> bool:
        """POST one transition with retries; True once the endpoint accepted it."""
        body = json.dumps(self.payload(t)).encode()
        delay = self.backoff_s
        for attempt in range(self.max_attempts):
            if attempt:
                self._retries += 1
                await asyncio.sleep(delay)
                delay *= 2
            try:
                status = await asyncio.wait_for(
                    asyncio.to_thread(self._post, body), self.timeout_s + 1.0
                )
            except (OSError, TimeoutError):
                continue
            if 200 <= status < 300:
                self._sent += 1
                return True
            if status != 429 and status < 500:
                break  # permanent: the endpoint rejects this payload
        self._failed += 1
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver queued transitions in order until ``stop`` is set."""
        while not stop.is_set():
            getter = asyncio.ensure_future(self._queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if getter not in done:
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
                break
            await self.deliver(getter.result())

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the queue is empty (True) or ``timeout_s`` passes (False)."""
        end = time.monotonic() + timeout_s
        while self._queue.qsize() and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return self._queue.qsize() == 0

    def statistics(self) -> NotifierStats:
        """A frozen snapshot of the counters."""
        return NotifierStats(
            self._sent, self._failed, self._dropped, self._retries, self._queue.qsize()
        )


class HealthService:
    """The ``health-monitor`` role: periodic evaluation, storage and notification."""

    def __init__(
        self,
        collector: Any,
        monitor: HealthMonitor,
        notifiers: Sequence[WebhookNotifier] = (),
        *,
        members: Callable[[], Sequence[NodeStatus]] = lambda: (),
        interval_s: float = 10.0,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.collector = collector
        self.monitor = monitor
        self.notifiers = list(notifiers)
        self._members = members
        self.interval_s = interval_s
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def _read(self, store: Any, now_ms: int) -> list[CallStats]:
        window = self.monitor.thresholds.window_ms
        calls = [
            CallStats("agent", k, n, f, p)
            for k, n, f, p in store.rates(
                "agent", window, now_ms, ("llm_call", "tool_call", "task")
            )
        ]
        calls += [
            CallStats("tool", k, n, f, p)
            for k, n, f, p in store.rates("tool", window, now_ms, ("tool_call",))
        ]
        return calls

    async def evaluate_once(self) -> list[Transition]:
        """One evaluation: read figures, evaluate, store alerts, notify."""
        now = self._clock_ms()
        calls = await self.collector.call_store(lambda s: self._read(s, now))
        backlogs = {r.sender: r.backlog for r in self.collector.senders()}
        transitions = self.monitor.evaluate(now, self._members(), calls, backlogs)
        rows = [a.as_row() for a in self.monitor.active()]
        rows += [t.alert.as_row() for t in transitions if t.status == "resolved"]
        await self.collector.call_store(lambda s: s.save_alerts(rows))
        for n in self.notifiers:
            n.submit(transitions)
        return transitions

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every ``interval_s`` and deliver notifications until ``stop``."""
        tasks = [asyncio.create_task(n.run(stop)) for n in self.notifiers]
        try:
            while not stop.is_set():
                await self.evaluate_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
