"""Hand-written telemetry: the flat shapes people send, mapped onto the record schema.

Theory of operation
-------------------
A person (or a script) sends the collector something like::

    hivemesh send-message metrics-collector \\
        --data '{"agent_id": "agent-7", "tokens_used": 1200, "duration_ms": 3400}'

:func:`batch_of` turns such a message into a batch envelope of records in
the schema of :mod:`.schema`, or raises a typed error whose text is the
reason it cannot (the sender gets it back):

* A map with ``records`` is already a batch and is returned as it is (its
  records are then validated strictly, field by field).
* Any other map is **one flat record**, a list of maps is several (at most
  :data:`~.schema.MAX_BATCH_RECORDS`). ``"type": "metrics"`` is ignored.

A flat record is read through :data:`ALIASES` (first match wins; two
spellings of one field, e.g. ``duration_ms`` and ``latency_ms``, are an
error rather than a guess):

* **What it measured.** ``tool``/``tool_name`` makes it a tool call
  (``gen_ai.tool.duration``); else a model or token count makes it an LLM
  call (``gen_ai.client.operation.duration``); else ``task_id`` makes it a
  task (``hivemesh.task.duration``); else a bare duration is a ``timer``
  (``hivemesh.duration``). A ``kind`` chooses among those itself; an
  explicit ``name`` and ``value`` (with ``kind``/``unit``) win over all of
  that. Extra attributes may also come as an ``attrs`` map.
* **The value** is the duration in milliseconds (``duration_ms``,
  ``latency_ms``...; ``duration_s``... times 1000). An LLM call with tokens
  but no duration becomes ``gen_ai.client.token.usage`` (unit ``{token}``,
  value the total). Nothing measurable at all is refused ("no measurement").
* **GenAI attributes.** Model, provider, operation, tool, input and output
  tokens (also from an OpenAI-style ``usage`` map), a total token count
  (``tokens_used``, ``total_tokens``; kept as ``gen_ai.usage.total_tokens``),
  ``error.type`` from ``error``/``error_type``, a false ``success``/``ok``
  or a failing ``status``, and ``hivemesh.task.id``.
* **Time and identity.** ``timestamp``/``ts``/``ts_ms`` (epoch seconds or
  milliseconds, or ISO-8601 text) and an ``id`` for de-duplication.
* Every other scalar field is kept as an attribute (``cost_usd``...); a
  nested value is refused, naming the field.

Pure: no I/O, no clock (a record without a time gets the collector's).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from hivemesh.errors import DecodeError, FrameTooLarge
from hivemesh.telemetry.errors import InvalidRecord
from hivemesh.telemetry.schema import (
    ATTR_ERROR_TYPE,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TASK_ID,
    ATTR_TOOL,
    BATCH_TYPE,
    MAX_BATCH_RECORDS,
    NAME_LLM_DURATION,
    NAME_TASK_DURATION,
    NAME_TOOL_DURATION,
)

__all__ = [
    "ALIASES",
    "ATTR_TOTAL_TOKENS",
    "NAME_DURATION",
    "NAME_TOKEN_USAGE",
    "batch_of",
    "record_of",
]

#: Total tokens when a sender does not split them into input and output.
ATTR_TOTAL_TOKENS = "gen_ai.usage.total_tokens"
#: An LLM call reported with tokens but no duration.
NAME_TOKEN_USAGE = "gen_ai.client.token.usage"
#: A bare duration (no tool, model, tokens or task).
NAME_DURATION = "hivemesh.duration"

#: Field -> the spellings accepted for it in a flat record.
ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("name", "metric"),
    "value": ("value",),
    "kind": ("kind",),
    "unit": ("unit",),
    "id": ("id", "event_id", "record_id"),
    "ts": ("ts_ms", "timestamp_ms", "timestamp", "ts", "time"),
    "agent": ("agent", "agent_id", "agent_name"),
    "model": (ATTR_MODEL, "model", "model_name", "model_id"),
    "provider": (ATTR_PROVIDER, "provider", "model_provider"),
    "operation": (ATTR_OPERATION, "operation", "operation_name"),
    "tool": (ATTR_TOOL, "tool", "tool_name"),
    "task_id": (ATTR_TASK_ID, "task_id", "task"),
    "input_tokens": (ATTR_INPUT_TOKENS, "input_tokens", "prompt_tokens", "tokens_in"),
    "output_tokens": (ATTR_OUTPUT_TOKENS, "output_tokens", "completion_tokens", "tokens_out"),
    "total_tokens": (ATTR_TOTAL_TOKENS, "total_tokens", "tokens_used", "tokens"),
    "duration_ms": ("duration_ms", "latency_ms", "elapsed_ms", "time_ms"),
    "duration_s": ("duration_s", "latency_s", "elapsed_s", "duration_seconds"),
    "success": ("success", "ok", "succeeded"),
    "status": ("status", "outcome"),
    "error": (ATTR_ERROR_TYPE, "error_type", "error"),
    "usage": ("usage",),
}
_DURATION_NAMES = {
    "llm_call": NAME_LLM_DURATION,
    "tool_call": NAME_TOOL_DURATION,
    "task": NAME_TASK_DURATION,
    "timer": NAME_DURATION,
}
_OK_STATUS = frozenset({"ok", "success", "succeeded", "completed", "complete", "done", "passed"})
_MAX_TS_MS = 2**53
_TS_SECONDS_BELOW = 100_000_000_000  # smaller epoch numbers are seconds (before 1973 in ms)


def batch_of(message: Any) -> dict[str, Any]:
    """A batch envelope for a hand-sent ``message`` (see module docs); raises
    :class:`InvalidRecord` (or :class:`DecodeError`, :class:`FrameTooLarge`)
    with the reason it cannot be telemetry."""
    if isinstance(message, dict):
        if "records" in message:
            return message
        flat = {k: v for k, v in message.items() if not (k == "type" and v == BATCH_TYPE)}
        return {"records": [record_of(flat)]}
    if isinstance(message, list):
        if not message:
            raise InvalidRecord("an empty list holds no measurement")
        if len(message) > MAX_BATCH_RECORDS:
            raise FrameTooLarge(f"{len(message)} records exceeds {MAX_BATCH_RECORDS}")
        records = []
        for i, m in enumerate(message):
            if not isinstance(m, dict):
                raise InvalidRecord(f"item {i} is a {type(m).__name__}, not a JSON object")
            try:
                records.append(record_of(m))
            except InvalidRecord as exc:
                raise type(exc)(f"item {i}: {exc}") from None
        return {"records": records}
    raise DecodeError(
        f"telemetry must be a JSON object (or a list of them), not a {type(message).__name__}"
    )


def record_of(flat: dict[str, Any]) -> dict[str, Any]:
    """One record in the schema of :mod:`.schema` from one flat map (module docs)."""
    rest = dict(flat)
    got: dict[str, Any] = {}
    for field, spellings in ALIASES.items():
        found = [s for s in spellings if s in rest]
        if len(found) > 1:
            raise InvalidRecord(f"{' and '.join(map(repr, found))} both give the {field}")
        if found:
            got[field] = rest.pop(found[0])
    usage = got.pop("usage", None)
    if usage is not None:
        if not isinstance(usage, dict):
            raise InvalidRecord("'usage' must be a map of token counts")
        for field, keys in (("input_tokens", ("input_tokens", "prompt_tokens")),
                            ("output_tokens", ("output_tokens", "completion_tokens")),
                            ("total_tokens", ("total_tokens",))):  # fmt: skip
            for k in keys:
                if k in usage and field not in got:
                    got[field] = usage[k]
    given = rest.pop("attrs", None)
    if given is not None and not isinstance(given, dict):
        raise InvalidRecord("attrs must be a map")
    attrs: dict[str, Any] = {}
    for k, v in [*(given or {}).items(), *rest.items()]:
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise InvalidRecord(
                f"field {str(k)[:40]!r} is a {type(v).__name__}: only numbers, text and"
                " true/false can be kept as attributes"
            )
        if v is not None:
            attrs[str(k)] = v
    for field, attr in (("model", ATTR_MODEL), ("provider", ATTR_PROVIDER),
                        ("operation", ATTR_OPERATION), ("tool", ATTR_TOOL),
                        ("task_id", ATTR_TASK_ID)):  # fmt: skip
        if got.get(field) is not None:
            attrs[attr] = _text(got[field], field)
    tokens = {}
    for field, attr in (("input_tokens", ATTR_INPUT_TOKENS), ("output_tokens", ATTR_OUTPUT_TOKENS),
                        ("total_tokens", ATTR_TOTAL_TOKENS)):  # fmt: skip
        if got.get(field) is not None:
            tokens[field] = attrs[attr] = _count(got[field], _spelling(flat, field))
    error = _error_type(got)
    if error is not None:
        attrs[ATTR_ERROR_TYPE] = error
    rec: dict[str, Any] = {}
    duration = _duration_ms(got, flat)
    kind = got.get("kind")
    if got.get("name") is not None or got.get("value") is not None:
        if got.get("name") is None or got.get("value") is None:
            raise InvalidRecord("a record with a 'name' needs a 'value' too, and the other way")
        rec.update(name=got["name"], value=got["value"], kind=kind or "gauge")
        if got.get("unit") is not None:
            rec["unit"] = got["unit"]
    else:
        if kind is None:
            kind = ("tool_call" if "tool" in got else "llm_call" if "model" in got or tokens
                    else "task" if "task_id" in got else "timer")  # fmt: skip
        name = _DURATION_NAMES.get(kind) if isinstance(kind, str) else None
        if name is None:
            raise InvalidRecord(f"a {str(kind)[:20]!r} record needs a 'name' and a 'value'")
        rec.update(kind=kind, name=name, value=duration, unit="ms")
        if kind == "tool_call":
            attrs.setdefault(ATTR_OPERATION, "execute_tool")
        if kind == "llm_call" and duration is None and tokens:
            total = tokens.get("total_tokens")
            if total is None:
                total = tokens.get("input_tokens", 0) + tokens.get("output_tokens", 0)
            rec.update(name=NAME_TOKEN_USAGE, value=total, unit="{token}")
    if rec["value"] is None:
        raise InvalidRecord(
            "no measurement: give a duration (duration_ms, latency_ms, duration_s), token"
            " counts (tokens_used, input_tokens, output_tokens) or a name and a value"
        )
    if got.get("agent") is not None:
        rec["agent"] = _text(got["agent"], "agent")
    if got.get("id") is not None:
        rec["id"] = _text(got["id"], "id")
    if got.get("ts") is not None:
        rec["ts_ms"] = _ts_ms(got["ts"])
    if attrs:
        rec["attrs"] = attrs
    return rec


def _spelling(flat: dict[str, Any], field: str) -> str:
    return next((s for s in ALIASES[field] if s in flat), field)


def _text(v: Any, field: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise InvalidRecord(f"{field} must be text, not {type(v).__name__}")
    return str(v)


def _count(v: Any, field: str) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if type(v) is not int or v < 0:
        raise InvalidRecord(f"{field} must be a whole number >= 0, not {v!r:.40}")
    return v


def _number(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise InvalidRecord(f"{field} must be a number >= 0, not {v!r:.40}")
    return float(v)


def _duration_ms(got: dict[str, Any], flat: dict[str, Any]) -> float | None:
    ms, s = got.get("duration_ms"), got.get("duration_s")
    if ms is not None and s is not None:
        raise InvalidRecord("both a duration in ms and one in seconds: send one")
    if ms is not None:
        return _number(ms, _spelling(flat, "duration_ms"))
    if s is not None:
        return _number(s, _spelling(flat, "duration_s")) * 1000.0
    return None


def _error_type(got: dict[str, Any]) -> str | None:
    err = got.get("error")
    if isinstance(err, str) and err:
        return err[:256]
    if err is not None and not isinstance(err, bool):
        raise InvalidRecord("error must be text (the error type) or true/false")
    failed = err is True
    success = got.get("success")
    if success is not None:
        if not isinstance(success, bool):
            raise InvalidRecord("success must be true or false")
        failed = failed or not success
    status = got.get("status")
    if status is not None:
        if not isinstance(status, str):
            raise InvalidRecord("status must be text")
        if status.lower() not in _OK_STATUS:
            return status[:256] or "error"
    return "error" if failed else None


def _ts_ms(v: Any) -> int:
    if isinstance(v, str):
        try:
            when = datetime.datetime.fromisoformat(v)
        except ValueError:
            raise InvalidRecord(f"timestamp {v[:40]!r} is not ISO-8601 or epoch time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        v = when.timestamp() * 1000
    elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidRecord("timestamp must be epoch seconds or milliseconds, or ISO-8601 text")
    elif v < _TS_SECONDS_BELOW:
        v = v * 1000
    ms = int(v)
    if not 0 <= ms <= _MAX_TS_MS:
        raise InvalidRecord("timestamp out of range")
    return ms
