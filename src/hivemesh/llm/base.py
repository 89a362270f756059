"""The LLM provider protocol and the retry/validation loop every provider shares.

Theory of operation
-------------------
A provider turns chat ``messages`` into an :class:`LLMResult`. Providers only
implement one raw exchange (``send``: messages in, text and token counts
out, typed :mod:`hivemesh.errors` on failure); :func:`complete_with_retries`
wraps it with the policy that is the same for every backend:

* **deadline** -- each attempt runs under ``timeout_s`` (``LLMTimeout``);
* **retries** -- transport failures (timeouts, refused connections, HTTP
  408/409/429/5xx, garbled payloads) are retried with exponential backoff
  and jitter drawn from an injected ``random.Random``; other HTTP 4xx are
  final;
* **structured output** -- with a JSON ``schema`` the reply is parsed
  (code fences and chatter around one JSON object are tolerated) and
  validated with :mod:`jsonschema`; on failure the bad reply and the
  validation error are appended to the conversation and the model is asked
  again (this also spends an attempt);
* **usage** -- every exchange, failed or not, is reported through
  ``on_usage(model, input_tokens, output_tokens, latency_ms, ok)``.

When attempts run out, the last typed error is raised
(:class:`~hivemesh.llm.errors.LLMBadOutput` for unusable replies).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from hivemesh.llm.errors import LLMBadOutput, LLMError, LLMHTTPError, LLMTimeout

__all__ = [
    "LLMProvider",
    "LLMResult",
    "Message",
    "RawReply",
    "RetryPolicy",
    "UsageHook",
    "complete_with_retries",
    "extract_json",
]


class Message(TypedDict):
    """One chat message (OpenAI shape)."""

    role: str
    content: str


#: ``on_usage(model, input_tokens, output_tokens, latency_ms, ok)``
UsageHook = Callable[[str, int, int, float, bool], None]


@dataclass(frozen=True, slots=True)
class RawReply:
    """What one exchange with a backend returned."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LLMResult:
    """A completed call: text, parsed JSON (with a schema), usage, timing."""

    text: str
    parsed: Any
    model: str
    input_tokens: int
    output_tokens: int
    latency_ms: float
    attempts: int


class LLMProvider(Protocol):
    """Anything that completes chat messages."""

    model: str

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> LLMResult:
        """Complete ``messages``; with ``schema``, ``parsed`` is valid JSON for it."""
        ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff: delay ``base * 2**k`` capped, times ``1 + jitter*u``."""

    max_attempts: int = 4
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    jitter: float = 0.5

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Sleep before retry number ``attempt`` (1-based)."""
        d = min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))
        return float(d * (1.0 + self.jitter * rng.random()))


_RETRY_STATUS = frozenset({408, 409, 425, 429})


def _retryable(exc: LLMError) -> bool:
    if isinstance(exc, LLMHTTPError):
        return exc.status in _RETRY_STATUS or exc.status >= 500
    return True


def extract_json(text: str) -> Any:
    """The JSON value in a model reply; tolerates code fences and prose around
    one object or array. Raises ``ValueError`` if there is none."""
    s = text.strip()
    if s.startswith("```"):
        s = s.split("\n", 1)[1] if "\n" in s else ""
        s = s.rsplit("```", 1)[0]
    try:
        return json.loads(s)
    except ValueError:
        pass
    dec = json.JSONDecoder()
    for i, ch in enumerate(s):
        if ch in "{[":
            try:
                return dec.raw_decode(s, i)[0]
            except ValueError:
                continue
    raise ValueError("no JSON value in reply")


if TYPE_CHECKING:
    import jsonschema

_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}
_MAX_VALIDATORS = 256


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A checked validator for ``schema``, cached (checking the schema is slow)."""
    import jsonschema  # here: a node that never asks a model for JSON does not load it

    key = json.dumps(schema, sort_keys=True)
    v = _VALIDATORS.get(key)
    if v is None:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        v = cls(schema)
        if len(_VALIDATORS) >= _MAX_VALIDATORS:
            _VALIDATORS.pop(next(iter(_VALIDATORS)))
        _VALIDATORS[key] = v
    return v


def _check(text: str, validator: jsonschema.protocols.Validator) -> Any:
    import jsonschema

    try:
        value = extract_json(text)
    except ValueError as exc:
        raise LLMBadOutput(f"reply is not JSON: {exc}") from None
    err = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        raise LLMBadOutput(f"reply does not match the schema at {where}: {err.message}")
    return value


async def complete_with_retries(
    send: Callable[[list[Message], float], Awaitable[RawReply]],
    messages: Sequence[Message],
    *,
    model: str,
    schema: dict[str, Any] | None,
    timeout_s: float,
    policy: RetryPolicy,
    rng: random.Random,
    on_usage: UsageHook | None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    endpoint: str | None = None,
) -> LLMResult:
    """Run ``send`` under the shared deadline/retry/validation policy.

    ``endpoint`` (say ``http://127.0.0.1:11434/v1``) is named in a timeout's
    message, so the user sees where no reply came from."""
    validator = _validator(schema) if schema is not None else None
    convo: list[Message] = [Message(role=m["role"], content=m["content"]) for m in messages]
    last: LLMError | None = None
    for attempt in range(1, policy.max_attempts + 1):
        if last is not None and not isinstance(last, LLMBadOutput):
            await sleep(policy.delay_s(attempt - 1, rng))
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                reply = await send(convo, timeout_s)
        except TimeoutError:
            at = f" from {endpoint}" if endpoint else ""
            last = LLMTimeout(f"{model}: no reply{at} within {timeout_s:.1f} s")
        except LLMError as exc:
            last = exc
        else:
            latency_ms = (time.perf_counter() - t0) * 1000.0
            parsed: Any = None
            try:
                if validator is not None:
                    parsed = _check(reply.text, validator)
            except LLMBadOutput as exc:
                last = exc
                if on_usage is not None:
                    on_usage(model, reply.input_tokens, reply.output_tokens, latency_ms, False)
                convo = [
                    *convo,
                    Message(role="assistant", content=reply.text[:4000]),
                    Message(
                        role="user",
                        content=f"That reply was invalid: {exc}. Answer again with only a "
                        "JSON value that matches the schema, no prose.",
                    ),
                ]
                continue
            if on_usage is not None:
                on_usage(model, reply.input_tokens, reply.output_tokens, latency_ms, True)
            return LLMResult(
                text=reply.text,
                parsed=parsed,
                model=model,
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                latency_ms=latency_ms,
                attempts=attempt,
            )
        if on_usage is not None:
            on_usage(model, 0, 0, (time.perf_counter() - t0) * 1000.0, False)
        if not _retryable(last):
            break
    assert last is not None
    raise last
