"""A node (``hivemesh up``) behind a real Linux NAT asks a STUN server on the
public side (tests/stun_responder.py, a separate minimal RFC 5389 responder)
for its address: ``hivemesh status`` shows the NAT's public address and port
beside the observed address, which the answer voted for. The responder also
sends a malformed datagram and an answer to another transaction first: both
are counted and the answer still lands. A second configured server that
does not answer times out (counted, shown) and changes nothing else: STUN
is never required. Marked ``netns``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import netlabtest
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import wait_until
from hivemesh.netlab import Host, Lab, Nat

pytest.importorskip("aioquic", reason="aioquic is not installed")
pytestmark = pytest.mark.netns
lab = netlabtest.lab  # the fixture

TESTS = pathlib.Path(__file__).parent
SRC = str(TESTS.parent / "src")
PORT, STUN_PORT = 7420, 3478


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    env.update(HIVEMESH_TRUST_MODE="open", HIVEMESH_TELEMETRY="false", **extra)
    return env


def _line(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the process ended before its first line"
    return dict(json.loads(line))


def _up(host: Host, data: pathlib.Path, **env: str) -> pathlib.Path:
    """``hivemesh up`` with UDP in ``host``; its data dir once it is ready."""
    data.mkdir(mode=0o700)
    log = open(data / "daemon.log", "ab")  # noqa: SIM115 - handed to the child
    argv = [sys.executable, "-m", "hivemesh", "up", "--json", "--data-dir", str(data)]
    node = host.popen(
        [*argv, "--listen", f"0.0.0.0:{PORT}"],
        env=_env(HIVEMESH_UDP="true", **env),
        stdout=subprocess.PIPE,
        stderr=log,
    )
    assert _line(node).get("address"), (data / "daemon.log").read_text()[-3000:]
    return data


def _responder(host: Host, *args: str) -> subprocess.Popen[bytes]:
    proc = host.popen(
        [sys.executable, str(TESTS / "stun_responder.py"), "--port", str(STUN_PORT), *args],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert _line(proc) == {"ready": True, "port": STUN_PORT}
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def _status_text(data: pathlib.Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", "status", "--data-dir", str(data)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout


def test_a_node_behind_a_nat_learns_its_public_address_from_stun(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    nat = lab.add_nat("nat-a")
    a = lab.add_host("a", behind=nat)
    s = lab.add_host("s")  # public side
    responder = _responder(s, "--noise")
    try:
        server, silent = f"{s.ip}:{STUN_PORT}", f"{s.ip}:{STUN_PORT + 1}"
        data = _up(a, tmp_path / "a", HIVEMESH_STUN=f"{server},{silent}")
        client = Client(data, timeout_s=10)

        def stun_row(which: str = server) -> dict[str, Any]:
            return dict(client.status()["paths"]["stun"].get(which, {}))

        wait_until(lambda: "mapped" in stun_row(), 20, what="a STUN answer")
        mapped = stun_row()["mapped"]
        wait_until(lambda: "error" in stun_row(silent), 20, what="the silent server's timeout")
        assert "no answer" in stun_row(silent)["error"]
        ip, _, port = mapped.rpartition(":")
        assert ip == nat.wan_ip != a.ip  # the NAT's public address, not the node's own
        assert _line(responder) == {"saw": mapped}  # and the port the server saw
        assert isinstance(nat, Nat)
        assert f"dst={nat.wan_ip} sport={STUN_PORT} dport={port}" in nat.mappings()
        status = client.status()
        assert status["paths"]["observed"][0] == mapped  # one vote, believed at quorum 1
        counters = status["counters"]
        assert counters["stun_ok"] >= 1 and counters["stun_requests_sent"] >= 1
        assert counters["stun_malformed"] >= 1 and counters["stun_mismatch"] >= 1
        assert counters["stun_timeout"] >= 1
        assert status["paths"]["symmetric"] is False
        text = _status_text(data)
        assert f"observed: {mapped}" in text
        assert f"stun      {server} sees us as {mapped}" in text
        assert f"stun      {silent}: no answer" in text
    finally:
        _stop(responder)


def test_stun_and_a_relay_reveal_a_symmetric_nat(lab: Lab, tmp_path: pathlib.Path) -> None:
    """Behind a symmetric NAT the STUN server and the relay see different
    ports for one IP: two votes that disagree, and status says so."""
    nat = lab.add_nat("nat-a", symmetric=True)
    a, c, s = lab.add_host("a", behind=nat), lab.add_host("c"), lab.add_host("s")
    responder = _responder(s)
    try:
        relay = _up(c, tmp_path / "c", HIVEMESH_RELAY_ROLE="true")
        relay_address = Client(relay, timeout_s=10).status()["address"]
        data = _up(
            a,
            tmp_path / "a",
            HIVEMESH_STUN=f"{s.ip}:{STUN_PORT}",
            HIVEMESH_RELAYS=f"{relay_address}@{c.ip}:{PORT}",
        )
        client = Client(data, timeout_s=10)
        wait_until(lambda: len(client.status()["paths"]["observed"]) >= 2, 20, what="two votes")
        paths = client.status()["paths"]
        ips = {o.rpartition(":")[0] for o in paths["observed"]}
        assert ips == {nat.wan_ip} and paths["symmetric"] is True
        assert "(symmetric NAT)" in _status_text(data)
    finally:
        _stop(responder)
