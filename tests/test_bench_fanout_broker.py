"""``hivemesh bench fanout --mode nats`` runs end to end (a smoke test; speed is not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_bench_fanout_nats_mode_reports_both_figures_beside_jetstream() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    args = ["bench", "fanout", "--mode", "nats", "--json", "--nodes", "3", "--events", "3000",
            "--late-joins", "2"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=True,
    )
    d = json.loads(out.stdout)
    names = {m["name"]: m for m in d["metrics"]}
    assert set(names) == {"throughput to all nodes", "late-join catch-up"}
    for m in names.values():
        assert m["ours"] > 0 and m["baseline"] > 0 and m["goal"]
    for system in ("hivemesh", "jetstream"):
        tp = d["details"][system]["throughput"]
        assert tp["complete"] and tp["lost"] == 0 and tp["duplicates"] == 0
        assert d["details"][system]["late_join"]["events"] == 3000
    rounds = d["details"]["late_join_rounds"]  # one late joiner of each system per round
    assert len(rounds) == 2 and all(
        r["ours_events_per_s"] > 0 and r["raw_events_per_s"] > 0 for r in rounds
    )
    # the figure is each system's median round (the lower middle of two)
    lj = names["late-join catch-up"]
    assert lj["ours"] == pytest.approx(min(r["ours_events_per_s"] for r in rounds), abs=1)
    assert lj["baseline"] == pytest.approx(min(r["raw_events_per_s"] for r in rounds), abs=1)
