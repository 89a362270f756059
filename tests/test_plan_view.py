"""The plan reducer: rules, bad input, and order independence (hypothesis)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.event import Event
from hivemesh.core.hlc import make_hlc
from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    ALL_KINDS,
    KIND_CANCEL,
    KIND_CLAIM,
    KIND_DOWN,
    KIND_GOAL,
    KIND_HELLO,
    KIND_MEMBER_DOWN,
    KIND_PROPOSE,
    KIND_RELEASE,
    KIND_RESULT,
    KIND_VOTE,
    cancel_body,
    child_id,
    claim_body,
    down_body,
    event_ref,
    goal_body,
    goal_id,
    hello_body,
    propose_body,
    release_body,
    result_body,
    vote_body,
)
from hivemesh.roles.local import FeedWriter, author_key

NONCE = b"nonce-0001"


class World:
    """Authors writing events with explicit millisecond timestamps."""

    def __init__(self) -> None:
        self.writers: dict[str, FeedWriter] = {}
        self.events: list[Event] = []

    def emit(self, who: str, ms: int, kind: str, body: Any) -> Event:
        w = self.writers.setdefault(who, FeedWriter(author_key(who)))
        hlc = max(make_hlc(ms), w.clock.last + 1)
        w.clock.last = hlc
        ev = w.make(kind, body, ms, hlc=hlc)
        self.events.append(ev)
        return ev

    def view(self, events: list[Event] | None = None) -> PlanView:
        v = PlanView()
        for ev in self.events if events is None else events:
            v.apply(ev)
        return v


def sub(title: str, *, deps: list[int] | None = None, atomic: bool = True) -> dict[str, Any]:
    return {"title": title, "detail": "", "deps": deps or [], "atomic": atomic, "caps": []}


def yes(pid: str, gid: str, s: int = 8, accept: bool = True) -> dict[str, Any]:
    return vote_body(
        pid, gid, accept=accept, concreteness=s, non_overlap=s, completeness=s, notes="ok"
    )


def start(w: World, **kw: Any) -> str:
    kw.setdefault("settle_ms", 50)
    w.emit("cli", 1000, KIND_GOAL, goal_body("trip to Lisbon", NONCE, **kw))
    return goal_id(author_key("cli"), NONCE)


def test_split_accepted_by_majority_and_rolled_up() -> None:
    w = World()
    gid = start(w, max_depth=2)
    p = event_ref(
        w.emit(
            "d1", 1010, KIND_PROPOSE, propose_body(gid, 0, [sub("flights"), sub("hotel", deps=[0])])
        )
    )
    w.emit("s1", 1020, KIND_VOTE, yes(p, gid))
    v = w.view()
    assert v.node(gid).accepted is None  # 1 of 3 scorers: no majority yet
    w.emit("s2", 1030, KIND_VOTE, yes(p, gid))
    v = w.view()
    root = v.node(gid)
    assert root.accepted == p and root.status == "split"
    c0, c1 = child_id(gid, p, 0), child_id(gid, p, 1)
    assert root.children == [c0, c1]
    assert v.node(c1).status == "blocked" and v.node(c0).status == "ready"
    assert [t.task for t in v.claimable(1030)] == []  # not settled yet
    assert [t.task for t in v.claimable(1080)] == [c0]
    claim = event_ref(w.emit("e1", 1100, KIND_CLAIM, claim_body(c0)))
    v = w.view()
    assert not v.claim_won(c0, claim, 1120) and v.claim_won(c0, claim, 1150)
    w.emit("e1", 1200, KIND_RESULT, result_body(c0, "TAP 09:00"))
    v = w.view()
    hotel = v.claimable(1300)
    assert [t.task for t in hotel] == [c1] and hotel[0].inputs == (("flights", "TAP 09:00"),)
    w.emit("e2", 1300, KIND_CLAIM, claim_body(c1))
    w.emit("e2", 1400, KIND_RESULT, result_body(c1, "Hotel Avenida"))
    v = w.view()
    assert v.node(gid).status == "synthesis"
    synth = v.claimable(1500)
    assert synth[0].kind == "synthesise" and len(synth[0].inputs) == 2
    w.emit("e3", 1500, KIND_CLAIM, claim_body(gid))
    w.emit("e3", 1600, KIND_RESULT, result_body(gid, "final"))
    v = w.view()
    assert v.node(gid).status == "done" and v.final_answer(gid) == "final"


def test_competing_proposals_best_score_wins_within_window() -> None:
    w = World()
    gid = start(w, quorum="count", quorum_value=1, scorers=2)
    pa = event_ref(w.emit("d1", 1010, KIND_PROPOSE, propose_body(gid, 0, [sub("a")])))
    pb = event_ref(w.emit("d2", 1011, KIND_PROPOSE, propose_body(gid, 0, [sub("b")])))
    w.emit("s1", 1020, KIND_VOTE, yes(pa, gid, 5))
    w.emit("s1", 1030, KIND_VOTE, yes(pb, gid, 9))  # within 50 ms: competing
    assert w.view().node(gid).accepted == pb
    w2 = World()
    gid2 = start(w2, quorum="count", quorum_value=1, scorers=2)
    pa = event_ref(w2.emit("d1", 1010, KIND_PROPOSE, propose_body(gid2, 0, [sub("a")])))
    pb = event_ref(w2.emit("d2", 1011, KIND_PROPOSE, propose_body(gid2, 0, [sub("b")])))
    w2.emit("s1", 1020, KIND_VOTE, yes(pa, gid2, 5))
    w2.emit("s1", 1200, KIND_VOTE, yes(pb, gid2, 9))  # outside the window: first wins
    assert w2.view().node(gid2).accepted == pa


def test_rejection_starts_new_round_and_down_scorer_shrinks_quorum() -> None:
    w = World()
    gid = start(w)
    for s in ("s1", "s2", "s3"):
        w.emit(s, 1001, KIND_HELLO, hello_body(["scorer"]))
    p = event_ref(w.emit("d1", 1010, KIND_PROPOSE, propose_body(gid, 0, [sub("a")])))
    v = w.view()
    assert v.next_round(gid) is None
    w.emit("s1", 1020, KIND_VOTE, yes(p, gid, 2, accept=False))
    w.emit("s2", 1021, KIND_VOTE, yes(p, gid, 2, accept=False))
    v = w.view()
    assert v.node(gid).proposals[0].rejected and v.next_round(gid) == 1
    p1 = event_ref(w.emit("d1", 1100, KIND_PROPOSE, propose_body(gid, 1, [sub("b")])))
    w.emit("s1", 1110, KIND_VOTE, yes(p1, gid))
    assert w.view().node(gid).accepted is None  # 1 of 3 live
    w.emit("fd", 1120, KIND_DOWN, down_body(author_key("s2")))
    w.emit("fd", 1121, KIND_DOWN, down_body(author_key("s3")))
    v = w.view()
    assert v.node(gid).accepted == p1  # 1 of 1 live is a majority


def test_crashed_claimer_released_and_reclaimed_exactly_one_result() -> None:
    w = World()
    gid = start(w, max_depth=0)  # the root is itself a leaf
    c1 = event_ref(w.emit("e1", 1010, KIND_CLAIM, claim_body(gid)))
    c2 = event_ref(w.emit("e2", 1011, KIND_CLAIM, claim_body(gid)))
    v = w.view()
    assert v.claim_won(gid, c1, 2000) and not v.claim_won(gid, c2, 2000)
    w.emit("fd", 1500, KIND_RELEASE, release_body(gid, c1, reason="e1 down"))
    v = w.view()
    assert v.claim_won(gid, c2, 2000)
    w.emit("e2", 1600, KIND_RESULT, result_body(gid, "second"))
    w.emit("e1", 1700, KIND_RESULT, result_body(gid, "late"))  # zombie: duplicate
    w.emit("x9", 1650, KIND_RESULT, result_body(gid, "never claimed"))
    w.emit("e3", 1800, KIND_CLAIM, claim_body(gid))  # claim for a finished task
    v = w.view()
    n = v.node(gid)
    assert n.status == "done" and n.result[2] == "second" and n.duplicates == 1
    assert v.claimable(5000) == []


def test_a_backdated_claim_or_result_does_not_overturn_a_settled_one() -> None:
    """A trusted executor stamps its claim and result before the honest ones;
    witnesses (core.witness) show it was first seen much later."""
    w = World()
    gid = start(w, max_depth=0)  # settle_ms 50: the ordering window
    honest = w.emit("e1", 1010, KIND_CLAIM, claim_body(gid))
    w.emit("e2", 1012, "witness", {"c": [[honest.author, honest.seq]]})
    v = w.view()
    assert v.claim_won(gid, event_ref(honest), 1100)
    liar = w.emit("m", 900, KIND_CLAIM, claim_body(gid))  # written at 5000
    w.emit("e2", 5000, "witness", {"c": [[liar.author, liar.seq]]})
    v = w.view()
    assert v.node(gid).winner[1] == author_key("e1")  # m's before the fix
    assert v.claim_won(gid, event_ref(honest), 5000)
    assert v.stats()["claim_takeovers_refused"] == 1
    done = w.emit("e1", 5100, KIND_RESULT, result_body(gid, "honest"))
    w.emit("e2", 5101, "witness", {"c": [[done.author, done.seq]]})
    fake = w.emit("m", 950, KIND_RESULT, result_body(gid, "forged history"))
    w.emit("e2", 9000, "witness", {"c": [[fake.author, fake.seq]]})
    v = w.view()
    assert v.final_answer(gid) == "honest"
    assert v.stats()["result_takeovers_refused"] == 1


def test_member_down_voids_claims_up_to_its_seq() -> None:
    w = World()
    gid = start(w, max_depth=0)
    c1 = event_ref(w.emit("e1", 1010, KIND_CLAIM, claim_body(gid)))
    upto = w.writers["e1"].seq
    w.emit("e2", 1011, KIND_CLAIM, claim_body(gid))
    w.emit("fd", 1500, KIND_MEMBER_DOWN, {"a": author_key("e1"), "upto": upto, "extra": 1})
    v = w.view()
    assert not v.claim_won(gid, c1, 9999) and v.node(gid).winner[1] == author_key("e2")
    c3 = event_ref(w.emit("e1", 1600, KIND_CLAIM, claim_body(gid)))  # after restart: counts
    assert c3 in [c for _h, _a, c, rel in w.view().node(gid).claims if not rel]
    assert w.view().invalid.total() == 0


def test_failed_attempts_fail_task_and_dependants() -> None:
    w = World()
    gid = start(w, max_depth=1, max_attempts=2, quorum="count", quorum_value=1)
    p = event_ref(
        w.emit("d1", 1010, KIND_PROPOSE, propose_body(gid, 0, [sub("a"), sub("b", deps=[0])]))
    )
    w.emit("s1", 1020, KIND_VOTE, yes(p, gid))
    a, b = child_id(gid, p, 0), child_id(gid, p, 1)
    for i in range(2):
        c = event_ref(w.emit("e1", 1100 + i * 10, KIND_CLAIM, claim_body(a)))
        w.emit("e1", 1105 + i * 10, KIND_RELEASE, release_body(a, c, failed=True, reason="llm"))
    v = w.view()
    assert v.node(a).status == "failed" and v.node(b).status == "failed"
    assert v.node(gid).status == "synthesis"


def test_cancel_stops_everything() -> None:
    w = World()
    gid = start(w, max_depth=0)
    w.emit("cli", 1010, KIND_CANCEL, cancel_body(gid, "user"))
    v = w.view()
    assert v.node(gid).status == "cancelled" and v.claimable(9999) == []
    assert v.open_goals(9999) == []


def test_bad_input_is_counted_never_raises() -> None:
    w = World()
    gid = start(w)
    bad: list[tuple[str, Any]] = [
        (KIND_PROPOSE, propose_body(gid, 0, [])),  # zero subgoals
        (KIND_PROPOSE, propose_body(gid, 0, [sub(f"s{i}") for i in range(300)])),
        (KIND_PROPOSE, propose_body(gid, 0, [sub("a", deps=[0])])),  # self dep
        (KIND_PROPOSE, {"goal": gid}),
        (KIND_VOTE, yes("f" * 32, gid)),  # unknown proposal: kept, ignored
        (KIND_VOTE, {**yes("f" * 32, gid), "concreteness": 99}),
        (KIND_CLAIM, {"task": "nothex"}),
        (KIND_CLAIM, [1, 2, 3]),
        (KIND_RESULT, {"task": gid, "text": 5}),
        (KIND_GOAL, {"title": "x"}),
        (KIND_HELLO, {"roles": ["king"]}),
        (KIND_DOWN, {"node": b"short"}),
        ("plan.unknown", {}),
        (KIND_RESULT, None),
    ]
    for i, (kind, body) in enumerate(bad):
        w.emit("evil", 1010 + i, kind, body)
    v = w.view()
    assert sum(v.invalid.values()) == len(bad) - 1
    assert v.stats()["orphan_votes"] == 1
    assert v.node(gid).status == "open" and v.next_round(gid) == 0
    assert v.snapshot()["goals"][0]["proposals"] == []


# -- order independence ------------------------------------------------------------


def scenario(seed: int) -> list[Event]:
    """A random but plausible plan history: rounds, votes, downs, claims,
    releases, results, duplicates, garbage and sometimes a cancel."""
    rng = random.Random(seed)
    w = World()
    mode = rng.choice(["count", "majority", "fraction"])
    gid = start(
        w,
        quorum=mode,
        quorum_value={"count": 2, "majority": 0, "fraction": 0.5}[mode],
        max_depth=2,
        settle_ms=rng.choice([0, 20, 100]),
    )
    t = 1000
    if rng.random() < 0.5:
        for s in ("s1", "s2", "s3"):
            w.emit(s, t, KIND_HELLO, hello_body(["scorer"]))
    frontier = [gid]
    for _level in range(2):
        nxt = []
        for node in frontier:
            pids = []
            for d in ("d1", "d2", "d3")[: rng.randint(1, 3)]:
                t += rng.randint(1, 30)
                subs = [
                    sub(
                        f"{d}-{i}",
                        deps=[i - 1] if i and rng.random() < 0.3 else [],
                        atomic=rng.random() < 0.5,
                    )
                    for i in range(rng.randint(1, 3))
                ]
                pids.append(event_ref(w.emit(d, t, KIND_PROPOSE, propose_body(node, 0, subs))))
            for s in ("s1", "s2", "s3"):
                for pid in pids:
                    if rng.random() < 0.85:
                        t += rng.randint(0, 40)
                        w.emit(
                            s, t, KIND_VOTE, yes(pid, node, rng.randint(0, 10), rng.random() < 0.7)
                        )
            if rng.random() < 0.2:
                w.emit("fd", t, KIND_DOWN, down_body(author_key("s3")))
            for pid in pids:
                nxt += [child_id(node, pid, i) for i in range(3)]
        frontier = nxt
    tasks = [*frontier, gid]
    for task in tasks:
        cids = []
        for e in ("e1", "e2")[: rng.randint(0, 2)]:
            t += rng.randint(1, 20)
            cids.append((e, event_ref(w.emit(e, t, KIND_CLAIM, claim_body(task)))))
        for e, cid in cids:
            r = rng.random()
            if r < 0.2:
                w.emit("fd", t + 5, KIND_RELEASE, release_body(task, cid, failed=r < 0.1))
            elif r < 0.25:
                upto = w.writers[e].seq
                w.emit("fd", t + 5, KIND_MEMBER_DOWN, {"a": author_key(e), "upto": upto})
            elif r < 0.9:
                t += rng.randint(1, 50)
                w.emit(e, t, KIND_RESULT, result_body(task, f"{e} did {task[:6]}"))
        for e, _cid in cids:  # witnesses, sometimes far later: they may reorder claims
            if rng.random() < 0.5:
                seen = {"c": [[author_key(e), w.writers[e].seq]]}
                w.emit(rng.choice(("e1", "e2", "w1")), t + rng.randint(0, 300), "witness", seen)
    if rng.random() < 0.2:
        w.emit("cli", t + 1, KIND_CANCEL, cancel_body(gid, "stop"))
    w.emit("evil", t + 2, KIND_VOTE, {"proposal": 1})
    return w.events


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.randoms(use_true_random=False), st.data())
def test_any_permutation_and_duplication_gives_same_snapshot(
    seed: int, shuffle: random.Random, data: st.DataObject
) -> None:
    events = scenario(seed)
    ref = PlanView()
    for ev in events:
        ref.apply(ev)
    dups = data.draw(st.lists(st.sampled_from(events), max_size=10))
    mixed = events + dups
    shuffle.shuffle(mixed)
    other = PlanView()
    for ev in mixed:
        other.apply(ev)
        other.snapshot()  # interleave queries with ingestion: caches must not leak
    assert other.snapshot() == ref.snapshot()
    assert other.invalid == ref.invalid
    assert [t.task for t in other.claimable(10**9)] == [t.task for t in ref.claimable(10**9)]


def test_quorum_modes() -> None:
    from hivemesh.core.plan_events import Quorum

    assert Quorum("count", 2, 3).required(1) == 2
    assert [Quorum("majority", 0, 3).required(n) for n in (1, 2, 3, 4)] == [1, 2, 2, 3]
    assert [Quorum("fraction", 670, 3).required(n) for n in (1, 3, 10)] == [1, 3, 7]
    assert Quorum("fraction", 500, 3).required(4) == 2


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.sampled_from(["a" * 32, "0" * 32]),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.sampled_from(
                [
                    "goal",
                    "task",
                    "title",
                    "subgoals",
                    "round",
                    "claim",
                    "node",
                    "nonce",
                    "quorum",
                    "proposal",
                    "accept",
                    "roles",
                    "text",
                    "x",
                ]
            ),
            inner,
            max_size=8,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(ALL_KINDS)), _values)
def test_garbage_bodies_never_crash(kind: str, body: Any) -> None:
    w = World()
    gid = start(w)
    w.emit("evil", 1001, kind, body)
    v = w.view()
    snap = v.snapshot()
    assert gid in [g["id"] for g in snap["goals"]]
    v.claimable(10**6)
    v.open_goals(10**6)
    v.stats()


def test_deadlines_and_speculative_claims() -> None:
    w = World()
    gid = start(w, max_depth=1, settle_ms=50, quorum="count", quorum_value=1)
    p = event_ref(w.emit("d1", 1010, KIND_PROPOSE, propose_body(gid, 0, [sub("a")])))
    v = w.view()
    assert v.next_deadline(1010) == 1060  # the proposal's gathering window
    w.emit("s1", 1020, KIND_VOTE, yes(p, gid))
    v = w.view()
    a = child_id(gid, p, 0)
    assert v.next_deadline(1020) == 1070  # the decision settles
    assert v.claimable(1030) == [] and [t.task for t in v.claimable(1030, speculative=True)] == [a]
    c = event_ref(w.emit("e1", 1030, KIND_CLAIM, claim_body(a)))
    v = w.view()
    assert v.next_deadline(1030) == 1070
    assert not v.claim_won(a, c, 1075)  # decision settled, claim not yet (1030 + 50)
    assert v.claim_won(a, c, 1080)
    assert v.next_deadline(1080) is None
