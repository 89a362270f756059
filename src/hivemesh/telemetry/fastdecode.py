"""Fast path for batches from our own senders: whole-batch typed msgpack decoding.

Theory of operation
-------------------
(The decoded structs are ``gc=False``: decoded data cannot form reference
cycles, and a batch of 5,000 records tracked by the cyclic GC cost more than
decoding it.)

Our senders send msgpack. msgspec decodes and checks a whole batch against the
same rules as :func:`~.schema.validate_record`, in C: first with a struct
that knows the attributes our recorder writes (no Python loop over
attributes at all), then with a general attribute map. Anything either
decoder refuses, or that fails the few checks left to Python (finite numbers,
hoisted attribute types, name syntax), returns None and the caller falls back
to the slow path (:func:`~.schema.decode_batch` +
:func:`~.schema.validate_record`), which decides record by record with
precise, counted errors. The fast path may decline a valid batch; it never
accepts an invalid one, and what it accepts it flattens exactly as the slow
path does (a property test holds it to that).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgspec

from hivemesh.errors import HivemeshError
from hivemesh.telemetry.schema import (
    _HOISTED,
    _MAX_SEQ,
    _MAX_TS_MS,
    ATTR_ERROR_TYPE,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TASK_ID,
    ATTR_TOOL,
    MAX_ATTRS,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_STR_CHARS,
    _check_name,
    _encode_attrs,
    _good_names,
)

__all__ = ["decode_rows_fast"]

_FStr = Annotated[str, msgspec.Meta(max_length=MAX_STR_CHARS)]
_FSeq = Annotated[int, msgspec.Meta(ge=1, le=_MAX_SEQ)]
_FCount = Annotated[int, msgspec.Meta(ge=0, le=_MAX_SEQ)]
_FTs = Annotated[int, msgspec.Meta(ge=0, le=_MAX_TS_MS)]
_FKind = Literal["counter", "gauge", "timer", "llm_call", "tool_call", "task"]


class _FRecord(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: _FStr
    value: float  # finiteness is checked after decoding
    seq: _FSeq | None = None
    id: _FStr | None = None
    ts_ms: _FTs | None = None
    kind: _FKind = "gauge"
    unit: _FStr = ""
    agent: _FStr = ""
    attrs: (
        Annotated[dict[_FStr, _FStr | int | float | bool], msgspec.Meta(max_length=MAX_ATTRS)]
        | None
    ) = None


class _FBatch(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    records: Annotated[list[_FRecord], msgspec.Meta(max_length=MAX_BATCH_RECORDS)]
    type: Literal["metrics"] = "metrics"
    v: Literal[1] = 1
    hi: _FCount | None = None
    backlog: _FCount | None = None


_FAST_DECODER = msgspec.msgpack.Decoder(_FBatch)


class _FTypedAttrs(
    msgspec.Struct,
    forbid_unknown_fields=True,
    gc=False,
    rename={
        "model": ATTR_MODEL,
        "tool": ATTR_TOOL,
        "operation": ATTR_OPERATION,
        "error_type": ATTR_ERROR_TYPE,
        "input_tokens": ATTR_INPUT_TOKENS,
        "output_tokens": ATTR_OUTPUT_TOKENS,
        "provider": ATTR_PROVIDER,
        "task_id": ATTR_TASK_ID,
    },
):
    """The attributes our own recorder writes, decoded without a Python loop."""

    model: _FStr | None = None
    tool: _FStr | None = None
    operation: _FStr | None = None
    error_type: _FStr | None = None
    input_tokens: _FCount | None = None
    output_tokens: _FCount | None = None
    provider: _FStr | None = None
    task_id: _FStr | None = None


class _FTypedRecord(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: _FStr
    value: float
    seq: _FSeq | None = None
    id: _FStr | None = None
    ts_ms: _FTs | None = None
    kind: _FKind = "gauge"
    unit: _FStr = ""
    agent: _FStr = ""
    attrs: _FTypedAttrs | None = None


class _FTypedBatch(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    records: Annotated[list[_FTypedRecord], msgspec.Meta(max_length=MAX_BATCH_RECORDS)]
    type: Literal["metrics"] = "metrics"
    v: Literal[1] = 1
    hi: _FCount | None = None
    backlog: _FCount | None = None


_TYPED_DECODER = msgspec.msgpack.Decoder(_FTypedBatch)


def _columns_typed(batch: _FTypedBatch, sender: str, now_ms: int) -> list[list[Any]] | None:
    """Store columns for a typed batch, built column by column (list comprehensions)."""
    recs = batch.records
    n = len(recs)
    names = [r.name for r in recs]
    for name in set(names) - _good_names:
        try:
            _check_name(name)
        except HivemeshError:
            return None
    values = [r.value for r in recs]
    if not all(map(math.isfinite, values)):
        return None
    ts = [r.ts_ms for r in recs]
    if None in ts:
        ts = [now_ms if t is None else t for t in ts]
    attrs = [r.attrs for r in recs]
    model: list[Any]
    tool: list[Any]
    op: list[Any]
    err: list[Any]
    tin: list[Any]
    tout: list[Any]
    ok: list[bool]
    extra: list[str]
    if attrs.count(None) == n:
        none = [None] * n
        model = tool = op = err = tin = tout = none
        ok = [True] * n
        extra = [""] * n
    else:
        have = [a if a is not None else _NO_ATTRS for a in attrs]
        model = [a.model for a in have]
        tool = [a.tool for a in have]
        op = [a.operation for a in have]
        err = [a.error_type for a in have]
        ok = [e is None for e in err]
        tin = [a.input_tokens for a in have]
        tout = [a.output_tokens for a in have]
        extra = [
            _extra_json(a) if a.provider is not None or a.task_id is not None else "" for a in have
        ]
    return [
        [sender] * n,
        [r.seq for r in recs],
        [r.id for r in recs],
        ts,
        [now_ms] * n,
        [r.kind for r in recs],
        names,
        values,
        [r.unit for r in recs],
        [r.agent for r in recs],
        model,
        tool,
        op,
        ok,
        err,
        tin,
        tout,
        extra,
    ]


_NO_ATTRS = _FTypedAttrs()


def _extra_json(a: _FTypedAttrs) -> str:
    extra: dict[str, Any] = {}
    if a.provider is not None:
        extra[ATTR_PROVIDER] = a.provider
    if a.task_id is not None:
        extra[ATTR_TASK_ID] = a.task_id
    return _encode_attrs(extra) if extra else ""


def decode_rows_fast(
    data: bytes, sender: str, now_ms: int
) -> tuple[list[list[Any]], int | None, int | None] | None:
    """Decode and validate a whole msgpack batch at once: ``(columns, hi, backlog)``.

    ``columns`` are the store's columns (``sender`` and ``recv_ms`` filled in,
    ``ts_ms`` defaulted to ``now_ms``) in :data:`~.store.COLUMNS` order, one
    list each, all of the batch's length.

    Returns None when anything is off (the caller then uses :func:`decode_batch`
    and :func:`validate_record` to find and count exactly what).
    """
    if len(data) > MAX_BATCH_BYTES or data[:1] == b"{":
        return None
    try:
        typed = _TYPED_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass  # other attributes, or bad input: try the general decoder
    else:
        cols = _columns_typed(typed, sender, now_ms)
        return None if cols is None else (cols, typed.hi, typed.backlog)
    try:
        batch = _FAST_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    good_names = _good_names
    hoisted = _HOISTED
    isfinite = math.isfinite
    for r in batch.records:
        name = r.name
        if name not in good_names:
            try:
                _check_name(name)
            except HivemeshError:
                return None
        attrs = r.attrs
        if not isfinite(r.value):
            return None
        ts = r.ts_ms
        if ts is None:
            ts = now_ms
        if not attrs:
            append((sender, r.seq, r.id, ts, now_ms, r.kind, name, r.value, r.unit, r.agent,
                    None, None, None, True, None, None, None, ""))  # fmt: skip
            continue
        extra: dict[str, Any] | None = None
        for k, v in attrs.items():
            hoist = hoisted.get(k)
            if hoist is not None:
                if type(v) is not hoist or (hoist is int and not 0 <= v <= _MAX_SEQ):  # type: ignore[operator]
                    return None
            elif type(v) is float and not isfinite(v):
                return None
            elif extra is None:
                extra = {k: v}
            else:
                extra[k] = v
        aget = attrs.get
        error_type = aget(ATTR_ERROR_TYPE)
        append(
            (sender, r.seq, r.id, ts, now_ms, r.kind, name, r.value, r.unit, r.agent,
             aget(ATTR_MODEL), aget(ATTR_TOOL), aget(ATTR_OPERATION),
             error_type is None, error_type,
             aget(ATTR_INPUT_TOKENS), aget(ATTR_OUTPUT_TOKENS),
             _encode_attrs(extra) if extra else "")
        )  # fmt: skip
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(18)]
    return columns, batch.hi, batch.backlog
