"""The audit's journal events: kinds, bodies and the argument digest (pure).

Every step of the audit is an event in its author's feed, so any node can
rebuild the whole audit from the journal (:class:`~hivemesh.audit.view.AuditView`):

==================== ============ =============================================
kind                 author       body
==================== ============ =============================================
``audit.start``      supervisor   ``{audit, shops: [{id, url}], routes, batch_size}``
``audit.batch``      supervisor   ``{audit, n, shops}``
``tool.call``        executor     ``{audit, shop, token, page, tool, args, route,
                                  strategy, attempt}``
``tool.result``      executor     ``{audit, shop, token, page, tool, args, ms,
                                  outcome, error, blob, products?, next?, url?}``
``audit.correction`` reflector    ``{audit, shop, ref, action, route, strategy,
                                  backoff_ms, reason, repeat}``
``audit.escalation`` reflector    ``{audit, id, shop, ref, question, reason}``
``audit.answer``     anyone       ``{id, text}``
``audit.takeover``   executor     ``{audit, shop, token, from, reused, redo}``
``audit.shop``       executor     ``{audit, shop, token, products, blobs, attempts,
                                  route, market}``
``audit.done``       supervisor   ``{audit, shops}``
==================== ============ =============================================

``ref`` names a failed ``tool.result`` as ``"<author address>:<seq>"``.
``outcome`` is ``"ok"`` or ``"error"``; ``error`` is the stable code of the
:mod:`hivemesh.errors` class (``captcha_required``, ``fetch_failed``, ...).
``args`` is :func:`args_digest` of the call's arguments (the HTML itself never
goes into the journal; DOM snapshots are content-addressed blobs, ``blob``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = [
    "ACTIONS",
    "ANSWER",
    "BATCH",
    "CALL",
    "CORRECTION",
    "DONE",
    "ESCALATION",
    "KINDS",
    "RESULT",
    "SHOP",
    "START",
    "TAKEOVER",
    "args_digest",
    "ref_of",
]

START = "audit.start"
BATCH = "audit.batch"
CALL = "tool.call"
RESULT = "tool.result"
CORRECTION = "audit.correction"
ESCALATION = "audit.escalation"
ANSWER = "audit.answer"
TAKEOVER = "audit.takeover"
SHOP = "audit.shop"
DONE = "audit.done"
KINDS = frozenset(
    {START, BATCH, CALL, RESULT, CORRECTION, ESCALATION, ANSWER, TAKEOVER, SHOP, DONE}
)

#: Corrective actions of the reflector (:mod:`hivemesh.audit.rules`).
ACTIONS = ("retry", "switch_route", "other_strategy", "escalate", "abandon")


def args_digest(arguments: dict[str, Any]) -> str:
    """BLAKE2b-128 (hex) of a call's arguments as canonical JSON."""
    raw = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def ref_of(address: str, seq: int) -> str:
    """The reference of an event: ``"<author address>:<seq>"``."""
    return f"{address}:{seq}"
