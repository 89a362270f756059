"""The audit as a view over the journal (pure, deterministic).

Theory of operation
-------------------
:class:`AuditView` folds the audit's events (:mod:`hivemesh.audit.events`)
and the journal's ``witness`` events into per-audit state: the shops and
batches the supervisor published, every tool call and result per shop,
corrections, escalations and their answers, takeovers and finished shops.
Same events in, same state out, in any order of arrival across authors.

**Acknowledged steps.** The view declares ``tool.result`` as a witnessed
kind, so every other node that receives one appends a ``witness`` event
covering its author's feed (:mod:`hivemesh.core.witness`). A result is
*acknowledged* once a witness by another author covers it: it then survives
the death of its author, and a standby may build on it instead of redoing
the step (:meth:`AuditView.replay`).

Events of an audit whose ``audit.start`` has not arrived yet (it comes from
another author) are held, at most :data:`MAX_HELD`, and folded when it does.
Malformed bodies (a buggy or hostile peer) are ignored and counted in
:attr:`AuditView.counters`; they never raise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hivemesh.audit import events as ev
from hivemesh.audit.rules import History
from hivemesh.core.event import Event
from hivemesh.core.identity import address_of

__all__ = ["MAX_HELD", "Audit", "AuditView", "Replay", "Step"]

#: Events of audits whose start has not arrived yet, held at most.
MAX_HELD = 100_000


@dataclass(frozen=True, slots=True)
class Step:
    """One ``tool.call`` or ``tool.result`` as the view keeps it."""

    author: str
    seq: int
    hlc: int
    kind: str
    body: dict[str, Any]

    @property
    def ref(self) -> str:
        """``"<author>:<seq>"``."""
        return ev.ref_of(self.author, self.seq)

    def get(self, key: str, default: Any = None) -> Any:
        """A body field."""
        return self.body.get(key, default)


@dataclass(slots=True)
class Audit:
    """One audit's state (see the module docs)."""

    id: str
    supervisor: str
    hlc: int
    shops: list[str]
    urls: dict[str, str]
    routes: list[str]
    batch_size: int
    market: str
    batches: dict[int, list[str]] = field(default_factory=dict)
    calls: dict[str, list[Step]] = field(default_factory=dict)
    results: dict[str, list[Step]] = field(default_factory=dict)
    corrections: dict[str, list[Step]] = field(default_factory=dict)
    by_ref: dict[str, Step] = field(default_factory=dict)
    escalations: dict[str, Step] = field(default_factory=dict)
    takeovers: list[Step] = field(default_factory=list)
    done: dict[str, Step] = field(default_factory=dict)
    finished: Step | None = None
    #: Failed ``tool.result`` events, in arrival order (what the reflector reads).
    failures: list[Step] = field(default_factory=list)

    def published(self) -> list[str]:
        """Shops of the published batches, in batch order."""
        return [s for n in sorted(self.batches) for s in self.batches[n]]


@dataclass(slots=True)
class Replay:
    """A shop's progress rebuilt from the journal (what a standby continues from)."""

    #: Acknowledged, successful pages: page -> the extract result's body.
    pages: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The route of the last successful fetch (the one that works).
    route: str = ""
    strategy: str = ""
    #: Earlier holders (addresses) with tool calls on the shop.
    holders: list[str] = field(default_factory=list)
    #: Pages fetched before but not acknowledged: they are fetched again.
    redo: list[int] = field(default_factory=list)
    attempts: int = 0

    def takeover(self, token: int) -> bool:
        """Whether working the shop under fencing ``token`` takes it over:
        another node has steps on it, or the token is not the first while no
        step at all is here (the earlier holder's steps never reached us)."""
        return bool(self.holders) or (token > 1 and self.attempts == 0)


def _str(body: dict[str, Any], key: str, limit: int = 400) -> str:
    v = body.get(key)
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError(key)
    return v


def _int(body: dict[str, Any], key: str) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(key)
    return v


class AuditView:
    """Every audit in the journal (see the module docs)."""

    kinds = ev.KINDS | {"witness"}
    witnessed_kinds = frozenset({ev.RESULT})

    def __init__(self) -> None:
        self.audits: dict[str, Audit] = {}
        self.answers: dict[str, Step] = {}
        #: author address -> highest seq a witness by another author covers.
        self.acked: dict[str, int] = {}
        self.counters: Counter[str] = Counter()
        self.version = 0
        self._held: dict[str, list[Step]] = {}
        self._held_count = 0

    # -- folding ---------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one event (malformed ones are counted and ignored)."""
        self.version += 1
        author = address_of(event.author)
        body = event.body
        try:
            if event.kind == "witness":
                self._witness(author, body)
                return
            if not isinstance(body, dict):
                raise ValueError("body")
            step = Step(author, event.seq, event.hlc, event.kind, body)
            if event.kind == ev.ANSWER:
                eid = _str(body, "id", 100)
                _str(body, "text", 4000)
                old = self.answers.get(eid)
                if old is None or (step.hlc, step.author) < (old.hlc, old.author):
                    self.answers[eid] = step  # the earliest answer wins, everywhere
                return
            if event.kind == ev.START:
                self._start(step)
                return
            aid = _str(body, "audit", 100)
            audit = self.audits.get(aid)
            if audit is None:  # before its start (another author): held until it comes
                if self._held_count >= MAX_HELD:
                    self.counters["held_dropped"] += 1
                    return
                self._held.setdefault(aid, []).append(step)
                self._held_count += 1
                return
            self._fold(audit, step)
        except (ValueError, TypeError, KeyError, AttributeError):
            self.counters[f"bad.{event.kind}"] += 1

    def _witness(self, author: str, body: Any) -> None:
        pairs = body.get("c") if isinstance(body, dict) else None
        if not isinstance(pairs, list):
            raise ValueError("witness")
        for pair in pairs:
            a, seq = pair
            if not isinstance(a, bytes) or isinstance(seq, bool) or not isinstance(seq, int):
                continue
            who = address_of(a)
            if who != author and seq > self.acked.get(who, 0):
                self.acked[who] = seq

    def _start(self, step: Step) -> None:
        b = step.body
        aid = _str(b, "audit", 100)
        shops, urls = [], {}
        for item in b["shops"]:
            sid, url = _str(item, "id", 64), _str(item, "url", 2000)
            shops.append(sid)
            urls[sid] = url
        routes = [r for r in b["routes"] if isinstance(r, str)]
        old = self.audits.get(aid)
        if old is not None and (old.hlc, old.supervisor) <= (step.hlc, step.author):
            return
        held = self._held.pop(aid, [])
        self._held_count -= len(held)
        self.audits[aid] = Audit(
            aid,
            step.author,
            step.hlc,
            shops,
            urls,
            routes or ["direct"],
            _int(b, "batch_size"),
            _str(b, "market", 2000),
        )
        for h in held:
            try:
                self._fold(self.audits[aid], h)
            except (ValueError, TypeError, KeyError, AttributeError):
                self.counters[f"bad.{h.kind}"] += 1

    def _fold(self, audit: Audit, step: Step) -> None:
        b, kind = step.body, step.kind
        if kind == ev.BATCH:
            if step.author != audit.supervisor:
                raise ValueError("batch from another node")
            audit.batches[_int(b, "n")] = [s for s in b["shops"] if s in audit.urls]
        elif kind in (ev.CALL, ev.RESULT):
            shop = _str(b, "shop", 64)
            _int(b, "page"), _int(b, "token"), _str(b, "tool", 200)
            target = audit.calls if kind == ev.CALL else audit.results
            target.setdefault(shop, []).append(step)
            audit.by_ref[step.ref] = step
            if kind == ev.RESULT and b.get("outcome") == "error":
                audit.failures.append(step)
        elif kind == ev.CORRECTION:
            _str(b, "ref", 200), _str(b, "action", 40)
            audit.corrections.setdefault(_str(b, "shop", 64), []).append(step)
            audit.by_ref[f"fix:{b['ref']}"] = step
        elif kind == ev.ESCALATION:
            eid = _str(b, "id", 100)
            _str(b, "shop", 64), _str(b, "question", 2000)
            audit.escalations.setdefault(eid, step)
            if isinstance(b.get("ref"), str):
                audit.by_ref[f"fix:{b['ref']}"] = step
        elif kind == ev.TAKEOVER:
            _str(b, "shop", 64)
            audit.takeovers.append(step)
        elif kind == ev.SHOP:
            shop = _str(b, "shop", 64)
            if b.get("market") != "accepted":
                return
            old = audit.done.get(shop)
            if old is None or _int(b, "token") > _int(old.body, "token"):
                audit.done[shop] = step
        elif kind == ev.DONE and step.author == audit.supervisor:
            audit.finished = step

    # -- queries -----------------------------------------------------------------

    def latest(self) -> Audit | None:
        """The most recently started audit."""
        if not self.audits:
            return None
        return max(self.audits.values(), key=lambda a: (a.hlc, a.supervisor))

    def acknowledged(self, step: Step) -> bool:
        """True once a node other than its author witnessed ``step``."""
        return self.acked.get(step.author, 0) >= step.seq

    def correction(self, audit: Audit, ref: str) -> Step | None:
        """The correction (or escalation) issued for the failed result ``ref``."""
        return audit.by_ref.get(f"fix:{ref}")

    def answer(self, audit: Audit, shop: str) -> tuple[Step, Step] | None:
        """The shop's latest escalation and its answer, if answered."""
        for eid, esc in sorted(audit.escalations.items(), key=lambda kv: -kv[1].hlc):
            if esc.body.get("shop") == shop:
                a = self.answers.get(eid)
                return (esc, a) if a is not None else None
        return None

    def open_escalations(self, audit: Audit | None = None) -> list[Step]:
        """Escalations without an answer (of one audit, or of all)."""
        audits = [audit] if audit is not None else list(self.audits.values())
        out = [esc for a in audits for eid, esc in a.escalations.items() if eid not in self.answers]
        return sorted(out, key=lambda s: (s.hlc, s.author))

    def parked(self, audit: Audit, shop: str) -> bool:
        """True while the shop waits for the operator's answer."""
        return any(
            esc.body.get("shop") == shop and eid not in self.answers
            for eid, esc in audit.escalations.items()
        )

    def skipped(self, audit: Audit, shop: str) -> bool:
        """True if the operator answered the shop's escalation with 'skip'."""
        got = self.answer(audit, shop)
        return got is not None and got[1].body.get("text", "").strip().lower() == "skip"

    def history(self, audit: Audit, shop: str, page: int) -> History:
        """The shop's :class:`~hivemesh.audit.rules.History` for a failure on ``page``."""
        h = History()
        got = self.answer(audit, shop)
        since = got[1].hlc if got is not None else -1  # an answer starts the count afresh
        calls = [c for c in audit.calls.get(shop, []) if c.hlc > since]
        token = max((int(c.body.get("token", 0)) for c in calls), default=0)
        for call in calls:
            b = call.body
            route, strategy = b.get("route"), b.get("strategy")
            if isinstance(route, str) and route and route not in h.routes:
                h.routes.append(route)
            if b.get("page") == page and isinstance(strategy, str) and strategy:
                h.strategies += [strategy] if strategy not in h.strategies else []
            h.shop_attempts += 1
            if b.get("page") == page and b.get("token") == token:
                h.step_attempts += int(b.get("tool", "").endswith("fetch_page"))
        fixes = [c for c in audit.corrections.get(shop, []) if c.hlc > since]
        h.corrections = [(str(c.body.get("action")), str(c.body.get("param", ""))) for c in fixes]
        h.refetches = sum(
            1
            for c in fixes
            if c.body.get("action") == "retry"
            and c.body.get("page") == page
            and c.body.get("after") == "extract_failed"
        )
        return h

    def replay(self, audit: Audit, shop: str, me: str) -> Replay:
        """The shop's progress by earlier holders (see the module docs)."""
        rp = Replay()
        fetched: set[int] = set()
        for call in audit.calls.get(shop, []):
            rp.attempts += 1
            if call.author != me and call.author not in rp.holders:
                rp.holders.append(call.author)
            if call.body.get("tool", "").endswith("fetch_page"):
                fetched.add(int(call.body["page"]))
        for res in audit.results.get(shop, []):
            b = res.body
            if b.get("outcome") != "ok":
                continue
            if b.get("tool", "").endswith("fetch_page") and isinstance(b.get("route"), str):
                rp.route = b["route"]
            if self.acknowledged(res) and isinstance(b.get("products"), list):
                rp.pages[int(b["page"])] = b
                rp.strategy = str(b.get("strategy", ""))
        rp.redo = sorted(fetched - set(rp.pages))
        return rp

    def workable(self, audit: Audit) -> list[str]:
        """Published shops not done, not waiting for the operator, not skipped."""
        return [
            s
            for s in audit.published()
            if s not in audit.done and not self.parked(audit, s) and not self.skipped(audit, s)
        ]

    def settled(self, audit: Audit) -> bool:
        """True when every shop is done or skipped by the operator."""
        return all(s in audit.done or self.skipped(audit, s) for s in audit.shops)
