"""The quorum voter's durable state: what must be on disk, the token reserve, restores."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.lease_voter import Voter
from hivemesh.errors import InvalidArgument


def acc(rid: int, token: int, holder: str = "h", ttl: int = 100) -> list[object]:
    return ["acc", rid, "r", token, holder, ttl, f"p/{rid}"]


def rel(rid: int, token: int, holder: str = "h") -> list[object]:
    return ["rel", rid, "r", token, holder, f"p/{rid}", ""]


def test_the_reserve_writes_a_token_bound_ahead_and_restores_to_it() -> None:
    v = Voter("v", token_reserve=10)
    assert v.durable("r") == (0, 0)
    assert v.receive(acc(1, 1), 0) == ["acc_r", 1, True]
    assert v.durable("r") == (11, 100)  # one disk write covers tokens up to 11
    for t in range(2, 12):  # the next ten grants change nothing durable
        assert v.receive(rel(t + 100, t - 1), t)[2] is True
        assert v.receive(acc(t, t), t)[2] is True
        assert v.durable("r") == (11, 100)
    assert v.receive(rel(200, 11), 12)[2] is True
    assert v.receive(acc(12, 12), 12)[2] is True
    assert v.durable("r") == (22, 100)
    # a restart: the bound is the new max_token (>= everything accepted), quarantined
    back = Voter("v", state=v.snapshot(), now_ms=0, token_reserve=10)
    assert back.receive(["prep", 1, "r"], 50) == ["prep_r", 1, 22, "?", 50, 0]
    assert back.receive(acc(2, 22), 101) == ["acc_r", 2, False]  # not above the bound
    assert back.receive(acc(3, 23), 101) == ["acc_r", 3, True]
    assert back.durable("r") == (33, 100)


def test_without_a_reserve_the_exact_token_is_durable_and_a_release_changes_nothing() -> None:
    v = Voter("v")
    v.receive(acc(1, 5), 0)
    assert v.durable("r") == (5, 100) and v.snapshot()["max_tokens"] == {"r": 5}
    v.receive(rel(2, 5), 1)
    assert v.durable("r") == (5, 100)  # a release is never waited on for the disk
    with pytest.raises(InvalidArgument):
        Voter("v", token_reserve=-1)


@settings(max_examples=300, deadline=None)
@given(
    reserve=st.sampled_from([0, 1, 3, 1024]),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("acc"), st.integers(1, 60), st.sampled_from(["a", "b"])),
            st.tuples(st.just("rel"), st.integers(1, 60), st.sampled_from(["a", "b"])),
            st.tuples(st.just("crash"), st.just(0), st.just("")),
        ),
        max_size=40,
    ),
)
def test_a_restored_voter_never_forgets_a_token_it_acknowledged(
    reserve: int, steps: list[tuple[str, int, str]]
) -> None:
    """The runtime's contract, modelled: write the snapshot whenever ``durable()``
    changes, before the reply; a crash restores from that. Whatever was acked
    stays at or below the restored voter's max_token, so a token is never
    accepted twice across crashes."""
    v = Voter("v", token_reserve=reserve)
    disk: dict[str, Any] = v.snapshot()
    acked: set[int] = set()
    now = 0
    for i, (kind, token, holder) in enumerate(steps):
        now += 1000  # every lease has expired by the next step
        if kind == "crash":
            v = Voter("v", state=disk, now_ms=now, token_reserve=reserve)
            now += 1000  # out of quarantine
            continue
        before = v.durable("r")
        msg = acc(i, token, holder) if kind == "acc" else rel(i, token, holder)
        ok = v.receive(msg, now)[2]
        if v.durable("r") != before:
            disk = v.snapshot()
        if kind == "acc" and ok:
            assert token not in acked, f"token {token} accepted twice"
            acked.add(token)
        reported = v.receive(["prep", 10_000 + i, "r"], now)[2]
        assert isinstance(reported, int) and reported >= max(acked, default=0)


def test_an_abort_that_overtakes_its_accept_makes_the_accept_refused() -> None:
    """Links reorder: a fast acquire's abort (a release naming the attempt)
    can reach a voter before the accept it aborts. The accept must then be
    refused, or it holds the voter for its TTL for an acquire that failed
    (``hivemesh sim --seeds 589..589 --nodes 5 --workload leases``: three
    voters held, every acquire failed spuriously until they expired)."""
    v = Voter("v1")
    abort = ["rel", 16, "r", 5, "c0", "c0/16", "c0/15"]
    assert v.receive(abort, 1_000) == ["rel_r", 16, False]
    assert v.receive(["acc", 15, "r", 5, "c0", 1_200, "c0/15"], 1_005) == ["acc_r", 15, False]
    assert v.receive(["prep", 17, "r"], 1_006)[3] == ""  # free
    assert v.counters["accept_aborted"] == 1
    # another attempt of the same holder is not affected
    assert v.receive(["acc", 18, "r", 6, "c0", 1_200, "c0/18"], 1_010) == ["acc_r", 18, True]
    # in order (accept, then abort), the abort clears the grant as before
    assert v.receive(["rel", 19, "r", 6, "c0", "c0/19", "c0/18"], 1_020) == ["rel_r", 19, True]
    assert v.receive(["prep", 20, "r"], 1_021)[3] == ""


def test_records_fold_into_the_durable_state_and_a_torn_tail_is_not_read() -> None:
    from hivemesh.core.lease_voter import DurableBounds, pack_record, unpack_records

    b = DurableBounds()
    data = pack_record({"max_ttl_ms": 50, "max_tokens": {"a": 2}})
    data += pack_record(b.change("b", 7, 200)) + pack_record(["a", 4, 100])
    torn = pack_record(["a", 99, 999])
    data += torn[:-1] + bytes(16)  # a crash mid-write: never acknowledged
    again = DurableBounds()
    for _, rec in unpack_records(data):
        again.apply(rec)
    assert again.state() == {"max_ttl_ms": 200, "max_tokens": {"a": 4, "b": 7}}
    bad = bytearray(pack_record(["a", 1, 1]))
    bad[-1] ^= 0xFF  # checksum mismatch: the valid prefix ends before it
    assert list(unpack_records(bytes(bad))) == []
    with pytest.raises(ValueError):
        DurableBounds().apply(["a", "x", 1])
