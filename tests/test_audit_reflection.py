"""The audit's reflection rules and its journal view (pure units)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hivemesh.audit import events as ev
from hivemesh.audit.rules import STRATEGIES, History, Limits, decide
from hivemesh.audit.view import AuditView
from hivemesh.audit.worker import correction_events, escalation_id
from hivemesh.core.event import Event
from hivemesh.core.identity import address_of

ROUTES = ["direct", "proxy-1", "proxy-2", "proxy-3"]
SUP, EX1, EX2, OBS = (bytes([i]) * 32 for i in (1, 2, 3, 4))


def test_captcha_switches_to_each_untried_route_then_escalates() -> None:
    h = History(routes=["direct"])
    fix, q = decide("shop-01", "captcha_required", h, ROUTES)
    assert (fix.action, fix.route, q) == ("switch_route", "proxy-1", "")
    h.routes += ["proxy-1", "proxy-2", "proxy-3"]
    fix, q = decide("shop-01", "captcha_required", h, ROUTES)
    assert fix.action == "escalate" and "shop-01" in q


def test_access_code_escalates_and_stale_token_abandons() -> None:
    fix, q = decide("shop-42", "access_code_required", History(), ROUTES)
    assert fix.action == "escalate" and "access code" in q
    fix, q = decide("shop-42", "stale_fencing_token", History(), ROUTES)
    assert (fix.action, q) == ("abandon", "")


def test_transient_errors_retry_with_growing_backoff_then_switch_route() -> None:
    lim = Limits(max_step_attempts=3, backoff_base_ms=100, backoff_max_ms=250)
    waits = []
    for n in (1, 2, 3):
        fix, _ = decide(
            "s", "fetch_timeout", History(routes=["direct"], step_attempts=n), ROUTES, lim
        )
        waits.append((fix.action, fix.backoff_ms))
    assert waits == [("retry", 100), ("retry", 200), ("switch_route", 0)]


def test_extract_failures_walk_the_strategies_then_refetch_then_escalate() -> None:
    h = History()
    seen = []
    for _ in STRATEGIES:
        fix, _q = decide("s", "extract_failed", h, ROUTES)
        seen.append(fix.strategy)
        h.strategies.append(fix.strategy)
    assert seen == list(STRATEGIES)
    fix, _q = decide("s", "extract_failed", h, ROUTES)
    assert fix.action == "retry"
    h.refetches = 1
    fix, _q = decide("s", "extract_failed", h, ROUTES)
    assert fix.action == "escalate"


def test_loop_guards_turn_repeats_and_attempt_floods_into_escalations() -> None:
    h = History(routes=["direct"], corrections=[("switch_route", "proxy-1")] * 3)
    fix, q = decide("s", "captcha_required", h, ROUTES)
    assert fix.action == "escalate" and fix.repeat and q
    fix, q = decide("s", "fetch_failed", History(shop_attempts=40), ROUTES)
    assert fix.action == "escalate" and not fix.repeat


# -- the view ------------------------------------------------------------------------


class Feeds:
    def __init__(self) -> None:
        self.seq: dict[bytes, int] = {}
        self.hlc = 1 << 16

    def ev(self, author: bytes, kind: str, body: Any) -> Event:
        self.seq[author] = self.seq.get(author, 0) + 1
        self.hlc += 1 << 16
        return Event(author, self.seq[author], b"", self.hlc, kind, body, b"", b"")


def _start(f: Feeds) -> list[Event]:
    shops = [{"id": f"shop-{i:02d}", "url": f"http://x/shop-{i:02d}/"} for i in range(1, 4)]
    return [
        f.ev(
            SUP,
            ev.START,
            {
                "audit": "a1",
                "shops": shops,
                "routes": ROUTES,
                "market": "http://x/m",
                "batch_size": 2,
            },
        ),
        f.ev(SUP, ev.BATCH, {"audit": "a1", "n": 0, "shops": ["shop-01", "shop-02"]}),
    ]


def _page(f: Feeds, who: bytes, shop: str, page: int, token: int, ok: bool = True) -> list[Event]:
    base = {"audit": "a1", "shop": shop, "token": token, "page": page, "args": "d"}
    out = []
    for tool in ("web.fetch_page", "web.extract_prices"):
        out.append(
            f.ev(who, ev.CALL, {**base, "tool": tool, "route": "proxy-2", "strategy": "auto"})
        )
        res = {
            **base,
            "tool": tool,
            "outcome": "ok" if ok else "error",
            "error": "" if ok else "fetch_failed",
            "route": "proxy-2",
            "strategy": "auto",
            "blob": "b",
        }
        if tool.endswith("extract_prices") and ok:
            res |= {"products": [{"sku": f"{shop}-{page}", "price": "1.00"}], "next": None}
        out.append(f.ev(who, ev.RESULT, res))
        if not ok:
            break
    return out


def test_the_view_is_the_same_in_any_order_and_ignores_garbage() -> None:
    f = Feeds()
    events = _start(f) + _page(f, EX1, "shop-01", 1, 5) + _page(f, EX1, "shop-01", 2, 5, ok=False)
    events.append(f.ev(OBS, "witness", {"c": [[EX1, 2]]}))
    events.append(
        f.ev(EX2, ev.BATCH, {"audit": "a1", "n": 1, "shops": ["shop-03"]})
    )  # not the supervisor
    events.append(f.ev(EX2, ev.RESULT, {"audit": "a1", "shop": 7}))  # garbage
    events.append(f.ev(EX2, ev.ANSWER, "nope"))
    digests = set()
    for seed in range(20):
        random.Random(seed).shuffle(events)
        events.sort(key=lambda e: (e.author, e.seq))  # per-author order, authors interleaved
        rng = random.Random(seed)
        by_author: dict[bytes, list[Event]] = {}
        for e in events:
            by_author.setdefault(e.author, []).append(e)
        view = AuditView()
        while by_author:
            a = rng.choice(sorted(by_author))
            view.apply(by_author[a].pop(0))
            if not by_author[a]:
                del by_author[a]
        audit = view.audits["a1"]
        digests.add(
            (
                tuple(audit.published()),
                len(audit.calls["shop-01"]),
                tuple(sorted(view.acked.items())),
            )
        )
        assert view.counters["bad.tool.result"] == 1 and view.counters["bad.audit.batch"] == 1
    assert len(digests) == 1


def test_replay_reuses_only_acknowledged_pages() -> None:
    f = Feeds()
    view = AuditView()
    for e in _start(f) + _page(f, EX1, "shop-01", 1, 5) + _page(f, EX1, "shop-01", 2, 5):
        view.apply(e)
    audit = view.audits["a1"]
    rp = view.replay(audit, "shop-01", address_of(EX2))
    assert rp.pages == {} and rp.redo == [1, 2] and rp.holders == [address_of(EX1)]
    view.apply(f.ev(EX1, "witness", {"c": [[EX1, 8]]}))  # its own witness does not count
    assert view.replay(audit, "shop-01", address_of(EX2)).pages == {}
    view.apply(f.ev(OBS, "witness", {"c": [[EX1, 4]]}))  # page 1's extract result is seq 4
    rp = view.replay(audit, "shop-01", address_of(EX2))
    assert sorted(rp.pages) == [1] and rp.redo == [2] and rp.route == "proxy-2"


def test_a_later_token_is_a_takeover_unless_only_our_own_steps_are_here() -> None:
    f = Feeds()
    view = AuditView()
    for e in _start(f) + _page(f, EX1, "shop-01", 1, 5):
        view.apply(e)
    audit = view.audits["a1"]
    # another node's steps: a takeover whatever the token
    assert view.replay(audit, "shop-01", address_of(EX2)).takeover(1)
    # only our own earlier steps: we hold it again, not a takeover
    assert not view.replay(audit, "shop-01", address_of(EX1)).takeover(2)
    # nothing seen on a shop, first token: a fresh start
    assert not view.replay(audit, "shop-02", address_of(EX2)).takeover(1)
    # nothing seen, a later token: the earlier holder's steps never reached us
    assert view.replay(audit, "shop-02", address_of(EX2)).takeover(2)


def test_escalations_park_a_shop_until_answered_and_the_earliest_answer_wins() -> None:
    f = Feeds()
    view = AuditView()
    for e in _start(f) + _page(f, EX1, "shop-02", 1, 3, ok=False):
        view.apply(e)
    audit = view.audits["a1"]
    failed = audit.results["shop-02"][-1]
    fix, q = decide("shop-02", "access_code_required", view.history(audit, "shop-02", 1), ROUTES)
    for kind, body in correction_events(
        "a1", "shop-02", 1, failed.ref, "access_code_required", fix, q
    ):
        view.apply(f.ev(OBS, kind, body))
    qid = escalation_id(failed.ref)
    assert view.parked(audit, "shop-02") and view.workable(audit) == ["shop-01"]
    assert [e.body["id"] for e in view.open_escalations()] == [qid]
    view.apply(f.ev(EX2, ev.ANSWER, {"id": qid, "text": "1234-5678"}))
    view.apply(f.ev(EX1, ev.ANSWER, {"id": qid, "text": "later"}))
    assert view.answers[qid].body["text"] == "1234-5678"
    assert not view.parked(audit, "shop-02") and view.open_escalations() == []
    assert view.history(audit, "shop-02", 1).shop_attempts == 0  # the count starts afresh


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@example(kind=ev.START, body={"audit": "a2", "shops": ["not-a-dict"]})
@example(kind="witness", body={"c": ["ab", 3]})
@given(
    kind=st.sampled_from(sorted(AuditView.kinds)),
    body=_JSONISH
    | st.fixed_dictionaries(
        {"audit": st.just("a1")},
        optional={
            "shop": _JSONISH,
            "page": _JSONISH,
            "token": _JSONISH,
            "tool": _JSONISH,
            "shops": _JSONISH,
            "n": _JSONISH,
            "id": _JSONISH,
            "text": _JSONISH,
            "c": _JSONISH,
            "outcome": _JSONISH,
            "products": _JSONISH,
            "market": _JSONISH,
        },
    ),
)
def test_garbage_bodies_never_raise(kind: str, body: Any) -> None:
    f = Feeds()
    view = AuditView()
    for e in _start(f):
        view.apply(e)
    view.apply(f.ev(EX2, kind, body))  # counted or folded, never raised
    audit = view.latest()
    assert audit is not None
    view.workable(audit), view.open_escalations(), view.replay(audit, "shop-01", "x")
