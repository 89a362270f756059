"""Any OpenAI-compatible chat-completions endpoint (Ollama, vLLM, llama.cpp, OpenAI).

One exchange is ``POST {base_url}/chat/completions`` with ``model``,
``messages`` and, when a schema is requested and ``json_mode`` is on,
``response_format: {"type": "json_object"}``. The reply's
``choices[0].message.content`` and ``usage`` are read; anything else about
the payload is ignored. Transport problems map to typed errors
(:class:`~hivemesh.llm.errors.LLMTimeout`, ``LLMUnavailable``, ``LLMHTTPError``,
``LLMBadOutput`` for a garbled payload) whose message names the cause and the
endpoint (``connection refused to 127.0.0.1:11434``, not httpx's "All
connection attempts failed"), and the shared policy in
:mod:`hivemesh.llm.base` decides about retries.
"""

from __future__ import annotations

import random
import socket
import ssl
from collections.abc import Sequence
from typing import Any

import httpx

from hivemesh.llm.base import (
    LLMResult,
    Message,
    RawReply,
    RetryPolicy,
    UsageHook,
    complete_with_retries,
)
from hivemesh.llm.config import LLMConfig
from hivemesh.llm.errors import LLMBadOutput, LLMHTTPError, LLMTimeout, LLMUnavailable

__all__ = ["OpenAICompatProvider", "connection_failure"]

_MAX_REPLY_BYTES = 4 * 1024 * 1024
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def connection_failure(exc: BaseException, where: str) -> str:
    """Why a request to ``where`` (``host:port``) failed, in words: the
    root cause under httpx's wrappers (which often say only "All connection
    attempts failed"), e.g. ``connection refused to 127.0.0.1:9``."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:  # the chain, breadth first; exception groups too
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ConnectionRefusedError):
            return f"connection refused to {where} (is the server running?)"
        if isinstance(err, ConnectionResetError):
            return f"connection reset by {where}"
        if isinstance(err, socket.gaierror):
            return f"cannot resolve the host of {where}: {err.strerror or err}"
        if isinstance(err, ssl.SSLError):
            return f"TLS with {where} failed: {err.reason or err}"
        if isinstance(err, OSError) and err.errno is not None:
            return f"{err.strerror or err} ({where})"
        if isinstance(err, BaseExceptionGroup):
            todo.extend(err.exceptions)
        todo.extend(e for e in (err.__cause__, err.__context__) if e is not None)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__} talking to {where}: {text}"


class OpenAICompatProvider:
    """:class:`~hivemesh.llm.base.LLMProvider` over HTTP with :mod:`httpx`."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        on_usage: UsageHook | None = None,
        rng: random.Random | None = None,
        policy: RetryPolicy | None = None,
        temperature: float = 0.2,
    ) -> None:
        self.config = config
        self.model = config.model
        self.on_usage = on_usage
        self.rng = rng or random.Random()
        self.policy = policy or RetryPolicy(max_attempts=config.max_attempts)
        self.temperature = temperature
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._client = httpx.AsyncClient(
            base_url=config.base_url,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            # Proxy settings from the environment apply to remote endpoints only;
            # a local server (Ollama, llama.cpp, tests) is always reached directly.
            trust_env=httpx.URL(config.base_url).host not in _LOOPBACK,
        )

    def _where(self) -> str:
        url = httpx.URL(self.config.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return f"[{url.host}]:{port}" if ":" in url.host else f"{url.host}:{port}"

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def __aenter__(self) -> OpenAICompatProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> LLMResult:
        """Complete ``messages`` (see :func:`~hivemesh.llm.base.complete_with_retries`)."""
        json_mode = schema is not None and self.config.json_mode

        async def send(convo: list[Message], deadline_s: float) -> RawReply:
            return await self._send(convo, deadline_s, json_mode)

        return await complete_with_retries(
            send,
            messages,
            model=self.model,
            schema=schema,
            timeout_s=timeout_s or self.config.timeout_s,
            policy=self.policy,
            rng=self.rng,
            on_usage=self.on_usage,
            endpoint=f"{self.config.base_url} ({self._where()})",
        )

    async def _send(self, convo: list[Message], deadline_s: float, json_mode: bool) -> RawReply:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": convo,
            "temperature": self.temperature,
            "stream": False,
        }
        if json_mode:
            payload["response_format"] = {"type": "json_object"}
        try:
            resp = await self._client.post(
                "/chat/completions", json=payload, timeout=httpx.Timeout(deadline_s)
            )
        except httpx.TimeoutException as exc:
            where = self._where()
            what = "connecting to" if isinstance(exc, httpx.ConnectTimeout) else "no reply from"
            raise LLMTimeout(
                f"{self.config.base_url}: {what} {where} within {deadline_s:.1f} s"
            ) from None
        except httpx.HTTPError as exc:
            raise LLMUnavailable(
                f"{self.config.base_url}: {connection_failure(exc, self._where())}"
            ) from None
        if resp.status_code // 100 != 2:
            raise LLMHTTPError(
                f"{self.config.base_url}: HTTP {resp.status_code}: {resp.text[:200]}",
                resp.status_code,
            )
        if len(resp.content) > _MAX_REPLY_BYTES:
            raise LLMBadOutput(f"reply of {len(resp.content)} bytes is over the limit")
        try:
            data = resp.json()
            text = data["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            usage = data.get("usage") or {}
            tin = int(usage.get("prompt_tokens") or 0)
            tout = int(usage.get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMBadOutput(f"not a chat-completions payload: {exc}") from None
        return RawReply(text, tin, tout)
