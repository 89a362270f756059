"""A daemon with ``stun`` set asks a STUN server from its QUIC socket (loopback:
no NAT, so the server sees the node's own UDP port) and ``status`` shows the
answer beside the observed address; without ``stun`` no request is sent. The
server is tests/stun_responder.py, written apart from hivemesh's STUN code.
The NAT case runs in network namespaces (tests/test_nat_stun.py)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, wait_until

pytest.importorskip("aioquic", reason="aioquic is not installed")
RESPONDER = pathlib.Path(__file__).parent / "stun_responder.py"


@pytest.fixture
def responder() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc = subprocess.Popen(
        [sys.executable, str(RESPONDER), "--host", "127.0.0.1", "--port", "0", "--deadline", "60"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        yield proc, int(ready["port"])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def _stun(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status["paths"]["stun"])


def test_a_configured_stun_server_is_asked_from_the_quic_socket(
    tmp_path: pathlib.Path, responder: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, port = responder
    server = f"127.0.0.1:{port}"
    swarm = LocalSwarm(tmp_path, env={"HIVEMESH_UDP": "true", "HIVEMESH_STUN": server})
    try:
        swarm.start("a")
        wait_until(lambda: "mapped" in _stun(swarm.status("a")).get(server, {}), 15, what="STUN")
        st = swarm.status("a")
        mapped = _stun(st)[server]["mapped"]
        assert mapped == f"127.0.0.1:{st['paths']['udp_port']}"  # the QUIC socket's own port
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"saw": mapped}
        assert mapped in st["paths"]["observed"]
        assert st["counters"]["stun_ok"] >= 1
    finally:
        swarm.close()


def test_without_stun_nothing_is_sent(tmp_path: pathlib.Path) -> None:
    swarm = LocalSwarm(tmp_path, env={"HIVEMESH_UDP": "true"})
    try:
        swarm.start("a")
        st = swarm.status("a")
        assert _stun(st) == {}
        assert not any(k.startswith("stun_") for k in st["counters"])
    finally:
        swarm.close()
