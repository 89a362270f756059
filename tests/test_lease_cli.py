"""``hivemesh lease`` end to end, in real processes against real backends."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
URLS = ["redis://127.0.0.1:6379/0", "nats://127.0.0.1:4222/hivemesh_test_leases"]


def cli(*argv: str) -> tuple[int, dict[str, object]]:
    p = subprocess.run(
        [sys.executable, "-m", "hivemesh", "lease", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    return p.returncode, json.loads(p.stdout)  # one JSON document, an error too


@pytest.mark.parametrize("url", URLS)
def test_acquire_show_release_across_processes(url: str) -> None:
    r = f"cli-{uuid.uuid4().hex[:10]}"
    rc, out = cli("--backend", url, "acquire", r, "--ttl-ms", "30000", "--holder", "ci-1")
    assert rc == 0 and out["holder"] == "ci-1"
    token = int(out["fencing_token"])  # type: ignore[call-overload]
    rc, busy = cli("--backend", url, "acquire", r, "--holder", "ci-2")
    assert rc == 5 and busy["error"]["code"] == "lease_unavailable"
    rc, shown = cli("--backend", url, "show", r)
    assert rc == 0 and shown["holder"] == "ci-1" and shown["fencing_token"] == token
    rc, bad = cli("--backend", url, "release", r, "--holder", "ci-2", "--token", str(token))
    assert rc == 5 and bad["error"]["code"] == "lease_lost"
    rc, _ = cli("--backend", url, "release", r, "--holder", "ci-1", "--token", str(token))
    assert rc == 0
    rc, shown = cli("--backend", url, "show", r)
    assert rc == 0 and shown == {"resource": r, "held": False}


def test_cli_bad_input_and_dead_backend() -> None:
    rc, out = cli("--backend", URLS[0], "acquire", "bad name", "--holder", "x")
    assert rc == 2 and out["error"]["code"] == "invalid_argument"
    rc, out = cli("--backend", URLS[0], "acquire", "ok", "--ttl-ms", "1", "--holder", "x")
    assert rc == 2 and out["error"]["code"] == "invalid_argument"
    rc, out = cli("--backend", "ftp://x", "show", "ok")
    assert rc == 2
    rc, out = cli("--backend", "redis://127.0.0.1:1/0", "--timeout-s", "0.5", "show", "ok")
    assert rc == 6 and out["error"]["code"] == "backend_unavailable"


def _voters(n: int, state_dir: Path, ports: list[int] | None = None) -> list[subprocess.Popen[str]]:
    procs = []
    for i in range(n):
        listen = f"127.0.0.1:{ports[i] if ports else 0}"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "hivemesh", "lease", "voter", "--listen", listen,
                 "--state", str(state_dir / f"v{i}.state")],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": SRC},
            )
        )  # fmt: skip
    return procs


def _addresses(procs: list[subprocess.Popen[str]]) -> list[str]:
    out = []
    for p in procs:
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], 15.0)
        assert ready, "voter process did not start"
        out.append(json.loads(p.stdout.readline())["voter"])
    return out


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


def test_quorum_voter_processes_keep_tokens_across_restarts(tmp_path: Path) -> None:
    procs = _voters(3, tmp_path)
    try:
        addrs = _addresses(procs)
        url = "quorum://" + ",".join(addrs)
        r = f"q-{uuid.uuid4().hex[:8]}"
        rc, out = cli("--backend", url, "acquire", r, "--ttl-ms", "3000", "--holder", "h1")
        assert rc == 0
        t1 = int(out["fencing_token"])  # type: ignore[call-overload]
        rc, out = cli("--backend", url, "acquire", r, "--holder", "h2")
        assert rc == 5  # held by someone else
    finally:
        _stop(procs)  # every voter crashes while h1 holds the lease
    ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
    procs = _voters(3, tmp_path, ports)
    try:
        _addresses(procs)
        # restarted voters refuse during their quarantine (the longest TTL they granted)...
        rc, out = cli("--backend", url, "acquire", r, "--holder", "h2")
        assert rc == 5, out
        rc, out = cli("--backend", url, "acquire", r, "--holder", "h2", "--wait-s", "10")
        # ...then grant with a token above every token granted before the crash
        assert rc == 0 and int(out["fencing_token"]) > t1, out  # type: ignore[call-overload]
    finally:
        _stop(procs)
