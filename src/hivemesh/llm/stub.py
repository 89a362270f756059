"""In-process providers: scripted replies for tests, fixed latency for benchmarks.

Both run the real retry/validation loop of :mod:`hivemesh.llm.base`; only the
exchange is local. A *responder* is ``(messages, schema) -> reply`` where a
reply is a ``str`` (returned as text), any other JSON value (serialised), an
:class:`~hivemesh.llm.errors.LLMError` instance (raised), or a
:class:`~hivemesh.llm.base.RawReply`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from hivemesh.errors import LocalProtocolError
from hivemesh.llm.base import (
    LLMResult,
    Message,
    RawReply,
    RetryPolicy,
    UsageHook,
    complete_with_retries,
)
from hivemesh.llm.errors import LLMError

__all__ = ["FixedLatencyLLM", "Responder", "ScriptedLLM"]

Responder = Callable[[Sequence[Message], dict[str, Any] | None], Any]


def _raw(reply: Any, messages: Sequence[Message]) -> RawReply:
    if isinstance(reply, LLMError):
        raise reply
    if isinstance(reply, RawReply):
        return reply
    text = reply if isinstance(reply, str) else json.dumps(reply)
    tin = sum(len(m["content"]) for m in messages) // 4
    return RawReply(text, tin, max(1, len(text) // 4))


class ScriptedLLM:
    """Replies from a list (in order) or from a responder function."""

    def __init__(
        self,
        script: Sequence[Any] | Responder,
        *,
        model: str = "scripted",
        on_usage: UsageHook | None = None,
        policy: RetryPolicy | None = None,
        latency_s: float = 0.0,
    ) -> None:
        self.model = model
        self.on_usage = on_usage
        self.policy = policy or RetryPolicy(max_attempts=3, backoff_base_s=0.0, jitter=0.0)
        self.latency_s = latency_s
        self._responder = script if callable(script) else None
        self._script = [] if callable(script) else list(script)
        self.calls: list[list[Message]] = []

    async def _send(
        self, convo: list[Message], deadline_s: float, schema: dict[str, Any] | None
    ) -> RawReply:
        self.calls.append(list(convo))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self._responder is not None:
            reply = self._responder(convo, schema)
        elif self._script:
            reply = self._script.pop(0)
        else:
            raise LocalProtocolError("ScriptedLLM ran out of scripted replies")
        return _raw(reply, convo)

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> LLMResult:
        """Complete ``messages`` from the script."""

        async def send(convo: list[Message], deadline_s: float) -> RawReply:
            return await self._send(convo, deadline_s, schema)

        return await complete_with_retries(
            send,
            messages,
            model=self.model,
            schema=schema,
            timeout_s=timeout_s or 30.0,
            policy=self.policy,
            rng=random.Random(0),
            on_usage=self.on_usage,
        )


class FixedLatencyLLM(ScriptedLLM):
    """A responder behind a fixed per-call latency; records call intervals.

    ``intervals`` holds ``(start_s, end_s)`` of every exchange on the event
    loop clock, so a benchmark can compute the critical path of LLM calls.
    """

    def __init__(
        self,
        responder: Responder,
        latency_ms: float = 200.0,
        *,
        model: str = "fixed-latency",
        on_usage: UsageHook | None = None,
    ) -> None:
        super().__init__(responder, model=model, on_usage=on_usage, latency_s=latency_ms / 1000)
        self.intervals: list[tuple[float, float]] = []

    async def _send(
        self, convo: list[Message], deadline_s: float, schema: dict[str, Any] | None
    ) -> RawReply:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            return await super()._send(convo, deadline_s, schema)
        finally:
            self.intervals.append((t0, loop.time()))
