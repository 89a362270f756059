"""Seeds mean what they meant: pinned outcomes of CI-campaign seeds.

A performance change to the simulator or the core must leave every seed's
run exactly as it was: the same trace digest (every delivery, drop, crash and
member change), the same stats and the same verdict. The values below were
recorded on main at 77f61d6, before the simulator speed-up of issue 12; a
sample across every workload of the CI mix, at 5 to 25 nodes. A change that
alters one of them changes what a seed means, and must say so (and re-pin).
"""

from __future__ import annotations

import hashlib

import pytest

from hivemesh.sim.campaign import ci_scenario, default_options, run_seed, workload_factory

#: seed -> (workload, nodes, trace digest, digest of the sorted stats)
PINNED: dict[int, tuple[str, int, str, str]] = {
    1: ("membership", 15, "b5ab16866e76a8091573e38e1d5fba67", "89afe09189860873"),
    2: ("membership", 6, "b84e6c38e524bdf3b35617aaa4238033", "607464e5b61ae2f4"),
    7: ("membership", 8, "1a7442ad3383d7276c6a89d53a63e4e7", "693e1c9ebd6d8cd1"),
    8: ("membership", 10, "9491c121c1240869a9f56eb8c97b082e", "3742f71b576f490e"),
    44: ("membership", 15, "819c8f646fb2bbba41eadba15ff612e8", "095c526f197737d7"),
    3: ("leases", 9, "a2df8b57adb63575315eb01c94cd7769", "0bac1945943b7962"),
    21: ("leases", 6, "b0b2c943e519a075828ccc1dd1384440", "88f15cd8f880568e"),
    22: ("leases", 5, "f30f323fce22f7874ef0039560ba6a48", "3cac7fe1bfd88c2c"),
    125: ("leases", 25, "07819e3aec6498847e41eb9e5ef2f92f", "67d94ac6e768ef48"),
    4: ("journal", 5, "b47173e75bc3125c707992b5dd20b53a", "b54680de9e5dbed2"),
    25: ("journal", 5, "70a53a3a4291a3b752ce3b57865ec5b8", "ca6f45eba5bc2eea"),
    30: ("journal", 8, "0be9454fe925441358718ba2cbefff56", "6008b66d3367bfc9"),
    94: ("journal", 20, "33f0fad8981ed3aa2c575966cc1b4d41", "3cbcd7b4d117852a"),
    15: ("plan", 5, "40c5e1427510df051d7496995ef35782", "c709924137772fa5"),
    179: ("plan", 5, "952d9292e0468f56eb526e45e8317f6b", "d951c7c000772070"),
    31: ("clock", 8, "9a01f658ea82c4d67e88e37f28c3adf6", "0a9ca95efb1436ad"),
    34: ("clock", 5, "35d172a40f48e1ae9399854461d69a9c", "271a39ee255f9e84"),
    59: ("claims", 5, "e43159f341be010f6ba005ba54044804", "55d54cbf62b1cdb1"),
    81: ("claims", 8, "44e5aca5f314a3aa4d73966e68a3daa5", "ea8fda1baa48b4fd"),
}


@pytest.mark.parametrize("seed", sorted(PINNED))
def test_a_ci_seed_runs_as_pinned(seed: int) -> None:
    workload, nodes, digest, stats = PINNED[seed]
    sc = ci_scenario(seed)
    assert (sc.workload, sc.nodes) == (workload, nodes)
    res = run_seed(seed, default_options(nodes, workload), workload_factory(workload))
    assert res.violations == []
    got = hashlib.blake2b(repr(sorted(res.stats.items())).encode(), digest_size=8).hexdigest()
    assert (res.trace_digest, got) == (digest, stats), res.stats
