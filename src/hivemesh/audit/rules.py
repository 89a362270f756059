"""The reflector's deterministic rules: from a failed tool call to a correction.

Theory of operation
-------------------
:func:`decide` is a pure function of the failure's error code and the
shop's history as the journal tells it (:class:`History`: the routes and
strategies tried so far, the attempts on the failing step and on the whole
shop, and the corrections already issued). Same journal, same decision, on
any node: that is what lets a standby executor apply the rule itself when
no reflector answers in time, and still agree with the reflector.

=========================== ===============================================
error                       correction
=========================== ===============================================
``captcha_required``        ``switch_route`` to the next untried route;
                            every route tried: ``escalate``
``access_code_required``    ``escalate`` (only the operator has the code)
``extract_failed``          ``other_strategy`` (the next untried one), then
                            ``retry`` (a fresh fetch), then ``escalate``
``stale_fencing_token``,    ``abandon`` (another executor holds the shop)
``lease_lost``
anything else (timeouts,    ``retry`` with exponential backoff; after
HTTP errors, a crashed      ``max_step_attempts`` on the step, ``switch_route``;
MCP server, bad input)      every route tried: ``escalate``
=========================== ===============================================

Loop guards: more than ``max_shop_attempts`` tool calls on one shop, or the
same correction (action and parameters) issued ``max_repeats`` times for the
shop, escalate instead of correcting again ("repeated correction").
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["STRATEGIES", "Correction", "History", "Limits", "decide"]

#: Extraction strategies, in the order they are tried.
STRATEGIES = ("auto", "jsonld", "microdata", "table", "blocks")


@dataclass(frozen=True, slots=True)
class Limits:
    """Attempt limits of the reflection loop."""

    max_step_attempts: int = 4
    max_shop_attempts: int = 40
    max_repeats: int = 3
    backoff_base_ms: int = 150
    backoff_max_ms: int = 3000


@dataclass(slots=True)
class History:
    """What the journal says about one shop so far."""

    #: Routes the shop was fetched through, in order of first use.
    routes: list[str] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    #: Tool calls on the failing step (this page).
    step_attempts: int = 0
    #: Tool calls on the shop.
    shop_attempts: int = 0
    #: ``(action, parameter)`` of every correction issued for the shop.
    corrections: list[tuple[str, str]] = field(default_factory=list)
    #: Retries already made after an extract failure on this step.
    refetches: int = 0


@dataclass(frozen=True, slots=True)
class Correction:
    """One corrective action (see the module docs)."""

    action: str
    route: str = ""
    strategy: str = ""
    backoff_ms: int = 0
    reason: str = ""
    #: True when the loop guard turned the correction into an escalation.
    repeat: bool = False

    @property
    def key(self) -> tuple[str, str]:
        """``(action, parameter)``: what the repeat detector compares."""
        return (self.action, self.route or self.strategy or str(self.backoff_ms))


def _question(shop: str, error: str, why: str) -> str:
    if error == "access_code_required":
        return f"{shop} only opens with the operator's access code: what is it?"
    return f"{shop} keeps failing ({error}; {why}): answer 'retry' or 'skip'"


def decide(
    shop: str, error: str, history: History, routes: list[str], limits: Limits | None = None
) -> tuple[Correction, str]:
    """The correction for a failed call on ``shop`` and, for an escalation,
    the question to put to the operator (else ``""``)."""
    lim = limits or Limits()
    c = _rule(error, history, routes, lim)
    if c.action in ("escalate", "abandon"):
        return c, (_question(shop, error, c.reason) if c.action == "escalate" else "")
    if history.shop_attempts >= lim.max_shop_attempts:
        why = f"{history.shop_attempts} attempts on the shop"
        return Correction("escalate", reason=why), _question(shop, error, why)
    if history.corrections.count(c.key) >= lim.max_repeats:
        why = f"the same correction ({c.action}) issued {lim.max_repeats} times"
        return Correction("escalate", reason=why, repeat=True), _question(shop, error, why)
    return c, ""


def _next_route(history: History, routes: list[str]) -> str | None:
    for r in routes:
        if r not in history.routes:
            return r
    return None


def _rule(error: str, h: History, routes: list[str], lim: Limits) -> Correction:
    if error in ("stale_fencing_token", "lease_lost"):
        return Correction("abandon", reason="another executor holds the shop")
    if error == "access_code_required":
        return Correction("escalate", reason="the page needs an access code")
    if error == "captcha_required":
        nxt = _next_route(h, routes)
        if nxt is None:
            return Correction("escalate", reason="a CAPTCHA on every route")
        return Correction("switch_route", route=nxt, reason="CAPTCHA on this route")
    if error == "extract_failed":
        for s in STRATEGIES:
            if s not in h.strategies:
                return Correction("other_strategy", strategy=s, reason="no prices found")
        if h.refetches < 1:
            return Correction("retry", backoff_ms=lim.backoff_base_ms, reason="refetch the page")
        return Correction("escalate", reason="no strategy reads this page")
    if h.step_attempts < lim.max_step_attempts:
        backoff = min(lim.backoff_max_ms, lim.backoff_base_ms * 2 ** max(0, h.step_attempts - 1))
        return Correction("retry", backoff_ms=backoff, reason=f"{error}: transient")
    nxt = _next_route(h, routes)
    if nxt is not None:
        return Correction("switch_route", route=nxt, reason=f"{error} persists on this route")
    return Correction("escalate", reason=f"{error} on every route")
