"""``hivemesh lease`` end to end, in real processes against real backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
URLS = ["redis://127.0.0.1:6379/0", "nats://127.0.0.1:4222/hivemesh_test_leases"]


def cli(*argv: str) -> tuple[int, dict[str, object]]:
    p = subprocess.run(
        [sys.executable, "-m", "hivemesh", "lease", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    text = p.stdout if p.returncode == 0 else p.stderr.strip().splitlines()[-1]
    return p.returncode, json.loads(text)


@pytest.mark.parametrize("url", URLS)
def test_acquire_show_release_across_processes(url: str) -> None:
    r = f"cli-{uuid.uuid4().hex[:10]}"
    rc, out = cli("--backend", url, "acquire", r, "--ttl-ms", "30000", "--holder", "ci-1")
    assert rc == 0 and out["holder"] == "ci-1"
    token = int(out["fencing_token"])  # type: ignore[call-overload]
    rc, busy = cli("--backend", url, "acquire", r, "--holder", "ci-2")
    assert rc == 3 and busy["error"] == "lease_unavailable"
    rc, shown = cli("--backend", url, "show", r)
    assert rc == 0 and shown["holder"] == "ci-1" and shown["fencing_token"] == token
    rc, bad = cli("--backend", url, "release", r, "--holder", "ci-2", "--token", str(token))
    assert rc == 3 and bad["error"] == "lease_lost"
    rc, _ = cli("--backend", url, "release", r, "--holder", "ci-1", "--token", str(token))
    assert rc == 0
    rc, shown = cli("--backend", url, "show", r)
    assert rc == 0 and shown == {"resource": r, "held": False}


def test_cli_bad_input_and_dead_backend() -> None:
    rc, out = cli("--backend", URLS[0], "acquire", "bad name", "--holder", "x")
    assert rc == 2 and out["error"] == "invalid_argument"
    rc, out = cli("--backend", URLS[0], "acquire", "ok", "--ttl-ms", "1", "--holder", "x")
    assert rc == 2 and out["error"] == "invalid_argument"
    rc, out = cli("--backend", "ftp://x", "show", "ok")
    assert rc == 2
    rc, out = cli("--backend", "redis://127.0.0.1:1/0", "--timeout-s", "0.5", "show", "ok")
    assert rc == 4 and out["error"] == "backend_unavailable"
