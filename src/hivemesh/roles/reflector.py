"""The reflector: reads failed tool results, writes corrective events.

Theory of operation
-------------------
A :class:`Reflector` runs on its own node and follows every audit in its
:class:`~hivemesh.audit.view.AuditView`. For each failed ``tool.result``
(except the market's own refusals, which end the shop for that holder) that
has no correction yet, it applies the deterministic rules of
:mod:`hivemesh.audit.rules` to the shop's history as the journal tells it
and appends an ``audit.correction`` event (retry with backoff, switch route,
other extraction strategy, abandon) or, when a human is needed or the loop
guard trips, an ``audit.correction`` with ``escalate`` plus an
``audit.escalation`` event carrying the question. The question shows in
``hivemesh inbox``; ``hivemesh answer ID TEXT`` resolves it.

The executor waiting on the failure applies the correction; if no reflector
answers in time it applies the same rules itself, so a dead reflector slows
the audit down and never stops it. ``advisor`` (optional) may propose a
correction first (an LLM, when one is configured); whatever it proposes must
be one of the known actions, else the rules decide.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from hivemesh.audit import events as ev
from hivemesh.audit.live import LiveView
from hivemesh.audit.rules import Correction, Limits, decide
from hivemesh.audit.worker import correction_events
from hivemesh.errors import HivemeshError

__all__ = ["Advisor", "Reflector"]

log = logging.getLogger("hivemesh.roles.reflector")

#: An optional proposer: ``(shop, error, history) -> Correction | None``.
Advisor = Callable[[str, str, Any], Correction | None]


class Reflector:
    """Corrects failed tool calls (see the module docs)."""

    name = "reflector"

    def __init__(
        self,
        node: Any,
        live: LiveView,
        *,
        limits: Limits | None = None,
        advisor: Advisor | None = None,
    ) -> None:
        self.node = node
        self.live = live
        self.limits = limits or Limits()
        self.advisor = advisor
        self.counters: Counter[str] = Counter()
        self._handled: set[str] = set()

    def pending(self) -> list[tuple[Any, Any]]:
        """``(audit, failed result)`` pairs without a correction, oldest first."""
        view = self.live.view
        out = []
        for audit in view.audits.values():
            if audit.finished is not None:
                continue
            for results in audit.results.values():
                for res in results:
                    if res.body.get("outcome") != "error" or res.ref in self._handled:
                        continue
                    if res.body.get("tool") == "market.submit":
                        continue
                    if view.correction(audit, res.ref) is None:
                        out.append((audit, res))
        return sorted(out, key=lambda p: (p[1].hlc, p[1].author))

    def _decide(self, audit: Any, res: Any) -> tuple[Correction, str]:
        shop, error, page = str(res.body["shop"]), str(res.body["error"]), int(res.body["page"])
        history = self.live.view.history(audit, shop, page)
        if self.advisor is not None:
            try:
                proposed = self.advisor(shop, error, history)
            except Exception:  # an advisor failure falls back to the rules
                self.counters["advisor_errors"] += 1
                proposed = None
            if proposed is not None and proposed.action in ev.ACTIONS:
                self.counters["advised"] += 1
                if proposed.action != "escalate":
                    return proposed, ""
        return decide(shop, error, history, audit.routes, self.limits)

    async def step(self) -> int:
        """Correct every pending failure once; the number corrected."""
        n = 0
        for audit, res in self.pending():
            self._handled.add(res.ref)
            fix, question = self._decide(audit, res)
            body = res.body
            events = correction_events(
                audit.id, str(body["shop"]), int(body["page"]), res.ref, str(body["error"]),
                fix, question,
            )  # fmt: skip
            try:
                for kind, b in events:
                    await self.node.append(kind, b)
            except HivemeshError as exc:
                self.counters[f"append_errors.{exc.code}"] += 1
                self._handled.discard(res.ref)
                continue
            self.counters[f"fix.{fix.action}"] += 1
            if fix.repeat:
                self.counters["repeated_corrections"] += 1
            n += 1
        return n

    async def run(self, stop: asyncio.Event) -> None:
        """Correct failures until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # a bug on one event must not end the reflector
                self.counters["step_errors"] += 1
                log.exception("reflector step failed")
            await self.live.wait(0.5)
