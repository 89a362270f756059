"""``hivemesh bench plan`` runs end to end on a tiny plan (not a timing test)."""

from __future__ import annotations

import argparse

from hivemesh.bench import load


def test_bench_plan_small_runs_without_duplicates() -> None:
    mod = load("plan")
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    args = p.parse_args(["--fanout", "2,3", "--latency-ms", "20", "--runs", "1"])
    res = mod.run(args)
    assert res.details["completed"] is True
    assert res.details["critical_path_calls"] == 7  # 2 levels x (decompose+score) + exec + 2 synth
    wall, dups = res.metrics
    assert wall.baseline == 7 * 20 and wall.ours >= wall.baseline
    assert dups.ours == 0
    assert res.to_json()["metrics"][0]["ratio"] >= 1.0
