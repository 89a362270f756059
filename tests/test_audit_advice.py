"""An LLM (a scripted OpenAI-compatible server, real HTTP) advising the
reflector: usable proposals are taken under the loop guards; unusable ones,
and a failing LLM, leave the decision to the rules."""

from __future__ import annotations

import asyncio
from typing import Any

from hivemesh.audit import events as ev
from hivemesh.audit.advice import llm_advisor
from hivemesh.audit.live import LiveView
from hivemesh.audit.rules import History, Limits
from hivemesh.core.event import Event
from hivemesh.llm import LLMConfig, provider_from_config
from hivemesh.roles.reflector import Reflector
from llm_server import ScriptedServer, Step

ROUTES = ["direct", "proxy-1", "proxy-2", "proxy-3"]
SUP, EX = bytes([1]) * 32, bytes([2]) * 32


class JournalStub:
    """Test-only: a node that folds what the reflector appends into its view."""

    def __init__(self, live: LiveView) -> None:
        self.live = live
        self.seq: dict[bytes, int] = {}
        self.appended: list[tuple[str, Any]] = []

    def add(self, author: bytes, kind: str, body: Any) -> Event:
        self.seq[author] = self.seq.get(author, 0) + 1
        e = Event(
            author, self.seq[author], b"", (len(self.appended) + 10) << 16, kind, body, b"", b""
        )
        self.live.apply(e)
        return e

    async def append(self, kind: str, body: Any) -> Event:
        self.appended.append((kind, body))
        return self.add(bytes([9]) * 32, kind, body)


def _failures(node: JournalStub, errors: list[str]) -> None:
    shops = [{"id": f"s{i}", "url": f"http://x/s{i}/"} for i in range(len(errors))]
    node.add(
        SUP,
        ev.START,
        {"audit": "a", "shops": shops, "routes": ROUTES, "market": "m", "batch_size": 9},
    )
    for i, error in enumerate(errors):
        base = {
            "audit": "a",
            "shop": f"s{i}",
            "token": 1,
            "page": 1,
            "tool": "web.fetch_page",
            "args": "d",
        }
        node.add(EX, ev.CALL, {**base, "route": "direct", "strategy": "auto"})
        node.add(EX, ev.RESULT, {**base, "outcome": "error", "error": error, "route": "direct"})


def test_advice_is_taken_when_usable_and_the_rules_decide_otherwise() -> None:
    script = [
        {"action": "switch_route", "route": "proxy-3", "reason": "proxy-3 is cleanest"},
        {"action": "switch_route", "route": "evil-proxy"},  # not a configured route
        {"action": "other_strategy", "strategy": "table"},
        Step(status=500),  # the LLM fails: the rules decide
    ]

    async def main() -> tuple[list[tuple[str, Any]], Any]:
        async with ScriptedServer(script) as srv:
            cfg = LLMConfig(base_url=srv.base_url, model="m", timeout_s=5)
            llm = provider_from_config(cfg)
            live = LiveView()
            node = JournalStub(live)
            _failures(
                node, ["captcha_required", "captcha_required", "extract_failed", "fetch_failed"]
            )
            refl = Reflector(node, live, advisor=llm_advisor(llm, timeout_s=5))
            await refl.step()
            close = getattr(llm, "aclose", None)
            if close is not None:
                await close()
            return node.appended, refl.counters

    appended, counters = asyncio.run(main())
    fixes = {b["shop"]: (b["action"], b["param"]) for k, b in appended if k == ev.CORRECTION}
    assert fixes["s0"] == ("switch_route", "proxy-3")  # advised
    assert fixes["s1"] == ("switch_route", "proxy-1")  # bad advice: the rule
    assert fixes["s2"] == ("other_strategy", "table")  # advised
    assert fixes["s3"][0] == "retry"  # LLM down: the rule
    assert counters["advised"] == 2


def test_the_loop_guard_holds_an_advisor_too() -> None:
    async def stubborn(shop: str, error: str, h: History, routes: list[str]) -> Any:
        from hivemesh.audit.rules import Correction

        return Correction("switch_route", route="proxy-2")

    async def main() -> list[tuple[str, Any]]:
        live = LiveView()
        node = JournalStub(live)
        _failures(node, ["captcha_required"])
        for _ in range(3):
            node.add(
                bytes([9]) * 32,
                ev.CORRECTION,
                {
                    "audit": "a",
                    "shop": "s0",
                    "ref": "x",
                    "action": "switch_route",
                    "param": "proxy-2",
                },
            )
        await Reflector(node, live, advisor=stubborn, limits=Limits(max_repeats=3)).step()
        return node.appended

    appended = asyncio.run(main())
    kinds = [k for k, _ in appended]
    assert kinds == [ev.CORRECTION, ev.ESCALATION]
    assert appended[0][1]["action"] == "escalate" and appended[0][1]["repeat"]
