"""A local GGUF model through ``llama-cpp-python`` (optional extra).

The model is loaded lazily on first use, in a worker thread, and every
exchange runs in a thread too (llama.cpp is blocking). With a schema, the
reply is grammar-constrained with llama.cpp's JSON-schema grammar
(``response_format={"type": "json_object", "schema": ...}``), so even a small
model produces parseable JSON; validation and retries still go through
:func:`~hivemesh.llm.base.complete_with_retries`. Calls are serialised: one
model instance is not re-entrant.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from hivemesh.errors import ConfigError
from hivemesh.llm.base import (
    LLMResult,
    Message,
    RawReply,
    RetryPolicy,
    UsageHook,
    complete_with_retries,
)
from hivemesh.llm.config import LLMConfig
from hivemesh.llm.errors import LLMBadOutput, LLMUnavailable

__all__ = ["LlamaCppProvider"]


class LlamaCppProvider:
    """:class:`~hivemesh.llm.base.LLMProvider` over a local GGUF file."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        on_usage: UsageHook | None = None,
        rng: random.Random | None = None,
        n_ctx: int = 4096,
        max_tokens: int = 1024,
    ) -> None:
        if not config.gguf_path:
            raise ConfigError("LlamaCppProvider needs gguf_path")
        self.config = config
        self.model = config.model or config.gguf_path.rsplit("/", 1)[-1]
        self.on_usage = on_usage
        self.rng = rng or random.Random()
        self.policy = RetryPolicy(max_attempts=config.max_attempts, backoff_base_s=0.0)
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self._llama: Any = None
        self._lock = asyncio.Lock()

    def _load(self) -> Any:
        try:
            from llama_cpp import Llama  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ConfigError(
                "a GGUF model needs the llama-cpp-python extra: pip install llama-cpp-python"
            ) from None
        try:
            return Llama(model_path=self.config.gguf_path, n_ctx=self.n_ctx, verbose=False)
        except (OSError, ValueError) as exc:
            raise LLMUnavailable(f"cannot load {self.config.gguf_path}: {exc}") from None

    def _run(self, convo: list[Message], schema: dict[str, Any] | None) -> RawReply:
        if self._llama is None:
            self._llama = self._load()
        kwargs: dict[str, Any] = {"messages": convo, "max_tokens": self.max_tokens}
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        out = self._llama.create_chat_completion(**kwargs)
        try:
            text = out["choices"][0]["message"]["content"] or ""
            usage = out.get("usage") or {}
            return RawReply(
                str(text),
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMBadOutput(f"unexpected llama.cpp output: {exc}") from None

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> LLMResult:
        """Complete ``messages`` with the local model."""

        async def send(convo: list[Message], deadline_s: float) -> RawReply:
            async with self._lock:
                return await asyncio.to_thread(self._run, convo, schema)

        return await complete_with_retries(
            send,
            messages,
            model=self.model,
            schema=schema,
            timeout_s=timeout_s or self.config.timeout_s,
            policy=self.policy,
            rng=self.rng,
            on_usage=self.on_usage,
        )
