"""An LLM as the reflector's advisor: it may propose a correction.

When an LLM is configured (``HIVEMESH_LLM_*``, as for ``hivemesh agent``),
:func:`llm_advisor` asks it, for each failed tool call, to pick one
corrective action as JSON (``{"action", "route", "strategy", "backoff_ms",
"reason"}``, schema-constrained). The proposal is only taken if it is
well-formed and names a known action, a configured route (for
``switch_route``) or a known strategy (for ``other_strategy``); anything
else, a timeout or an LLM error gives ``None`` and the deterministic rules
decide (:mod:`hivemesh.audit.rules`). The loop guards apply to an advised
correction exactly as to a ruled one, and escalations stay with the rules
(they carry the operator's question).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from hivemesh.audit.rules import STRATEGIES, Correction, History
from hivemesh.errors import HivemeshError

__all__ = ["ADVICE_SCHEMA", "Advisor", "llm_advisor"]

#: ``(shop, error, history, routes) -> a proposed correction, or None``.
Advisor = Callable[[str, str, History, list[str]], Awaitable[Correction | None]]

ADVICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"enum": ["retry", "switch_route", "other_strategy", "abandon"]},
        "route": {"type": "string"},
        "strategy": {"type": "string"},
        "backoff_ms": {"type": "integer", "minimum": 0, "maximum": 10000},
        "reason": {"type": "string"},
    },
    "required": ["action"],
    "additionalProperties": False,
}

_SYSTEM = (
    "You correct a web-scraping agent's failed tool call. Pick ONE action: "
    "retry (transient failure; give backoff_ms), switch_route (a CAPTCHA or a "
    "failing egress; give an untried route), other_strategy (no prices found; "
    "give an untried extraction strategy) or abandon. Answer JSON only."
)


def _check(got: Any, routes: list[str]) -> Correction | None:
    if not isinstance(got, dict):
        return None
    action, route, strategy = got.get("action"), got.get("route", ""), got.get("strategy", "")
    backoff = got.get("backoff_ms", 0)
    if isinstance(backoff, bool) or not isinstance(backoff, int) or not 0 <= backoff <= 10_000:
        return None
    reason = str(got.get("reason", ""))[:200]
    if action == "retry":
        return Correction("retry", backoff_ms=backoff, reason=f"advised: {reason}")
    if action == "switch_route" and route in routes:
        return Correction("switch_route", route=route, reason=f"advised: {reason}")
    if action == "other_strategy" and strategy in STRATEGIES:
        return Correction("other_strategy", strategy=strategy, reason=f"advised: {reason}")
    if action == "abandon":
        return Correction("abandon", reason=f"advised: {reason}")
    return None


def llm_advisor(llm: Any, *, timeout_s: float = 10.0) -> Advisor:
    """An :data:`Advisor` backed by ``llm`` (a :class:`hivemesh.llm.LLMProvider`)."""

    async def advise(
        shop: str, error: str, history: History, routes: list[str]
    ) -> Correction | None:
        facts = {
            "shop": shop,
            "error": error,
            "routes": routes,
            "strategies": list(STRATEGIES),
            "history": asdict(history),
        }
        messages = [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": json.dumps(facts, sort_keys=True)},
        ]
        try:
            res = await llm.complete(messages, schema=ADVICE_SCHEMA, timeout_s=timeout_s)
        except HivemeshError:
            return None
        return _check(res.parsed, routes)

    return advise
