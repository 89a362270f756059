"""``hivemesh demo mesh`` end to end, checked independently through the data dirs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hivemesh
from hivemesh.core.event import decode_event
from hivemesh.stores.sqlite import SQLiteStore


def test_demo_exits_0_and_leaves_converged_journals(tmp_path: Path) -> None:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hivemesh",
            "demo",
            "mesh",
            "--json",
            "--nodes",
            "4",
            "--dir",
            str(tmp_path),
        ],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["seconds"] < 60
    # Independent evidence: every node's own store holds the same journal,
    # apart from the membership observations appended while the others were
    # shutting down (member.left), which nobody was left to receive.
    journals = []
    for d in sorted(tmp_path.iterdir()):
        store = SQLiteStore(d / "store.db")
        try:
            ids = {
                ev.id
                for _author, raws, _sigs in store.scan()
                for ev in map(decode_event, raws)
                if not ev.kind.startswith("member.")
            }
        finally:
            store.close()
        journals.append(ids)
    assert len(journals) == 4
    assert all(j == journals[0] for j in journals)
    assert len(journals[0]) > 10
    # The demo swarm is private: every node trusts only whom an invite brought.
    for d in sorted(tmp_path.iterdir()):
        trusted = json.loads((d / "trust.json").read_text())["trusted"]
        assert 1 <= len(trusted) <= 3 and {t["note"] for t in trusted.values()} <= {
            "inviter",
            "invited",
        }
