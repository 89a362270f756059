"""Control operations of the audit: the operator's inbox and answers.

The node's typed commands (:mod:`hivemesh.commands.audit`; their handlers
in :mod:`hivemesh.runtime.handlers` call the functions here):

* ``audit.inbox {all?}`` -> ``{"questions": [{id, audit, shop, question,
  reason, asked_by, answer?}]}``: open escalations (``all``: answered too);
* ``audit.answer {id, text}`` -> ``{"answered": id, "seq"}``: append the
  operator's answer; an id no audit in this node's journal asked is
  :class:`~hivemesh.errors.UnknownEscalation`, an empty or over-long text
  :class:`~hivemesh.errors.InvalidArgument`;
* ``audit.status {}`` -> the latest audit's progress (shops, batches, done,
  open questions).

The ops read one :class:`~hivemesh.audit.view.AuditView` per daemon, added
(and replayed) on first use, or the one a role registered with :func:`attach`.
"""

from __future__ import annotations

import weakref
from typing import Any

from hivemesh.audit import events as ev
from hivemesh.audit.errors import UnknownEscalation
from hivemesh.audit.view import AuditView, Step
from hivemesh.errors import InvalidArgument

__all__ = ["answer", "attach", "audit_view", "check_answer", "export", "questions", "status"]

MAX_ANSWER_CHARS = 2000
_VIEWS: weakref.WeakKeyDictionary[Any, AuditView] = weakref.WeakKeyDictionary()


def attach(daemon: Any, view: AuditView) -> None:
    """Make ``view`` (already folded over ``daemon``) the one the ops read."""
    _VIEWS[daemon] = view


def audit_view(daemon: Any) -> AuditView:
    """The daemon's audit view (added and replayed on first use)."""
    view = _VIEWS.get(daemon)
    if view is None:
        view = AuditView()
        daemon.add_view(view)
        _VIEWS[daemon] = view
    return view


def _question(view: AuditView, esc: Step) -> dict[str, Any]:
    b = esc.body
    got = view.answers.get(str(b["id"]))
    return {
        "id": b["id"],
        "audit": b.get("audit"),
        "shop": b.get("shop"),
        "question": b.get("question"),
        "reason": b.get("reason", ""),
        "asked_by": esc.author,
        "answer": None if got is None else got.body.get("text"),
    }


def questions(view: AuditView, *, include_answered: bool = False) -> list[dict[str, Any]]:
    """The escalations as plain data, oldest first."""
    if not include_answered:
        return [_question(view, e) for e in view.open_escalations()]
    every = [e for a in view.audits.values() for e in a.escalations.values()]
    return [_question(view, e) for e in sorted(every, key=lambda s: (s.hlc, s.author))]


def check_answer(view: AuditView, qid: Any, text: Any) -> tuple[str, str]:
    """Validate an answer; ``(id, text)``."""
    if not isinstance(qid, str) or not qid:
        raise InvalidArgument("the question id must be a non-empty string")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_ANSWER_CHARS:
        raise InvalidArgument(f"the answer must be 1..{MAX_ANSWER_CHARS} characters of text")
    if not any(qid in a.escalations for a in view.audits.values()):
        raise UnknownEscalation(f"no question {qid!r} in this node's journal")
    return qid, text.strip()


async def answer(daemon: Any, qid: Any, text: Any) -> dict[str, Any]:
    """Append the operator's answer to question ``qid``."""
    qid, text = check_answer(audit_view(daemon), qid, text)
    event = await daemon.append(ev.ANSWER, {"id": qid, "text": text})
    return {"answered": qid, "seq": event.seq}


def status(view: AuditView) -> dict[str, Any]:
    """The latest audit's progress."""
    audit = view.latest()
    if audit is None:
        return {"audit": None}
    return {
        "audit": audit.id,
        "shops": len(audit.shops),
        "batches": {str(n): len(s) for n, s in sorted(audit.batches.items())},
        "done": len(audit.done),
        "finished": audit.finished is not None,
        "open_questions": len(view.open_escalations(audit)),
        "takeovers": len(audit.takeovers),
    }


def export(view: AuditView, audit_id: str | None = None) -> dict[str, Any]:
    """One audit as plain data (what :mod:`hivemesh.audit.report` turns into a report)."""
    audit = view.audits.get(audit_id) if audit_id else view.latest()
    if audit is None:
        raise InvalidArgument("no such audit in this node's journal")
    calls = [c for steps in audit.calls.values() for c in steps]
    results = [r for steps in audit.results.values() for r in steps]
    fixes = [c for steps in audit.corrections.values() for c in steps]
    return {
        "audit": audit.id,
        "supervisor": audit.supervisor,
        "started_hlc": audit.hlc,
        "finished_hlc": audit.finished.hlc if audit.finished is not None else None,
        "shops": [{"id": s, "url": audit.urls[s]} for s in audit.shops],
        "batches": {str(n): s for n, s in sorted(audit.batches.items())},
        "done": {
            shop: {**step.body, "agent": step.author, "hlc": step.hlc}
            for shop, step in sorted(audit.done.items())
        },
        "skipped": sorted(s for s in audit.shops if view.skipped(audit, s)),
        "questions": [q for q in questions(view, include_answered=True) if q["audit"] == audit.id],
        "takeovers": [{**t.body, "by": t.author} for t in audit.takeovers],
        "tool_calls": [
            {k: c.body.get(k) for k in ("shop", "page", "tool", "token", "route", "strategy")}
            | {"author": c.author}
            for c in calls
        ],
        "tool_results": [
            {k: r.body.get(k) for k in ("shop", "page", "tool", "token", "outcome", "error", "ms")}
            | {"author": r.author, "acknowledged": view.acknowledged(r)}
            for r in results
        ],
        "corrections": [
            {k: c.body.get(k) for k in ("shop", "page", "action", "param", "after", "repeat")}
            | {"author": c.author}
            for c in fixes
        ],
    }
