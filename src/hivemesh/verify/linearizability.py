"""Safety (linearizability) checker for recorded lease histories (the
simulator's leases workload, the quorum lease tests, the real-process lease
tests and the chaos runner all use it).

A history is a list of :class:`Op`: one lease operation by one client, with
the time it was invoked and completed (one clock shared by all clients -- the
test process's monotonic clock, or simulated time) and its outcome:

* ``ok``      -- the backend answered yes;
* ``fail``    -- the backend answered no (held, not ours, CAS lost);
* ``unknown`` -- no answer (deadline, killed connection): it may or may not
  have taken effect.

Checks, per resource:

1. *token sanity*: every ok acquire carries a token; no token is granted twice;
   a holder never believes a lease longer than ``invoke + ttl`` (its margin).
2. *real-time token order*: if grant A completed before grant B was invoked,
   ``token(A) < token(B)`` -- fencing tokens never go backwards.
3. *exclusion*: the belief intervals of different grants never overlap. A
   grant's belief runs from the completion of its acquire (or of an ok renew)
   to the holder's believed expiry, cut at the invocation of its release (any
   outcome -- a holder that tried to release stops acting). Unknown acquires
   and renews give no belief (the client never acts on them).
4. *fencing order*: sorted by start, the belief intervals carry strictly
   increasing tokens, so a FencingGuard never refuses a valid holder.
5. *no spurious failure* (the linearizability half): an acquire that failed
   must overlap, in real time, with some grant (ok *or unknown*) that could
   still have been live at the backend: from the grant's invocation to the
   latest completion of it or any of its ok/unknown renews plus ttl plus
   ``slack_ms`` (clock skew), or to the completion of its ok release. A renew
   or release of one's own lease that failed while the holder's belief was
   still valid and nothing had tried to release it, is spurious too.

The checker must be able to fail: ``tests/test_lease_checker.py`` feeds it
hand-made violating histories.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

__all__ = ["Kind", "Op", "Outcome", "Violation", "check_history"]

Kind = Literal["acquire", "renew", "release"]
Outcome = Literal["ok", "fail", "unknown"]


@dataclass(frozen=True)
class Op:
    """One recorded lease operation."""

    client: str
    kind: Kind
    resource: str
    invoke_ms: float
    complete_ms: float
    outcome: Outcome
    token: int | None = None  # granted (acquire ok) or presented (renew/release)
    ttl_ms: int = 0
    valid_until_ms: float | None = None  # holder's belief after an ok acquire/renew


@dataclass(frozen=True)
class Violation:
    """One broken rule, with the ops involved."""

    rule: str
    detail: str


@dataclass
class _Grant:
    client: str
    token: int | None
    acquire: Op
    beliefs: list[tuple[float, float]]
    live_until_ms: float  # latest instant the backend might still hold it
    raw_beliefs: tuple[tuple[float, float], ...] = ()


def _grants(ops: list[Op], slack_ms: float, replicated: bool) -> list[_Grant]:
    by_key: dict[tuple[str, int], _Grant] = {}
    grants: list[_Grant] = []
    for op in sorted(ops, key=lambda o: o.invoke_ms):
        if op.kind != "acquire" or op.outcome == "fail":
            continue
        g = _Grant(op.client, op.token, op, [], op.complete_ms + op.ttl_ms + slack_ms)
        if op.outcome == "ok" and op.valid_until_ms is not None:
            g.beliefs.append((op.complete_ms, op.valid_until_ms))
        grants.append(g)
        if op.outcome == "ok" and op.token is not None:
            by_key[(op.client, op.token)] = g
    release_invoked: dict[tuple[str, int], float] = {}
    for op in ops:
        if op.kind == "release" and op.token is not None:
            key = (op.client, op.token)
            release_invoked[key] = min(release_invoked.get(key, op.invoke_ms), op.invoke_ms)
    for op in ops:
        if op.kind == "acquire" or op.token is None:
            continue
        g2 = by_key.get((op.client, op.token))
        if g2 is None:
            continue
        if op.kind == "renew" and (op.outcome != "fail" or replicated):
            g2.live_until_ms = max(g2.live_until_ms, op.complete_ms + op.ttl_ms + slack_ms)
            if op.outcome == "ok" and op.valid_until_ms is not None:
                g2.beliefs.append((op.complete_ms, op.valid_until_ms))
        elif op.kind == "release" and op.outcome == "ok" and not replicated:
            g2.live_until_ms = min(g2.live_until_ms, op.complete_ms)
    for g in grants:
        g.raw_beliefs = tuple(g.beliefs)
        if g.token is None:
            continue
        cut = release_invoked.get((g.client, g.token))
        if cut is not None:
            g.beliefs = [(s, min(e, cut)) for s, e in g.beliefs]
        g.beliefs = [(s, e) for s, e in g.beliefs if e > s]
    return grants


def check_history(
    ops: list[Op], *, slack_ms: float = 200.0, spurious: bool = True, replicated: bool = False
) -> list[Violation]:
    """All violations in ``ops`` (empty list: the history is safe).

    ``spurious=False`` skips rule 5 (for fault schedules, such as voters
    restarting into quarantine, that legitimately refuse without a witness).
    ``replicated=True`` is for the quorum backend, whose writes may linger on
    a minority of voters: for rule 5 a failed renew may still have extended a
    grant, and an ok release does not end it (a minority may miss the release).
    Rules 1-4 (safety) are the same either way.
    """
    out: list[Violation] = []
    per_resource: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        per_resource[op.resource].append(op)
    for resource in sorted(per_resource):
        out.extend(
            _check_resource(resource, per_resource[resource], slack_ms, spurious, replicated)
        )
    return out


def _check_resource(
    resource: str, ops: list[Op], slack_ms: float, spurious: bool, replicated: bool
) -> list[Violation]:
    out: list[Violation] = []
    oks = [o for o in ops if o.kind == "acquire" and o.outcome == "ok"]
    # 1. token sanity
    seen: dict[int, Op] = {}
    for o in oks:
        if o.token is None:
            out.append(Violation("token_missing", f"{resource}: ok acquire without token: {o}"))
            continue
        if o.token in seen:
            out.append(Violation("token_reused", f"{resource}: {seen[o.token]} and {o}"))
        seen[o.token] = o
        if o.valid_until_ms is not None and o.valid_until_ms > o.invoke_ms + o.ttl_ms:
            out.append(Violation("belief_too_long", f"{resource}: {o}"))
    for o in ops:
        if (
            o.kind == "renew"
            and o.outcome == "ok"
            and o.token not in {a.token for a in oks if a.client == o.client}
        ):
            out.append(Violation("renew_unknown_grant", f"{resource}: {o}"))
    # 2. real-time token order
    with_tok = sorted((o for o in oks if o.token is not None), key=lambda o: o.complete_ms)
    by_invoke = sorted(with_tok, key=lambda o: o.invoke_ms)
    i, best = 0, None
    for b in by_invoke:
        while i < len(with_tok) and with_tok[i].complete_ms < b.invoke_ms:
            if best is None or (with_tok[i].token or 0) > (best.token or 0):
                best = with_tok[i]
            i += 1
        if best is not None and (best.token or 0) >= (b.token or 0):
            out.append(Violation("token_backwards", f"{resource}: {best} then {b}"))
    grants = _grants(ops, slack_ms, replicated)
    # 3. exclusion and 4. fencing order
    intervals = sorted(
        (s, e, g.token or 0, g.client) for g in grants for s, e in g.beliefs if g.token is not None
    )
    for k, (s1, e1, t1, c1) in enumerate(intervals):
        for s2, e2, t2, c2 in intervals[k + 1 :]:
            if s2 >= e1:
                break
            if (t1, c1) != (t2, c2):
                out.append(
                    Violation(
                        "overlap",
                        f"{resource}: {c1} token {t1} [{s1:.1f},{e1:.1f}] overlaps "
                        f"{c2} token {t2} [{s2:.1f},{e2:.1f}]",
                    )
                )
    last: tuple[float, int, str] | None = None
    for s, _e, t, c in intervals:
        if last is not None and t < last[1]:
            out.append(
                Violation("fencing_backwards", f"{resource}: {last} before ({s:.1f}, {t}, {c})")
            )
        if last is None or t >= last[1]:
            last = (s, t, c)
    # 5. no spurious failures
    for o in ops if spurious else ():
        if o.kind == "acquire" and o.outcome == "fail":
            witness = any(
                g.acquire is not o
                and g.acquire.invoke_ms <= o.complete_ms
                and g.live_until_ms >= o.invoke_ms
                for g in grants
            )
            if not witness:
                out.append(Violation("spurious_acquire_fail", f"{resource}: {o}"))
        elif o.kind in ("renew", "release") and o.outcome == "fail":
            for g in grants:
                if g.client != o.client or g.token != o.token or g.acquire.outcome != "ok":
                    continue
                earlier_release = any(
                    r.kind == "release"
                    and r.client == o.client
                    and r.token == o.token
                    and r is not o
                    and r.invoke_ms <= o.complete_ms
                    for r in ops
                )
                believed = [e for s, e in g.raw_beliefs if s <= o.invoke_ms]
                if not earlier_release and believed and max(believed) > o.complete_ms:
                    out.append(Violation(f"spurious_{o.kind}_fail", f"{resource}: {o}"))
    return out
