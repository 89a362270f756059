"""Columnar metric batches (``"v": 2``): what our senders put in a direct message.

Theory of operation
-------------------
A v1 batch (:mod:`.schema`) is a list of record maps: every key travels with
every record (~190 bytes each), and the collector decodes and flattens each
record in Python. A v2 batch carries the same records column by column:

* integer columns (``seq``, ``ts_ms``, the token counts) as a base plus
  packed little-endian unsigned offsets 1, 2, 4 or 8 bytes wide (width 0: the
  run ``base, base+1, ...``, which is how consecutive seqs travel); in a
  nullable column raw 0 is null and raw ``k`` is ``base + k - 1``;
* ``value`` as packed float64;
* everything descriptive -- kind, name, unit, agent, model, tool, operation,
  error type, id and the attributes that are not hoisted into columns -- as
  one dictionary: ``dims`` lists each distinct combination once, and one 1,
  2 or 4-byte code per record says which (a fleet's records fall into few
  combinations: "llm_call of gpt-4o-mini by agent-3").

That is ~20 bytes a record, so one direct message carries
:data:`~.schema.MAX_BATCH_RECORDS` records; the sender builds one tuple a
record, and the collector builds the Arrow columns from the buffers and checks
them with vectorised kernels plus one check per *distinct* combination: no
Python work per record.

Same records, same rules. A v2 batch *means* the records it rebuilds to
(:func:`rebuild_records`: hoisted attributes that are not null, plus the
extra map). :func:`encode_columnar` (sender) returns None when a spooled
record does not fit the typed form; the sender then sends v1 and the
collector judges each record. :func:`decode_columnar` (collector) returns
the store's columns as an Arrow record batch only when every rebuilt record
passes :func:`~.schema.validate_record` and flattens to the same row (a
property test holds it to that); when any check fails it returns None and
the collector validates the rebuilt records one by one (precise, counted
rejections, as for v1). A structurally broken v2 batch (a code past its
dictionary, a column of the wrong length) raises :class:`DecodeError` and is
refused whole.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import msgspec

from hivemesh.errors import DecodeError, HivemeshError
from hivemesh.telemetry.fastdecode import _NO_ATTRS, _FRecord, _FTypedRecord
from hivemesh.telemetry.schema import (
    _HOISTED,
    _KINDS,
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
    MAX_BATCH_RECORDS,
    MAX_STR_CHARS,
    _check_name,
    _encode_attrs,
    _good_names,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["ColumnarBatch", "decode_columnar", "encode_columnar", "rebuild_records"]

_LITTLE = sys.byteorder == "little"
_U64_MAX = 2**64 - 1
_I64_MAX = 2**63 - 1
_UNSIGNED = {1: "B", 2: "H", 4: "I", 8: "Q"}  # width -> array typecode (Arrow: uint<8*width>)
_CODE_TYPES = {1: "B", 2: "H", 4: "I"}

_Str = Annotated[str, msgspec.Meta(max_length=MAX_STR_CHARS)]
_Scalar = _Str | int | float | bool
_Attrs = Annotated[dict[_Str, _Scalar], msgspec.Meta(max_length=MAX_ATTRS)]
#: One distinct combination: kind, name, unit, agent, model, tool, operation,
#: error type, id, extra attributes.
_Dim = tuple[
    _Str, _Str, _Str, _Str, _Str | None, _Str | None, _Str | None, _Str | None, _Str | None,
    _Attrs | None,
]  # fmt: skip
_DIM_FIELDS = ("kind", "name", "unit", "agent", "model", "tool", "operation", "error_type", "id")
_HOISTED_STR = (ATTR_MODEL, ATTR_TOOL, ATTR_OPERATION, ATTR_ERROR_TYPE)


class _IntCol(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    base: Annotated[int, msgspec.Meta(ge=0, le=_I64_MAX)]
    width: Literal[0, 1, 2, 4, 8]
    data: bytes = b""
    nullable: bool = False


class _Codes(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    width: Literal[1, 2, 4]
    data: bytes


class _Batch2(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["metrics"]
    v: Literal[2]
    n: Annotated[int, msgspec.Meta(ge=0, le=MAX_BATCH_RECORDS)]
    seq: _IntCol
    ts_ms: _IntCol
    value: bytes
    input_tokens: _IntCol
    output_tokens: _IntCol
    dims: Annotated[list[_Dim], msgspec.Meta(max_length=MAX_BATCH_RECORDS)]
    dim: _Codes
    hi: Annotated[int, msgspec.Meta(ge=0, le=_MAX_SEQ)] | None = None
    backlog: Annotated[int, msgspec.Meta(ge=0, le=_MAX_SEQ)] | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Batch2)
_TYPED_RECORDS = msgspec.msgpack.Decoder(list[_FTypedRecord])
_GENERAL_RECORDS = msgspec.msgpack.Decoder(list[_FRecord])

# -- encoding (sender) -------------------------------------------------------------------


def _pack(typecode: str, values: Sequence[int] | Sequence[float]) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        a.byteswap()
    return a.tobytes()


def _int_col(col: list[int | None], *, run: bool = False) -> _IntCol:
    """Pack a column of non-negative ints (the typed decoders checked the ranges)."""
    n = len(col)
    if None not in col:
        packed: array[int] = array("Q", cast(list[int], col))
        if run and n and packed == array("Q", range(packed[0], packed[0] + n)):
            return _IntCol(packed[0], 0)
        if not _LITTLE:  # pragma: no cover - big-endian hosts
            packed.byteswap()
        return _IntCol(0, 8, packed.tobytes())
    raws = [0 if v is None else v + 1 for v in col]  # raw 0: null
    top = max(raws)
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    return _IntCol(0, width, _pack(_UNSIGNED[width], raws), True)  # type: ignore[arg-type]


def _attrs_key(m: dict[str, Any] | None) -> Any:
    # Types are part of the key: 1, 1.0 and True are equal but must not share a code.
    return None if not m else tuple(sorted((k, v.__class__, v) for k, v in m.items()))


def _dims(keys: list[tuple[Any, ...]], dim_of: Any) -> tuple[list[Any], _Codes]:
    """Distinct ``keys`` (each turned into a dims entry by ``dim_of``) and per-record codes."""
    index: dict[Any, int] = {}
    put = index.setdefault
    codes = [put(k, len(index)) for k in keys]  # one hash and lookup a record
    width = 1 if len(index) <= 1 << 8 else 2 if len(index) <= 1 << 16 else 4
    return [dim_of(k) for k in index], _Codes(width, _pack(_CODE_TYPES[width], codes))  # type: ignore[arg-type]


def _typed_dim(k: tuple[Any, ...]) -> tuple[Any, ...]:
    provider, task = k[9], k[10]
    if provider is None and task is None:
        return (*k[:9], None)
    extra: dict[str, Any] = {}
    if provider is not None:
        extra[ATTR_PROVIDER] = provider
    if task is not None:
        extra[ATTR_TASK_ID] = task
    return (*k[:9], extra)


def _general(recs: list[_FRecord]) -> tuple[list[Any], list[Any], list[Any], list[Any]] | None:
    """``(keys, extras, input tokens, output tokens)`` of general records, or None."""
    keys: list[Any] = []
    extras: list[Any] = []
    tin: list[Any] = []
    tout: list[Any] = []
    for r in recs:
        attrs = r.attrs or {}
        extra: dict[str, Any] | None = None
        for k, v in attrs.items():
            hoist = _HOISTED.get(k)
            if hoist is not None:
                if type(v) is not hoist or (hoist is int and not 0 <= v <= _MAX_SEQ):  # type: ignore[operator]
                    return None
            elif type(v) is float and not math.isfinite(v):
                return None
            else:
                if extra is None:
                    extra = {}
                extra[k] = v
        g = attrs.get
        keys.append(
            (r.kind, r.name, r.unit, r.agent, g(ATTR_MODEL), g(ATTR_TOOL), g(ATTR_OPERATION),
             g(ATTR_ERROR_TYPE), r.id, _attrs_key(extra))
        )  # fmt: skip
        extras.append(extra)
        tin.append(g(ATTR_INPUT_TOKENS))
        tout.append(g(ATTR_OUTPUT_TOKENS))
    return keys, extras, tin, tout


def encode_columnar(
    records: Sequence[bytes], hi: int | None = None, backlog: int | None = None
) -> bytes | None:
    """Encode spooled msgpack records (each a map with ``seq``) as one v2 batch.

    Returns None when a record does not fit the typed form (unknown field,
    wrong type, a non-finite number...): send those as v1, where the
    collector judges each record.
    """
    n = len(records)
    if not 0 < n <= MAX_BATCH_RECORDS:
        return None
    blob = b"\xdd" + n.to_bytes(4, "big") + b"".join(records)  # a msgpack array of n maps
    try:
        recs: list[Any] = _TYPED_RECORDS.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError):
        recs = []
    if recs:
        have = [r.attrs or _NO_ATTRS for r in recs]
        keys = [
            (r.kind, r.name, r.unit, r.agent, a.model, a.tool, a.operation, a.error_type, r.id,
             a.provider, a.task_id)
            for r, a in zip(recs, have, strict=True)
        ]  # fmt: skip
        dims, codes = _dims(keys, _typed_dim)
        tin = [a.input_tokens for a in have]
        tout = [a.output_tokens for a in have]
    else:
        try:
            recs = _GENERAL_RECORDS.decode(blob)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        got = _general(recs)
        if got is None:
            return None
        keys, extras, tin, tout = got
        first = dict(zip(keys, extras, strict=True))  # one extra map per distinct key
        dims, codes = _dims(keys, lambda k: (*k[:9], first[k]))
    seqs = [r.seq for r in recs]
    values = [r.value for r in recs]
    if None in seqs or not all(map(math.isfinite, values)):
        return None
    batch = _Batch2(
        type="metrics",
        v=2,
        n=n,
        seq=_int_col(seqs, run=True),
        ts_ms=_int_col([r.ts_ms for r in recs]),
        value=_pack("d", values),
        input_tokens=_int_col(tin),
        output_tokens=_int_col(tout),
        dims=dims,
        dim=codes,
        hi=hi,
        backlog=backlog,
    )
    return _ENCODER.encode(batch)


# -- decoding (collector) ----------------------------------------------------------------


class ColumnarBatch:
    """A decoded v2 batch: the store columns (when valid) and the envelope numbers."""

    __slots__ = ("_seqs", "backlog", "batch", "first_seq", "hi", "n", "raw", "run")

    def __init__(self, raw: Any, seqs: Any) -> None:
        self.raw = raw
        #: The store columns (:data:`~.store.COLUMNS`, the strings dictionary-encoded:
        #: :data:`~.store.DICT_SCHEMA`), or None: validate ``rebuild_records``.
        self.batch: pa.RecordBatch | None = None
        self.n: int = raw.n
        self.hi: int | None = raw.hi
        self.backlog: int | None = raw.backlog
        #: True when the seqs are ``first_seq, first_seq+1, ...``.
        self.run: bool = raw.seq.width == 0
        self.first_seq: int = raw.seq.base
        self._seqs = seqs

    def seqs(self) -> list[int]:
        """Every record's seq, in order."""
        return list(self._seqs.tolist())


def _arrow() -> tuple[Any, Any]:
    """``pyarrow`` and ``numpy``, imported on the first decode: a node that only
    encodes (sends telemetry) never loads Arrow."""
    import numpy as np
    import pyarrow as pa

    return pa, np


class _Ints:
    """One decoded integer column: int64 values, the null mask (or None) and
    the smallest and largest non-null value (None when every value is null)."""

    __slots__ = ("hi", "lo", "mask", "values")

    def __init__(self, values: Any, mask: Any, lo: int | None, hi: int | None) -> None:
        self.values = values
        self.mask = mask
        self.lo = lo
        self.hi = hi

    def array(self) -> pa.Array:
        pa, _ = _arrow()
        return pa.array(self.values, pa.int64(), mask=self.mask)

    def to_list(self) -> list[int | None]:
        vals: list[int | None] = self.values.tolist()
        if self.mask is not None:
            for i in self.mask.nonzero()[0].tolist():
                vals[i] = None
        return vals


def _int_array(col: _IntCol, n: int, what: str) -> _Ints:
    """Unpack an integer column with numpy (one pass each: no Arrow kernel calls)."""
    _, np = _arrow()
    base = col.base
    if col.width == 0:
        if col.nullable or base + n > _I64_MAX:
            raise DecodeError(f"{what}: a bad run")
        return _Ints(np.arange(base, base + n, dtype=np.int64), None, base, base + n - 1)
    if len(col.data) != n * col.width:
        raise DecodeError(f"{what}: {len(col.data)} bytes for {n} values of width {col.width}")
    raw = np.frombuffer(col.data, dtype=f"<u{col.width}")
    if not n:
        return _Ints(np.zeros(0, np.int64), None, None, None)
    top = int(raw.max())
    if base + top > _I64_MAX:
        raise DecodeError(f"{what}: values beyond int64")
    wide = raw.astype(np.int64)
    if not col.nullable:
        if base:
            wide += base
        return _Ints(wide, None, base + int(raw.min()), base + top)
    mask = raw == 0
    if base != 1:
        wide += base - 1
    if not mask.any():
        return _Ints(wide, None, base + int(raw.min()) - 1, base + top - 1)
    if mask.all():
        return _Ints(wide, mask, None, None)
    return _Ints(wide, mask, int(wide[~mask].min()), base + top - 1)


def _codes(raw: Any) -> Any:
    """The per-record dims codes as a numpy int32 array (checked against the table)."""
    _, np = _arrow()
    c, n, ndims = raw.dim, raw.n, len(raw.dims)
    if len(c.data) != n * c.width:
        raise DecodeError(f"dim: {len(c.data)} code bytes for {n} records")
    if ndims > max(n, 1):
        raise DecodeError("dims: more combinations than records")
    idx = np.frombuffer(c.data, dtype=f"<u{c.width}")
    if n and int(idx.max()) >= ndims:
        raise DecodeError("dim: a code past the dims table")
    return idx.astype(np.int32)


def _dim_ok(d: tuple[Any, ...]) -> bool:
    """Every rule :func:`validate_record` applies to a combination's own fields."""
    if d[0] not in _KINDS:
        return False
    if d[1] not in _good_names:
        try:
            _check_name(d[1])
        except HivemeshError:
            return False
    extra = d[9]
    if extra:
        for k, v in extra.items():
            if k in _HOISTED or (type(v) is float and not math.isfinite(v)):
                return False
    return True


def _dict_column(field: Sequence[str | None], codes: Any) -> pa.Array:
    """A dictionary-encoded string column: each distinct value of ``field`` (one
    entry per dims combination) once, indexed through ``codes``; None is null."""
    pa, np = _arrow()
    index: dict[str, int] = {}
    put = index.setdefault
    remap = np.array([-1 if v is None else put(v, len(index)) for v in field], np.int32)
    idx = remap[codes]
    mask = idx < 0 if None in field else None
    return pa.DictionaryArray.from_arrays(
        pa.array(idx, pa.int32(), mask=mask), pa.array(list(index), pa.string())
    )


def decode_columnar(data: bytes, sender: str, now_ms: int) -> ColumnarBatch | None:
    """Decode a v2 batch; None if ``data`` is not one (try v1).

    Raises :class:`DecodeError` for a v2 batch that is structurally broken.
    ``batch`` of the result is None when a record breaks a rule (the caller
    validates :func:`rebuild_records` one by one).
    """
    from hivemesh.telemetry.store import DICT_SCHEMA

    pa, np = _arrow()
    try:
        raw = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    n = raw.n
    seq = _int_array(raw.seq, n, "seq")
    ts = _int_array(raw.ts_ms, n, "ts_ms")
    tin = _int_array(raw.input_tokens, n, "input_tokens")
    tout = _int_array(raw.output_tokens, n, "output_tokens")
    if len(raw.value) != 8 * n:
        raise DecodeError(f"value: {len(raw.value)} bytes for {n} records")
    value = np.frombuffer(raw.value, dtype="<f8")
    codes = _codes(raw)
    out = ColumnarBatch(raw, seq.values)
    if not n:
        return out
    dims = raw.dims
    if not all(map(_dim_ok, dims)):
        return out
    if not (
        seq.mask is None
        and seq.lo is not None
        and seq.hi is not None
        and seq.lo >= 1
        and seq.hi <= _MAX_SEQ
        and (ts.lo is None or (ts.lo >= 0 and ts.hi is not None and ts.hi <= _MAX_TS_MS))
        and (tin.hi is None or tin.hi <= _MAX_SEQ)
        and (tout.hi is None or tout.hi <= _MAX_SEQ)
        and bool(np.isfinite(value).all())
    ):
        return out
    per_dim = [sum(v is not None for v in d[4:8]) + len(d[9] or ()) for d in dims]
    if max(per_dim) + 2 > MAX_ATTRS:  # count each record's attributes, tokens included
        counts = np.array(per_dim, np.int64)[codes]
        for a in (tin, tout):
            counts += 1 if a.mask is None else ~a.mask
        if int(counts.max()) > MAX_ATTRS:
            return out
    fields = list(zip(*dims, strict=True))
    kind, name, unit, agent, model, tool, operation, error_type, rid = (
        _dict_column(f, codes) for f in fields[:9]
    )
    extra = _dict_column(["" if not m else _encode_attrs(m) for m in fields[9]], codes)
    ok = np.array([e is None for e in fields[7]], np.bool_)[codes]
    tsv = ts.values
    if ts.mask is not None:
        tsv[ts.mask] = now_ms
    arrays = [
        pa.DictionaryArray.from_arrays(
            np.zeros(n, np.int32), pa.array([sender], pa.string())
        ),
        pa.array(seq.values, pa.int64()), rid, pa.array(tsv, pa.int64()),
        pa.array(np.full(n, now_ms, np.int64), pa.int64()),
        kind, name, pa.array(value, pa.float64()), unit, agent, model, tool, operation,
        pa.array(ok, pa.bool_()), error_type, tin.array(), tout.array(), extra,
    ]  # fmt: skip
    out.batch = pa.RecordBatch.from_arrays(arrays, schema=DICT_SCHEMA)
    return out


def rebuild_records(cb: ColumnarBatch) -> list[dict[str, Any]]:
    """The records a v2 batch stands for, as maps (for record-by-record validation)."""
    _, np = _arrow()
    raw = cb.raw
    n = cb.n
    dims = raw.dims
    codes = _codes(raw).tolist()
    seq, ts, tin, tout = (
        _int_array(getattr(raw, f), n, f).to_list()
        for f in ("seq", "ts_ms", "input_tokens", "output_tokens")
    )
    values = np.frombuffer(raw.value, dtype="<f8").tolist()
    out: list[dict[str, Any]] = []
    for i in range(n):
        d = dims[codes[i]]
        rec: dict[str, Any] = {
            "seq": seq[i],
            "kind": d[0],
            "name": d[1],
            "value": values[i],
            "unit": d[2],
            "agent": d[3],
        }
        if ts[i] is not None:
            rec["ts_ms"] = ts[i]
        if d[8] is not None:
            rec["id"] = d[8]
        a = dict(d[9]) if d[9] else {}
        hoisted = zip((*_HOISTED_STR, ATTR_INPUT_TOKENS, ATTR_OUTPUT_TOKENS),
                      (*d[4:8], tin[i], tout[i]), strict=True)  # fmt: skip
        a.update((k, v) for k, v in hoisted if v is not None)  # the columns win
        if a:
            rec["attrs"] = a
        out.append(rec)
    return out
