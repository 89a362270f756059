"""The chain view is a function of the set of events (hypothesis): any order of
arrival, with duplicates, gives the same checkpoints, heads, writes and forks;
and the head is always of the highest fencing token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import pack
from hivemesh.faces.langgraph.chain import (
    KIND_CHECKPOINT,
    KIND_DELETE,
    KIND_PART,
    KIND_WRITES,
    ChainView,
)


@dataclass(frozen=True)
class Ev:
    """The fields of a journal event the view reads."""

    author: bytes
    seq: int
    kind: str
    body: Any
    hlc: int = 0


AUTHORS = [bytes([i]) * 32 for i in range(3)]

op = st.tuples(
    st.sampled_from(["cp", "cp", "cp", "w", "del", "big"]),
    st.integers(0, 2),  # author
    st.integers(1, 4),  # fencing token
    st.sampled_from(["t1", "t2"]),
    st.sampled_from(["", "sub"]),
    st.integers(0, 5),  # parent: index into earlier checkpoint ids (or none)
)


def build(ops: list[tuple[str, int, int, str, str, int]]) -> list[Ev]:
    seqs = [0, 0, 0]
    ids: list[str] = []
    out: list[Ev] = []

    def nxt(a: int) -> int:
        seqs[a] += 1
        return seqs[a]

    for n, (kind, a, tok, thread, ns, parent) in enumerate(ops):
        author = AUTHORS[a]
        base = {"t": thread, "k": tok}
        if kind == "del":
            out.append(Ev(author, nxt(a), KIND_DELETE, base))
            continue
        cid = f"c{n:03d}"
        index = {
            **base,
            "ns": ns,
            "id": ids[parent % len(ids)] if kind == "w" and ids else cid,
            "p": ids[parent] if parent < len(ids) else None,
            "h": f"h{a}",
        }
        if kind == "big":  # a payload in parts, before the event that names them
            data = pack({"c": cid})
            parts = [nxt(a), nxt(a)]
            out.append(Ev(author, parts[0], KIND_PART, {"x": data[:3]}))
            out.append(Ev(author, parts[1], KIND_PART, {"x": data[3:]}))
            out.append(Ev(author, nxt(a), KIND_CHECKPOINT, {**index, "parts": parts}))
        else:
            k = KIND_WRITES if kind == "w" else KIND_CHECKPOINT
            out.append(Ev(author, nxt(a), k, {**index, "x": pack({"c": cid})}))
        if kind != "w":
            ids.append(cid)
    return out


def summary(view: ChainView) -> list[Any]:
    out: list[Any] = []
    for t in ("t1", "t2"):
        for ns in ("", "sub"):
            recs = view.checkpoints(t, ns)
            out.append([(r.checkpoint_id, r.position, view.payload(r)) for r in recs])
            out.append([[w.position for w in view.writes(r)] for r in recs])
            head = view.latest(t, ns)
            out.append(None if head is None else head.checkpoint_id)
            if recs:
                assert head is not None and head.token == max(r.token for r in recs)
        out.append(view.forks(t))
    out.append(list(view.threads()))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_any_arrival_order_gives_the_same_view(ops: Any, rnd: Any) -> None:
    events = build(ops)
    base = ChainView()
    for ev in events:
        base.apply(ev)  # type: ignore[arg-type]
    expected = summary(base)
    shuffled = events + rnd.sample(events, k=len(events) // 2)  # duplicates too
    rnd.shuffle(shuffled)
    view = ChainView()
    for ev in shuffled:
        view.apply(ev)  # type: ignore[arg-type]
    assert summary(view) == expected
    assert view.rejected == {}


def test_garbage_is_counted_and_ignored() -> None:
    view = ChainView()
    for body in (None, [], {"t": 1}, {"t": "x", "k": "1"}, {"t": "x", "k": 1, "ns": ""}):
        view.apply(Ev(AUTHORS[0], 1, KIND_CHECKPOINT, body))  # type: ignore[arg-type]
    view.apply(Ev(AUTHORS[0], 2, KIND_PART, {"x": "not bytes"}))  # type: ignore[arg-type]
    assert sum(view.rejected.values()) == 6 and list(view.threads()) == []
