"""The metric record and batch schema, and its strict validator.

Theory of operation
-------------------
A **record** is one measurement: a small flat map. A **batch** is what a
sender delivers to the ``metrics-collector`` node in one acknowledged direct
message::

    {"type": "metrics", "v": 1, "hi": 1500, "backlog": 480,
     "records": [{"seq": 1021, "ts_ms": 1764405000123, "kind": "llm_call",
                  "name": "gen_ai.client.operation.duration", "value": 812.5,
                  "unit": "ms", "agent": "planner",
                  "attrs": {"gen_ai.request.model": "gpt-4o-mini",
                            "gen_ai.usage.input_tokens": 1200,
                            "gen_ai.usage.output_tokens": 85}}, ...]}

Batches arrive as msgpack bytes (our senders), JSON bytes (a human with
``hivemesh send-message``) or an already-decoded dict (the mesh). Only
``records`` is required, and in a record only ``name`` and ``value``, so a
hand-written batch is short.

Names follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.usage.input_tokens``, ``gen_ai.request.model``, ``gen_ai.tool.name``,
``error.type``...). Durations are stored in milliseconds (``unit`` ``"ms"``),
not the seconds of the OTel histogram, so queries read naturally; the OTLP
sink converts.

Validation is strict and total: an unknown field, a wrong type, a non-finite
number, an over-long string or too many attributes raises a
:class:`~hivemesh.telemetry.errors.InvalidRecord` (or its ``UnknownField``,
:class:`~hivemesh.errors.FrameTooLarge`) naming the problem; the collector
counts it by ``code`` and drops only that record (or the whole batch when the
envelope itself is bad). Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from hivemesh.core.codec import unpack
from hivemesh.errors import DecodeError, FrameTooLarge
from hivemesh.telemetry.errors import InvalidRecord, UnknownField

__all__ = [
    "ATTR_ERROR_TYPE",
    "ATTR_INPUT_TOKENS",
    "ATTR_MODEL",
    "ATTR_OPERATION",
    "ATTR_OUTPUT_TOKENS",
    "ATTR_PROVIDER",
    "ATTR_TASK_ID",
    "ATTR_TOOL",
    "BATCH_TYPE",
    "KINDS",
    "MAX_ATTRS",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_STR_CHARS",
    "NAME_LLM_DURATION",
    "NAME_TASK_DURATION",
    "NAME_TOOL_DURATION",
    "ROW_FIELDS",
    "Batch",
    "Row",
    "decode_batch",
    "validate_record",
]

#: Value of a batch's ``type`` field.
BATCH_TYPE = "metrics"
#: Largest encoded batch accepted (one direct message).
MAX_BATCH_BYTES = 1024 * 1024
#: Most records in one batch.
MAX_BATCH_RECORDS = 5000
#: Longest string anywhere in a record (name, unit, agent, id, attribute key or value).
MAX_STR_CHARS = 256
#: Most attributes on one record.
MAX_ATTRS = 32

#: Record kinds.
KINDS = ("counter", "gauge", "timer", "llm_call", "tool_call", "task")

# OpenTelemetry GenAI semantic-convention names (plus ``hivemesh.*`` where none exists).
NAME_LLM_DURATION = "gen_ai.client.operation.duration"
NAME_TOOL_DURATION = "gen_ai.tool.duration"
NAME_TASK_DURATION = "hivemesh.task.duration"
ATTR_MODEL = "gen_ai.request.model"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_TOOL = "gen_ai.tool.name"
ATTR_ERROR_TYPE = "error.type"
ATTR_TASK_ID = "hivemesh.task.id"

_BATCH_FIELDS = frozenset({"type", "v", "hi", "backlog", "records"})
_RECORD_FIELDS = frozenset(
    {"seq", "id", "ts_ms", "kind", "name", "value", "unit", "agent", "attrs"}
)
_KINDS = frozenset(KINDS)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*\Z")
_MAX_SEQ = 2**62
_MAX_TS_MS = 2**53


#: Column order of the tuple :func:`validate_record` returns.
ROW_FIELDS = (
    "seq",
    "id",
    "ts_ms",
    "kind",
    "name",
    "value",
    "unit",
    "agent",
    "model",
    "tool",
    "operation",
    "ok",
    "error_type",
    "input_tokens",
    "output_tokens",
    "attrs",
)

#: One validated record flattened into store columns, in :data:`ROW_FIELDS` order.
Row = tuple[
    int | None,
    str | None,
    int | None,
    str,
    str,
    float,
    str,
    str,
    str | None,
    str | None,
    str | None,
    bool,
    str | None,
    int | None,
    int | None,
    str,
]


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch envelope: its records are still raw (validated one by one)."""

    records: list[Any]
    hi: int | None
    backlog: int | None


def decode_batch(payload: bytes | bytearray | memoryview | dict[str, Any]) -> Batch:
    """Decode and check a batch envelope (not its records).

    Raises :class:`FrameTooLarge`, :class:`DecodeError`, :class:`InvalidRecord`
    or :class:`UnknownField` for a bad envelope.
    """
    as_text = True  # JSON and in-process dicts need the UTF-8 check below; msgpack does not
    if isinstance(payload, dict):
        obj: Any = payload
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
        if len(data) > MAX_BATCH_BYTES:
            raise FrameTooLarge(f"batch of {len(data)} bytes exceeds {MAX_BATCH_BYTES}")
        if data[:1] == b"{":
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError) as exc:
                raise DecodeError(f"malformed JSON batch: {exc}") from None
        else:
            obj = unpack(data, limit=MAX_BATCH_BYTES)
            as_text = False
    else:
        raise DecodeError(f"batch must be bytes or a map, got {type(payload).__name__}")
    if not isinstance(obj, dict):
        raise InvalidRecord(f"batch must be a map, got {type(obj).__name__}")
    if as_text:
        # JSON escapes and in-process dicts can carry lone surrogates that no store accepts.
        try:
            json.dumps(obj, ensure_ascii=False, default=repr).encode("utf-8")
        except (UnicodeEncodeError, TypeError, ValueError, RecursionError) as exc:
            raise DecodeError(f"batch is not valid UTF-8 text: {exc}") from None
    extra = set(obj) - _BATCH_FIELDS
    if extra:
        raise UnknownField(f"unknown batch fields: {sorted(map(str, extra))}")
    if obj.get("type", BATCH_TYPE) != BATCH_TYPE:
        raise InvalidRecord(f"batch type must be {BATCH_TYPE!r}")
    if obj.get("v", 1) != 1:
        raise InvalidRecord(f"unsupported batch version {obj.get('v')!r}")
    records = obj.get("records")
    if not isinstance(records, list):
        raise InvalidRecord("batch needs a list of records")
    if len(records) > MAX_BATCH_RECORDS:
        raise FrameTooLarge(f"{len(records)} records exceeds {MAX_BATCH_RECORDS}")
    hi = _opt_int(obj.get("hi"), "hi", 0, _MAX_SEQ)
    backlog = _opt_int(obj.get("backlog"), "backlog", 0, _MAX_SEQ)
    return Batch(records=records, hi=hi, backlog=backlog)


def _opt_int(v: Any, field: str, lo: int, hi: int) -> int | None:
    if v is None:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise InvalidRecord(f"{field} must be an integer in [{lo}, {hi}]")
    return v


def _str(v: Any, field: str) -> str:
    if type(v) is not str:
        raise InvalidRecord(f"{field} must be a string")
    if len(v) > MAX_STR_CHARS:
        raise FrameTooLarge(f"{field} longer than {MAX_STR_CHARS} characters")
    return v


def validate_record(rec: Any) -> Row:
    """Check one raw record against the schema and flatten it into a :data:`Row`.

    The hoisted GenAI attributes (model, tool, tokens, error type) become
    columns; only the remaining attributes are kept, as sorted compact JSON.
    """
    if type(rec) is not dict:
        raise InvalidRecord(f"record must be a map, got {type(rec).__name__}")
    if not rec.keys() <= _RECORD_FIELDS:
        unknown = sorted(map(str, set(rec) - _RECORD_FIELDS))
        raise UnknownField(f"unknown record fields: {unknown}")
    get = rec.get
    name: Any = get("name")
    if type(name) is not str or name not in _good_names:  # (a list is unhashable)
        _check_name(name)
    value: Any = get("value")
    tv = type(value)
    if tv is int:
        if not -(2**64) < value < 2**64:  # beyond msgpack's range (a JSON or dict payload)
            raise InvalidRecord("value out of range")
        value = float(value)
    elif tv is not float or not math.isfinite(value):
        raise InvalidRecord("value must be a finite number")
    kind = get("kind", "gauge")
    if type(kind) is not str or kind not in _KINDS:
        raise InvalidRecord(f"unknown kind {str(kind)[:20]!r}")
    seq = get("seq")
    if seq is not None and (type(seq) is not int or not 1 <= seq <= _MAX_SEQ):
        raise InvalidRecord(f"seq must be an integer in [1, {_MAX_SEQ}]")
    ts_ms = get("ts_ms")
    if ts_ms is not None and (type(ts_ms) is not int or not 0 <= ts_ms <= _MAX_TS_MS):
        raise InvalidRecord(f"ts_ms must be an integer in [0, {_MAX_TS_MS}]")
    rid = get("id")
    if rid is not None:
        _str(rid, "id")
    unit = get("unit", "")
    if type(unit) is not str or unit not in _good_units:
        _str(unit, "unit")
    agent = get("agent", "")
    if type(agent) is not str or len(agent) > MAX_STR_CHARS:
        _str(agent, "agent")
    attrs = get("attrs")
    model = tool = operation = error_type = None
    in_tok = out_tok = None
    attrs_json = ""
    if attrs is not None:
        if type(attrs) is not dict:
            raise InvalidRecord("attrs must be a map")
        if len(attrs) > MAX_ATTRS:
            raise FrameTooLarge(f"more than {MAX_ATTRS} attributes")
        extra: dict[str, Any] | None = None
        for k, v in attrs.items():
            if type(k) is not str or len(k) > MAX_STR_CHARS:
                _str(k, "attribute key")
            if v is None:
                continue  # a null attribute is an absent one
            hoist = _HOISTED.get(k)
            if hoist is not None:
                if hoist is str:
                    if type(v) is not str or len(v) > MAX_STR_CHARS:
                        _str(v, k)
                elif type(v) is not int or not 0 <= v <= _MAX_SEQ:
                    raise InvalidRecord(f"{k} must be a non-negative integer")
                continue
            tv = type(v)
            if tv is str:
                if len(v) > MAX_STR_CHARS:
                    raise FrameTooLarge(f"attribute {k[:40]!r} longer than {MAX_STR_CHARS}")
            elif tv is float:
                if not math.isfinite(v):
                    raise InvalidRecord(f"attribute {k[:40]!r} is not finite")
            elif tv is not int and tv is not bool:
                raise InvalidRecord(f"attribute {k[:40]!r} must be a scalar")
            if extra is None:
                extra = {}
            extra[k] = v
        aget = attrs.get
        model = aget(ATTR_MODEL)
        tool = aget(ATTR_TOOL)
        operation = aget(ATTR_OPERATION)
        error_type = aget(ATTR_ERROR_TYPE)
        in_tok = aget(ATTR_INPUT_TOKENS)
        out_tok = aget(ATTR_OUTPUT_TOKENS)
        if extra:
            attrs_json = _encode_attrs(extra)
    return (
        seq,
        rid,
        ts_ms,
        kind,
        name,
        value,
        unit,
        agent,
        model,
        tool,
        operation,
        error_type is None,
        error_type,
        in_tok,
        out_tok,
        attrs_json,
    )


_HOISTED: dict[str, type] = {
    ATTR_MODEL: str,
    ATTR_TOOL: str,
    ATTR_OPERATION: str,
    ATTR_ERROR_TYPE: str,
    ATTR_INPUT_TOKENS: int,
    ATTR_OUTPUT_TOKENS: int,
}
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_attrs_cache: dict[tuple[Any, ...], str] = {}
_ATTRS_CACHE_MAX = 4096


def _encode_attrs(extra: dict[str, Any]) -> str:
    """Sorted compact JSON of the extra attributes, cached for repeated small sets."""
    # Types are part of the key: 1, 1.0 and True are equal and hash alike but encode apart.
    key = tuple([(k, v.__class__, v) for k, v in extra.items()])
    try:
        return _attrs_cache[key]
    except KeyError:
        pass
    out = _ENCODE(extra)
    if len(_attrs_cache) < _ATTRS_CACHE_MAX:
        _attrs_cache[key] = out
    return out


_good_names: set[str] = set()
_good_units: set[str] = {"", "ms", "s", "1", "By", "{token}", "{call}"}
_GOOD_NAMES_MAX = 4096


def _check_name(name: Any) -> None:
    _str(name, "name")
    if not _NAME_RE.match(name):
        raise InvalidRecord(f"bad metric name {name[:40]!r}")
    if len(_good_names) < _GOOD_NAMES_MAX:
        _good_names.add(name)
