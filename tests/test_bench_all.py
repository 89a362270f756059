"""``hivemesh bench all``: every benchmark in its own process, one table,
and the generated block of BENCHMARKS.md rewritten without touching the
rest of the file. ``--quick`` keeps it to seconds (a few fast benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hivemesh
from hivemesh import bench
from hivemesh.bench.suite import BEGIN, END, QUICK

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


def test_every_benchmark_has_a_quick_workload_and_all_is_not_a_benchmark() -> None:
    assert set(QUICK) == set(bench.available())
    assert "suite" not in bench.available() and "all" not in bench.available()


def test_bench_all_quick_prints_one_table_and_regenerates_the_summary(tmp_path: Path) -> None:
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nIntro paragraph.\n\n## Notes per benchmark\n\nkeep me\n")
    cmd = [sys.executable, "-m", "hivemesh", "bench", "all", "--quick", "--only", "heal,views"]
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run(
        [*cmd, "--json", "--update-md", str(md)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["quick"] is True and doc["wall_s"] > 0
    rows = doc["rows"]
    assert {r["bench"] for r in rows} == {"heal", "views"}
    heal = next(r for r in rows if r["measure"] == "bytes sent during heal")
    assert heal["ratio"].endswith("x") and heal["met"] in ("met", "MISSED")
    assert all(r["load"] >= 0 for r in rows)

    text = md.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "keep me" in text and "Intro paragraph." in text
    assert "| heal | bytes sent during heal |" in text
    # a second run replaces the block, never stacks another
    again = subprocess.run(
        [*cmd[:-1], "heal", "--update-md", str(md)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert again.returncode == 0, again.stderr
    assert "measure" in again.stdout and "hivemesh" in again.stdout  # the table's head
    text = md.read_text()
    assert text.count(BEGIN) == 1 and "| views |" not in text and "keep me" in text


def test_a_failing_benchmark_is_a_row_not_the_end_of_the_suite() -> None:
    from hivemesh.bench.suite import run_one

    rows = run_one("heal", ["--nodes", "not-a-number"], 60)
    assert len(rows) == 1 and rows[0].met.startswith("error")
