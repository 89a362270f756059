"""Hand-written flat telemetry mapped onto the record schema (pure, no I/O)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.errors import HivemeshError
from hivemesh.telemetry.errors import InvalidRecord
from hivemesh.telemetry.flat import batch_of
from hivemesh.telemetry.schema import validate_record


def one(message: Any) -> dict[str, Any]:
    (rec,) = batch_of(message)["records"]
    validate_record(rec)
    return rec


def test_the_seed_example() -> None:
    rec = one({"agent_id": "agent-7", "tokens_used": 1200, "duration_ms": 3400})
    assert rec == {"kind": "llm_call", "name": "gen_ai.client.operation.duration",
                   "value": 3400.0, "unit": "ms", "agent": "agent-7",
                   "attrs": {"gen_ai.usage.total_tokens": 1200}}  # fmt: skip


@pytest.mark.parametrize(
    ("message", "kind", "name", "value"),
    [
        ({"tool": "search", "latency_ms": 3}, "tool_call", "gen_ai.tool.duration", 3.0),
        ({"model": "m", "duration_s": 1.5}, "llm_call", "gen_ai.client.operation.duration", 1500.0),
        ({"usage": {"prompt_tokens": 4, "completion_tokens": 6}}, "llm_call",
         "gen_ai.client.token.usage", 10),
        ({"task_id": "t", "elapsed_ms": 8}, "task", "hivemesh.task.duration", 8.0),
        ({"duration_ms": 2}, "timer", "hivemesh.duration", 2.0),
        ({"metric": "queue.depth", "value": 4, "kind": "gauge"}, "gauge", "queue.depth", 4),
        ({"type": "metrics", "kind": "task", "duration_ms": 1}, "task", "hivemesh.task.duration",
         1.0),
    ],
)  # fmt: skip
def test_flat_shapes(message: dict[str, Any], kind: str, name: str, value: float) -> None:
    rec = one(message)
    assert (rec["kind"], rec["name"], rec["value"]) == (kind, name, value)


def test_outcome_time_and_extra_fields() -> None:
    rec = one({"tool": "t", "latency_ms": 1, "success": False, "timestamp": 1_900_000_000,
               "id": "x1", "cost_usd": 0.5})  # fmt: skip
    assert rec["attrs"]["error.type"] == "error" and rec["ts_ms"] == 1_900_000_000_000
    assert rec["id"] == "x1" and rec["attrs"]["cost_usd"] == 0.5
    assert one({"duration_ms": 1, "status": "ok"}).get("attrs") is None
    assert one({"duration_ms": 1, "status": "timeout"})["attrs"]["error.type"] == "timeout"
    assert (
        one({"duration_ms": 1, "timestamp": "2030-03-17T17:46:40Z"})["ts_ms"] == 1_900_000_000_000
    )


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"agent_id": "a", "mood": "great"}, "no measurement"),
        ({"duration_ms": 1, "latency_ms": 2}, "both give"),
        ({"tokens_used": -3}, "tokens_used must be a whole number"),
        ({"duration_ms": 1, "extra": {"deep": 1}}, "'extra' is a dict"),
        ({"name": "x"}, "needs a 'value'"),
        ({"kind": "counter", "duration_ms": 1}, "needs a 'name'"),
        ({"duration_ms": 1, "timestamp": "yesterday"}, "ISO-8601"),
        ([], "empty list"),
        ([{"duration_ms": 1}, 3], "item 1"),
    ],
)
def test_what_cannot_be_mapped_says_why(message: Any, reason: str) -> None:
    with pytest.raises(InvalidRecord, match=reason):
        batch_of(message)


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=8,
)  # fmt: skip
_keys = st.sampled_from(["agent_id", "tokens_used", "duration_ms", "model", "tool", "status",
                         "success", "error", "timestamp", "usage", "name", "value", "kind",
                         "task_id", "duration_s", "id", "attrs", "x"])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6) | _json)
def test_garbage_is_mapped_or_refused_with_a_typed_error(message: Any) -> None:
    try:
        batch = batch_of(message)
    except HivemeshError:
        return
    for rec in batch["records"]:
        with contextlib.suppress(HivemeshError):  # the collector's next step: typed errors only
            validate_record(rec)
