"""The agent-facing recording API: ``node.metrics.record(...)``, timers, counters.

Theory of operation
-------------------
:class:`Metrics` turns calls into records and appends them to the node's
:class:`~.spool.Spool` (durable before the call returns), then pokes the
sender. Records are validated here with the collector's own rules, so a bad
call fails at once with :class:`~hivemesh.errors.InvalidArgument` (our bug,
not the collector's problem).

Telemetry must never take an agent down: a full spool drops the record,
counts it (``dropped``) and the collector later reports the consumed seq as a
gap; nothing is raised.

The runtime records automatically around every LLM call, tool call and task
with :meth:`Metrics.track_llm`, :meth:`Metrics.track_tool` and
:meth:`Metrics.track_task`: each is a context manager that measures the
latency with a monotonic clock and records ``error.type`` (the exception
class name) when the body raises, then re-raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.telemetry.errors import SpoolFull
from hivemesh.telemetry.schema import (
    ATTR_ERROR_TYPE,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TASK_ID,
    ATTR_TOOL,
    NAME_LLM_DURATION,
    NAME_TASK_DURATION,
    NAME_TOOL_DURATION,
    validate_record,
)
from hivemesh.telemetry.spool import Spool

__all__ = ["LlmCall", "Metrics", "usage_tokens"]

Attrs = Mapping[str, str | int | float | bool]


@dataclass
class LlmCall:
    """Filled in by the caller inside :meth:`Metrics.track_llm` (token usage)."""

    input_tokens: int = 0
    output_tokens: int = 0
    attrs: dict[str, str | int | float | bool] = field(default_factory=dict)

    def set_usage(self, response: Any) -> None:
        """Take token counts from an OpenAI-style response (see :func:`usage_tokens`)."""
        self.input_tokens, self.output_tokens = usage_tokens(response)


def usage_tokens(response: Any) -> tuple[int, int]:
    """``(input, output)`` tokens from an OpenAI/Anthropic-style response or dict.

    Reads ``usage.prompt_tokens``/``completion_tokens`` or
    ``usage.input_tokens``/``output_tokens``; missing counts are 0.
    """
    usage = (
        response.get("usage") if isinstance(response, Mapping) else getattr(response, "usage", None)
    )
    if usage is None:
        return 0, 0

    def pick(*names: str) -> int:
        for n in names:
            v = usage.get(n) if isinstance(usage, Mapping) else getattr(usage, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                return v
        return 0

    return pick("input_tokens", "prompt_tokens"), pick("output_tokens", "completion_tokens")


class Metrics:
    """Records measurements into a spool; one per node (``node.metrics``)."""

    def __init__(
        self,
        spool: Spool,
        *,
        agent: str = "",
        clock_ms: Callable[[], int] | None = None,
        on_record: Callable[[], None] | None = None,
    ) -> None:
        self.spool = spool
        self.agent = agent
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._on_record = on_record
        self.recorded = 0
        self.dropped = 0

    def record(
        self,
        name: str,
        value: float,
        *,
        kind: str = "gauge",
        unit: str = "",
        attrs: Attrs | None = None,
        agent: str | None = None,
    ) -> int | None:
        """Record one measurement; return its seq (None if the spool was full)."""
        rec: dict[str, Any] = {
            "ts_ms": self._clock_ms(),
            "kind": kind,
            "name": name,
            "value": float(value) if isinstance(value, (int, float)) else value,
        }
        if unit:
            rec["unit"] = unit
        a = agent if agent is not None else self.agent
        if a:
            rec["agent"] = a
        if attrs:
            rec["attrs"] = dict(attrs)
        try:
            validate_record(rec)
        except HivemeshError as exc:
            raise InvalidArgument(f"bad metric record: {exc}") from exc
        try:
            seq = self.spool.append(rec)
        except SpoolFull:
            self.dropped += 1
            return None
        self.recorded += 1
        if self._on_record is not None:
            self._on_record()
        return seq

    def count(self, name: str, n: float = 1, *, attrs: Attrs | None = None) -> int | None:
        """Record a counter increment."""
        return self.record(name, n, kind="counter", attrs=attrs)

    def gauge(
        self, name: str, value: float, *, unit: str = "", attrs: Attrs | None = None
    ) -> int | None:
        """Record a gauge reading."""
        return self.record(name, value, kind="gauge", unit=unit, attrs=attrs)

    @contextmanager
    def timer(self, name: str, *, attrs: Attrs | None = None) -> Iterator[dict[str, Any]]:
        """Time the body in ms (kind ``timer``); records ``error.type`` if it raises."""
        extra: dict[str, Any] = dict(attrs or {})
        with self._timed(name, "timer", extra):
            yield extra

    def llm_call(
        self,
        *,
        model: str,
        input_tokens: int,
        output_tokens: int,
        latency_ms: float,
        operation: str = "chat",
        provider: str | None = None,
        error_type: str | None = None,
        attrs: Attrs | None = None,
    ) -> int | None:
        """Record one LLM call with GenAI semantic-convention attributes."""
        a: dict[str, Any] = dict(attrs or {})
        a.update({ATTR_MODEL: model, ATTR_OPERATION: operation})
        a[ATTR_INPUT_TOKENS] = input_tokens
        a[ATTR_OUTPUT_TOKENS] = output_tokens
        if provider:
            a[ATTR_PROVIDER] = provider
        if error_type:
            a[ATTR_ERROR_TYPE] = error_type
        return self.record(NAME_LLM_DURATION, latency_ms, kind="llm_call", unit="ms", attrs=a)

    def tool_call(
        self,
        *,
        tool: str,
        latency_ms: float,
        error_type: str | None = None,
        attrs: Attrs | None = None,
    ) -> int | None:
        """Record one tool call; a failure carries ``error_type``."""
        a: dict[str, Any] = dict(attrs or {})
        a[ATTR_TOOL] = tool
        a[ATTR_OPERATION] = "execute_tool"
        if error_type:
            a[ATTR_ERROR_TYPE] = error_type
        return self.record(NAME_TOOL_DURATION, latency_ms, kind="tool_call", unit="ms", attrs=a)

    def task(
        self,
        *,
        task_id: str,
        duration_ms: float,
        error_type: str | None = None,
        attrs: Attrs | None = None,
    ) -> int | None:
        """Record one finished (or failed) task."""
        a: dict[str, Any] = dict(attrs or {})
        a[ATTR_TASK_ID] = task_id
        if error_type:
            a[ATTR_ERROR_TYPE] = error_type
        return self.record(NAME_TASK_DURATION, duration_ms, kind="task", unit="ms", attrs=a)

    @contextmanager
    def track_llm(
        self, model: str, *, operation: str = "chat", provider: str | None = None
    ) -> Iterator[LlmCall]:
        """Measure an LLM call; set token usage on the yielded :class:`LlmCall`."""
        call = LlmCall()
        t0 = time.monotonic()
        err: str | None = None
        try:
            yield call
        except BaseException as exc:
            err = type(exc).__name__
            raise
        finally:
            self.llm_call(
                model=model,
                input_tokens=call.input_tokens,
                output_tokens=call.output_tokens,
                latency_ms=(time.monotonic() - t0) * 1000.0,
                operation=operation,
                provider=provider,
                error_type=err,
                attrs=call.attrs,
            )

    @contextmanager
    def track_tool(self, tool: str) -> Iterator[dict[str, Any]]:
        """Measure a tool call; the yielded dict takes extra attributes."""
        extra: dict[str, Any] = {ATTR_TOOL: tool, ATTR_OPERATION: "execute_tool"}
        with self._timed(NAME_TOOL_DURATION, "tool_call", extra):
            yield extra

    @contextmanager
    def track_task(self, task_id: str) -> Iterator[dict[str, Any]]:
        """Measure a task; the yielded dict takes extra attributes."""
        extra: dict[str, Any] = {ATTR_TASK_ID: task_id}
        with self._timed(NAME_TASK_DURATION, "task", extra):
            yield extra

    @contextmanager
    def _timed(self, name: str, kind: str, attrs: dict[str, Any]) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        except BaseException as exc:
            attrs[ATTR_ERROR_TYPE] = type(exc).__name__
            raise
        finally:
            self.record(name, (time.monotonic() - t0) * 1000.0, kind=kind, unit="ms", attrs=attrs)
