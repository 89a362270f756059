"""The history checker must catch hand-made violations and pass clean histories."""

from __future__ import annotations

from hivemesh.verify import Op, check_history


def acq(c: str, t0: float, t1: float, token: int | None, out: str = "ok", ttl: int = 100) -> Op:
    vu = t0 + ttl * 0.9 if out == "ok" else None
    return Op(c, "acquire", "r", t0, t1, out, token, ttl, vu)  # type: ignore[arg-type]


def ren(c: str, t0: float, t1: float, token: int, out: str = "ok", ttl: int = 100) -> Op:
    vu = t0 + ttl * 0.9 if out == "ok" else None
    return Op(c, "renew", "r", t0, t1, out, token, ttl, vu)  # type: ignore[arg-type]


def rel(c: str, t0: float, t1: float, token: int, out: str = "ok") -> Op:
    return Op(c, "release", "r", t0, t1, out, token)  # type: ignore[arg-type]


def rules(ops: list[Op]) -> list[str]:
    return sorted({v.rule for v in check_history(ops, slack_ms=10)})


def test_clean_sequential_history() -> None:
    h = [
        acq("a", 0, 1, 1),
        rel("a", 50, 51, 1),
        acq("b", 60, 61, 2),
        acq("a", 62, 63, None, "fail"),
        ren("b", 70, 71, 2),
        rel("b", 80, 81, 2),
        acq("a", 100, 101, 3),
    ]
    assert rules(h) == []


def test_overlapping_holders_detected() -> None:
    assert rules([acq("a", 0, 1, 1), acq("b", 10, 11, 2)]) == ["overlap"]


def test_renew_extends_belief_into_overlap() -> None:
    h = [acq("a", 0, 1, 1), ren("a", 60, 61, 1), acq("b", 100, 101, 2)]
    assert rules(h) == ["overlap"]


def test_expired_lease_may_be_taken_over() -> None:
    assert rules([acq("a", 0, 1, 1), acq("b", 120, 121, 2)]) == []


def test_tokens_going_backwards_detected() -> None:
    h = [acq("a", 0, 1, 5), rel("a", 2, 3, 5), acq("b", 10, 11, 3)]
    assert "token_backwards" in rules(h)


def test_token_reuse_detected() -> None:
    h = [acq("a", 0, 1, 4), rel("a", 2, 3, 4), acq("b", 10, 11, 4)]
    assert "token_reused" in rules(h)


def test_fencing_order_against_belief_start_detected() -> None:
    # Concurrent acquires (no real-time order) but the later holder got a lower token.
    a = Op("a", "acquire", "r", 0, 50, "ok", 5, 100, 60)
    b = Op("b", "acquire", "r", 10, 70, "ok", 3, 100, 100)
    assert rules([a, b]) == ["fencing_backwards"]


def test_belief_longer_than_ttl_detected() -> None:
    a = Op("a", "acquire", "r", 0, 1, "ok", 1, 100, 150)
    assert rules([a]) == ["belief_too_long"]


def test_acquire_failure_needs_a_witness() -> None:
    assert rules([acq("b", 10, 11, None, "fail")]) == ["spurious_acquire_fail"]
    # released long before: no witness either
    h = [acq("a", 0, 1, 1), rel("a", 2, 3, 1), acq("b", 10, 11, None, "fail")]
    assert rules(h) == ["spurious_acquire_fail"]


def test_unknown_acquire_is_a_possible_witness_but_no_holder() -> None:
    h = [
        acq("a", 0, 1, None, "unknown"),
        acq("b", 10, 11, None, "fail"),
        acq("c", 200, 201, 7),
    ]
    assert rules(h) == []


def test_unknown_release_ends_belief_but_not_backend_hold() -> None:
    h = [
        acq("a", 0, 1, 1),
        rel("a", 20, 30, 1, "unknown"),
        acq("b", 40, 41, None, "fail"),  # witness: a may still hold
        acq("c", 45, 46, 2),  # a stopped acting at 20: no overlap
    ]
    assert rules(h) == []


def test_spurious_release_and_renew_failures_detected() -> None:
    assert rules([acq("a", 0, 1, 1), rel("a", 10, 11, 1, "fail")]) == ["spurious_release_fail"]
    assert rules([acq("a", 0, 1, 1), ren("a", 10, 11, 1, "fail")]) == ["spurious_renew_fail"]
    # failing after the belief lapsed is allowed
    assert rules([acq("a", 0, 1, 1), rel("a", 95, 96, 1, "fail")]) == []


def test_renew_of_a_token_never_granted_detected() -> None:
    assert "renew_unknown_grant" in rules([ren("a", 0, 1, 9)])


def test_replicated_mode_lets_minority_leftovers_witness_failures() -> None:
    h = [acq("a", 0, 1, 1), rel("a", 2, 3, 1), acq("b", 10, 11, None, "fail")]
    assert rules(h) == ["spurious_acquire_fail"]
    assert check_history(h, slack_ms=10, replicated=True) == []
    h = [acq("a", 0, 1, 1), ren("a", 92, 93, 1, "fail"), acq("b", 150, 151, None, "fail")]
    assert rules(h) == ["spurious_acquire_fail"]
    assert check_history(h, slack_ms=10, replicated=True) == []
    # safety rules are unchanged
    assert [
        v.rule for v in check_history([acq("a", 0, 1, 1), acq("b", 5, 6, 2)], replicated=True)
    ] == ["overlap"]
