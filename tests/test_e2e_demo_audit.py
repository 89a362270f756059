"""``hivemesh demo`` (the price audit) end to end through the CLI, ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hivemesh


def test_demo_audits_every_shop_and_leaves_the_report(tmp_path: Path) -> None:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "demo", "--json", "--dir", str(tmp_path)],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "must-not-be-used"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["error"] == ""
    s = doc["summary"]
    assert (s["shops_done"], s["mismatches"], s["escalations"]) == (50, 0, 1)
    assert doc["killed"]["executor"].startswith("executor-") and s["takeovers"] >= 1
    assert s["corrections"].get("switch_route", 0) >= 1 and s["corrections"].get("retry", 0) >= 1
    assert doc["answers"] and doc["answers"][0]["shop"] == "shop-42"
    assert doc["telemetry"]["rows"], doc["telemetry"]
    for path in doc["report"].values():
        assert Path(path).is_file() and Path(path).is_relative_to(tmp_path)
    print(f"demo: {doc['seconds']} s ({doc['audit_seconds']} s audit)")
