"""Nodes (``hivemesh up``) through real Linux NATs: A behind NAT A, B behind
NAT B, C public with the relay role. A and B cannot reach each other; they
reach C, reserve at it, get a relayed link, punch, and then replicate the
journal and exchange direct messages over the punched link, with C's relay
counters still. ``hivemesh peers`` shows the path. Marked ``netns``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import netlabtest
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import wait_until
from hivemesh.netlab import Host, Lab, Nat

pytest.importorskip("aioquic", reason="aioquic is not installed")
pytestmark = pytest.mark.netns
lab = netlabtest.lab  # the fixture

SRC = str(pathlib.Path(__file__).parents[1] / "src")
PORT = 7420


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    env.update(
        HIVEMESH_TRUST_MODE="open",
        HIVEMESH_UDP="true",
        HIVEMESH_PROBE_INTERVAL_MS="300",
        HIVEMESH_SYNC_INTERVAL_MS="300",
        HIVEMESH_TELEMETRY="false",
    )
    env.update(extra)
    return env


def _up(host: Host, data: pathlib.Path, **env: str) -> dict[str, Any]:
    data.mkdir(mode=0o700)
    log = open(data / "daemon.log", "ab")  # noqa: SIM115 - handed to the child
    argv = [sys.executable, "-m", "hivemesh", "up", "--json", "--data-dir", str(data)]
    argv += ["--listen", f"0.0.0.0:{PORT}"]
    proc = host.popen(argv, env=_env(**env), stdout=subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, (data / "daemon.log").read_text()[-3000:]
    return dict(json.loads(line))


Nodes = tuple[Client, Client, Client, str, str]


def _start(lab: Lab, tmp_path: pathlib.Path, *, symmetric: bool) -> Nodes:
    nat_a = lab.add_nat("nat-a", symmetric=symmetric)
    nat_b = lab.add_nat("nat-b", symmetric=symmetric)
    a, b = lab.add_host("a", behind=nat_a), lab.add_host("b", behind=nat_b)
    c = lab.add_host("c")
    rc = _up(c, tmp_path / "c", HIVEMESH_RELAY_ROLE="true")
    relay = f"{rc['address']}@{c.ip}:{PORT}"
    common = {"HIVEMESH_BOOTSTRAP": f"{c.ip}:{PORT}", "HIVEMESH_RELAYS": relay}
    ra = _up(a, tmp_path / "a", **common)
    rb = _up(b, tmp_path / "b", **common)
    return (
        Client(tmp_path / "a", timeout_s=10),
        Client(tmp_path / "b", timeout_s=10),
        Client(tmp_path / "c", timeout_s=10),
        ra["address"],
        rb["address"],
    )


@pytest.fixture
def nodes(lab: Lab, tmp_path: pathlib.Path) -> Iterator[Nodes]:
    yield _start(lab, tmp_path, symmetric=False)


def _path(client: Client, peer: str) -> str | None:
    for p in client.peers():
        if p["address"] == peer:
            return p.get("path")
    return None


def test_nodes_behind_two_nats_replicate_and_message_over_a_punched_link(
    nodes: tuple[Client, Client, Client, str, str],
) -> None:
    ca, cb, cc, addr_a, addr_b = nodes
    wait_until(lambda: _path(ca, addr_b) == "punched", 60, what="a punched link a-b")
    wait_until(lambda: _path(cb, addr_a) == "punched", 20, what="b sees the punched link")
    punched = [(addr_b, ca), (addr_a, cb)]
    for peer, client in punched:  # a path change is an event (the watcher looks each second)
        wait_until(
            lambda: any(
                e["peer"] == peer and e["to"] == "punched"  # noqa: B023 - used at once
                for e in client.status()["paths"]["path_events"]  # noqa: B023
            ),
            10,
            what="the path event",
        )
    oks = [c.status()["paths"]["traversal"].get("punch_ok", 0) for c in (ca, cb)]
    assert sum(oks) >= 1
    relay = cc.status()["paths"]["relay"]
    relayed_before = relay.get("relay_bytes", 0)
    assert relay.get("relay_circuits_opened", 0) >= 1
    # journal replication and a direct message, over the punched link
    ca.ctx_set("default", "through-nat", "hello from a")
    wait_until(
        lambda: cb.ctx_get("default", "through-nat").get("value") == "hello from a",
        20,
        what="b has a's event",
    )
    cb.send(addr_a, {"msg": "hi a"})
    wait_until(lambda: ca.inbox(), 20, what="a's inbox")
    assert "hi a" in json.dumps(ca.inbox())
    # nothing went through C after the upgrade
    assert cc.status()["paths"]["relay"].get("relay_bytes", 0) == relayed_before
    assert _path(ca, addr_b) == "punched"
    rtts = {p["address"]: p["rtt_ms"] for p in ca.peers()}
    assert rtts[addr_b] is not None and rtts[addr_b] > 0  # punched: QUIC's RTT
    assert all(v is not None for v in rtts.values())  # C over TCP: the kernel's


def test_symmetric_nats_end_relayed_and_the_mesh_works_through_the_relay(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    ca, cb, cc, addr_a, addr_b = _start(lab, tmp_path, symmetric=True)
    wait_until(lambda: (_path(ca, addr_b) or "").startswith("relayed via"), 60, what="relayed")
    wait_until(
        lambda: (
            ca.status()["paths"]["traversal"].get("punch_failed", 0)
            + cb.status()["paths"]["traversal"].get("punch_failed", 0)
            >= 1
        ),
        30,
        what="a failed punch",
    )
    ca.ctx_set("default", "sym", "through the relay")
    wait_until(
        lambda: cb.ctx_get("default", "sym").get("value") == "through the relay",
        20,
        what="b has a's event",
    )
    cb.send(addr_a, {"msg": "relayed hi"})
    wait_until(lambda: "relayed hi" in json.dumps(ca.inbox()), 20, what="a's inbox")
    assert (_path(ca, addr_b) or "").startswith("relayed via")
    assert cc.status()["paths"]["relay"]["relay_bytes"] > 0


def test_a_nat_that_forgets_its_mapping_mid_run_loses_nothing(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    ca, cb, _, _, addr_b = _start(lab, tmp_path, symmetric=False)
    wait_until(lambda: _path(ca, addr_b) == "punched", 60, what="a punched link a-b")
    nat_b = lab.host("nat-b")
    assert isinstance(nat_b, Nat)
    for i in range(40):
        ca.ctx_set("default", f"k{i}", i)  # acknowledged: in a's journal
        if i == 10:
            nat_b.flush_conntrack()
    wait_until(
        lambda: all(cb.ctx_get("default", f"k{i}").get("value") == i for i in range(40)),
        60,
        what="every event a appended, at b",
    )
    wait_until(lambda: _path(ca, addr_b) is not None, 60, what="a link a-b again")


def test_endpoint_records_advertise_udp_and_a_peer_without_tcp_is_reached_over_quic(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    """A and B refuse inbound TCP (a firewall); each reaches C. They learn each
    other's ``udp:`` endpoint record from the journal and link over QUIC."""
    a, b, c = lab.add_host("a"), lab.add_host("b"), lab.add_host("c")
    for h in (a, b):
        h.nft(
            "table ip fw {\n  chain tcp_in {\n    type filter hook input priority 0;\n"
            f"    tcp dport {PORT} drop\n  }}\n}}\n"
        )
    _up(c, tmp_path / "c")
    common = {"HIVEMESH_BOOTSTRAP": f"{c.ip}:{PORT}"}
    ra = _up(a, tmp_path / "a", **common)
    rb = _up(b, tmp_path / "b", **common)
    ca = Client(tmp_path / "a", timeout_s=10)
    cb = Client(tmp_path / "b", timeout_s=10)
    wait_until(lambda: _path(ca, rb["address"]) == "direct UDP", 60, what="a-b over QUIC")
    wait_until(lambda: _path(cb, ra["address"]) == "direct UDP", 20, what="b sees it")
    eps = next(p["endpoints"] for p in ca.peers() if p["address"] == rb["address"])
    assert f"udp:{b.ip}:{PORT}" in eps and f"{b.ip}:{PORT}" in eps
    assert (
        _path(ca, next(p["address"] for p in ca.peers() if p["address"] not in (rb["address"],)))
        == "direct TCP"
    )
    ca.ctx_set("default", "over-udp", 1)
    wait_until(lambda: cb.ctx_get("default", "over-udp").get("value") == 1, 20, what="replicated")
