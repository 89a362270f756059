"""The majority barrier's rules (hivemesh.core.barrier), without a network."""

from __future__ import annotations

import pytest

from hivemesh.core.barrier import MAX_HOLD_MS, RETRY_MS, Barrier, Majority, author_hex, clean_vv
from hivemesh.errors import BackendUnavailable, InvalidArgument

ME, X, Y = "a" * 64, "b" * 64, "c" * 64  # feed ids (author hex)


def test_answers_are_cleaned_and_an_answer_without_a_vector_counts_for_nothing() -> None:
    assert clean_vv({"vv": {ME: 3, "nothex": 1, X: "2", Y: True, "A" * 64: 1}}) == {ME: 3}
    assert clean_vv({"no": 1}) is None and clean_vv([1]) is None
    assert author_hex(ME) and not author_hex(ME[:-1]) and not author_hex(7)


def test_a_voter_counts_for_itself_and_the_majority_is_strict() -> None:
    b = Barrier(["v3", "v1", "me", "v2"], "me", ME, None)
    assert b.majority == 3 and b.answered == ["me"] and b.others == ["v1", "v2", "v3"]
    b.answer("v1", {})
    assert not b.reached
    b.answer("v2", {})
    assert b.reached
    outsider = Barrier(["v1", "v2", "v3"], "me", ME, None)
    assert outsider.answered == [] and outsider.majority == 2


def test_the_own_seq_half_asks_again_until_the_voter_holds_our_write() -> None:
    b = Barrier(["v1", "v2"], "me", ME, own_seq=5)
    assert not b.holds_own({ME: 4}) and not b.holds_own({})
    assert b.holds_own({ME: 5})


def test_pull_waits_for_the_largest_answer_except_our_own_and_untrusted_feeds() -> None:
    b = Barrier(["v1", "v2", "v3"], "me", ME, None)
    b.answer("v1", {ME: 9, X: 2, Y: 7})
    b.answer("v2", {X: 4})
    held = {X: 3, Y: 7}
    assert b.missing(lambda a: held.get(a, 0), None) == {X: 4}
    assert b.missing(lambda a: held.get(a, 0), lambda author: author != bytes.fromhex(X)) == {}
    held[X] = 4
    assert b.missing(lambda a: held.get(a, 0), None) == {}


# -- Majority: the Peer's barriers and the heads it serves (no event loop) ----------

SELF = "hm-me"
ME_HEX = ME
OTHER_HEX = X


class _Journal:
    def __init__(self) -> None:
        self.heads: dict[str, int] = {ME_HEX: 3}

    def majority(self) -> Majority:
        return Majority(
            SELF, ME_HEX, lambda a: self.heads.get(a, 0), lambda: dict(self.heads), None
        )


def test_a_heads_request_for_a_missing_seq_is_held_until_it_arrives_or_its_wait_ends() -> None:
    j = _Journal()
    m = j.majority()
    m.serve(1, {}, 0)  # no feed named: answered at once
    m.serve(2, {"a": OTHER_HEX, "s": 5, "w": 300}, 0)
    m.serve(3, {"a": OTHER_HEX, "s": 9, "w": 10_000}, 0)  # waits at most MAX_HOLD_MS
    assert m.take()[1] == [(1, {"vv": {ME_HEX: 3}})]
    assert m.next_deadline() == 300
    j.heads[OTHER_HEX] = 5
    m.tick(10)
    assert m.take()[1] == [(2, {"vv": {ME_HEX: 3, OTHER_HEX: 5}})]
    assert m.next_deadline() == MAX_HOLD_MS
    m.tick(MAX_HOLD_MS)
    assert [key for key, _ in m.take()[1]] == [3] and not m.busy


def test_a_barrier_asks_the_other_voters_and_answers_once_a_majority_holds_our_feed() -> None:
    m = _Journal().majority()
    m.start(7, [SELF, "v1", "v2"], own_seq=3, pull=False, timeout_s=1.0, now_ms=0)
    asks, _, replies = m.take()
    assert [(v, body) for _, v, body, _ in asks] == [
        ("v1", {"a": ME_HEX, "s": 3, "w": 950}),
        ("v2", {"a": ME_HEX, "s": 3, "w": 950}),
    ] and not replies
    (a1, _, _, t1), (a2, _, _, _) = asks
    assert t1 == 1000 and a1 < 0 and a2 < 0  # never a command's rid
    assert m.replied(a1, {"vv": {ME_HEX: 2}}, False, 10)  # not there yet: asked again
    (again, voter, _, _), *_ = m.take()[0]
    assert voter == "v1"
    assert m.replied(a2, None, True, 20)  # failed: asked again RETRY_MS later
    assert m.next_deadline() == 20 + RETRY_MS
    assert m.replied(again, {"vv": {ME_HEX: 3}}, False, 30)  # me and v1: a majority
    reply = m.take()[2][0]
    assert reply.rid == 7 and reply.value.answered == sorted([SELF, "v1"]) and not m.busy
    assert m.replied(a2, {"vv": {}}, False, 40)  # a late answer is ours, and dropped


def test_no_majority_by_the_deadline_is_backend_unavailable() -> None:
    m = _Journal().majority()
    m.start(1, ["hm-x", "v1", "v2"], own_seq=None, pull=True, timeout_s=0.5, now_ms=0)
    asks = m.take()[0]
    m.replied(asks[0][0], {"vv": {}}, False, 10)  # one answer of three: no majority
    m.tick(499)
    assert not m.take()[2]
    m.tick(500)
    (reply,) = m.take()[2]
    assert isinstance(reply.error, BackendUnavailable)


def test_a_pull_barrier_waits_until_this_node_holds_what_the_majority_held() -> None:
    j = _Journal()
    m = j.majority()
    m.start(1, [SELF, "v1"], own_seq=None, pull=True, timeout_s=1.0, now_ms=0)
    ((ask, _, body, _),) = m.take()[0]
    assert body == {}
    m.replied(ask, {"vv": {OTHER_HEX: 4}}, False, 5)
    assert not m.take()[2]  # reached, but this node holds less of b's feed
    j.heads[OTHER_HEX] = 4
    m.tick(6)
    (reply,) = m.take()[2]
    assert reply.error is None and reply.value.majority == 2


def test_an_own_seq_past_our_feed_is_refused_at_once() -> None:
    with pytest.raises(InvalidArgument):
        _Journal().majority().start(1, [SELF], own_seq=4, pull=False, timeout_s=1.0, now_ms=0)
