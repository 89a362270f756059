"""The CI campaign: a deterministic mix by seed, run across processes, and
the verification memo that makes its seeds cheaper without changing them."""

from __future__ import annotations

from collections import Counter

import nacl.bindings

from hivemesh.core.identity import Identity, verify
from hivemesh.sim.campaign import CI_MIX, ci_scenario, default_options, run_mix, run_seed
from hivemesh.sim.cluster import Cluster
from hivemesh.sim.memo import verification_memo


def test_memo_answers_as_libsodium_and_never_remembers_a_refusal() -> None:
    me = Identity.from_seed(b"\x01" * 32)
    sig = me.sign(b"hello")
    bad = bytes([sig[0] ^ 1]) + sig[1:]
    real = nacl.bindings.crypto_sign_open
    with verification_memo() as memo:
        assert nacl.bindings.crypto_sign_open is not real
        assert verify(me.public, sig, b"hello") and verify(me.public, sig, b"hello")
        assert len(memo) == 1  # verified once, answered twice
        assert not verify(me.public, bad, b"hello")
        assert not verify(me.public, sig, b"hullo")
        assert len(memo) == 1
    assert nacl.bindings.crypto_sign_open is real


def test_memo_knows_its_own_signatures_and_still_refuses_a_wrong_key() -> None:
    me, other = Identity.from_seed(b"\x01" * 32), Identity.from_seed(b"\x02" * 32)
    calls: list[bytes] = []
    real = nacl.bindings.crypto_sign_open

    def counting(signed: bytes, pk: bytes) -> bytes:
        calls.append(pk)
        return real(signed, pk)

    nacl.bindings.crypto_sign_open = counting
    try:
        with verification_memo():
            sig = me.sign(b"head")  # made in the run: its verification is known
            assert verify(me.public, sig, b"head") and calls == []
            assert not verify(other.public, sig, b"head")  # another key: libsodium says no
            assert not verify(me.public, sig, b"tail")
            assert not verify(me.public, other.sign(b"head"), b"head")
            assert len(calls) == 3
    finally:
        nacl.bindings.crypto_sign_open = real
    assert verify(me.public, sig, b"head")  # and libsodium agrees


def test_a_seed_runs_the_same_with_and_without_the_memo() -> None:
    opts = default_options(5)
    for seed in (3, 104):
        plain = Cluster(str(seed), opts).run()
        memo = run_seed(seed, opts)
        assert (plain.trace_digest, plain.stats) == (memo.trace_digest, memo.stats)


def test_ci_mix_covers_every_workload_and_5_to_50_nodes() -> None:
    plan = [ci_scenario(s) for s in range(1, 10_001)]
    assert plan == [ci_scenario(s) for s in range(1, 10_001)]  # a pure function of the seed
    by_workload = Counter(sc.workload for sc in plan)
    assert set(by_workload) == set(CI_MIX)
    sizes = {sc.nodes for sc in plan}
    assert min(sizes) == 5 and max(sizes) == 50
    assert sum(1 for sc in plan if sc.nodes >= 20) >= 50


def test_mixed_campaign_digest_does_not_depend_on_jobs() -> None:
    seeds = range(1, 9)
    one = run_mix(seeds, jobs=1)
    two = run_mix(seeds, jobs=2)
    assert one["violations"] == 0, one["examples"]
    assert one["trace_digest"] == two["trace_digest"]
    assert sum(row["runs"] for row in one["by_workload"].values()) == 8
    failed = run_mix([], jobs=1)
    assert failed["runs"] == 0 and failed["replay"] == []
