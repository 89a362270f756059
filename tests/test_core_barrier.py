"""The majority barrier's rules (hivemesh.core.barrier), without a network."""

from __future__ import annotations

from hivemesh.core.barrier import Barrier, author_hex, clean_vv

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
