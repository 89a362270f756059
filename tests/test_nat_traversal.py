"""NAT traversal through real Linux NATs (hivemesh.netlab): node A behind NAT A,
node B behind NAT B, a public relay C.

* port-preserving NATs: A cannot reach B directly; through C they open an
  end-to-end channel, punch, and then talk directly with no bytes through C;
  B's NAT forgets its mapping mid-run and the link recovers, nothing
  acknowledged lost;
* symmetric NATs (fully-random): punching fails, the link stays relayed
  through C, works, and what C forwards never contains the plaintext.

Needs root; skips with the reason otherwise. Marked ``netns``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import netlabtest
from hivemesh.netlab import Host, Lab
from hivemesh.netlab.probe import udp_echo, udp_reaches

pytest.importorskip("aioquic", reason="aioquic is not installed")
pytestmark = pytest.mark.netns
lab = netlabtest.lab  # the fixture

NODE = str(pathlib.Path(__file__).with_name("nat_node.py"))
PORT = 4433


class Proc:
    """A nat_node.py process in a lab host; its latest status line."""

    def __init__(self, host: Host, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(pathlib.Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")]
        )
        self.proc = host.popen(
            [sys.executable, NODE, *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(os.environ.get("HM_NAT_LOG", os.devnull), "ab"),  # noqa: SIM115
        )
        self.status: dict[str, Any] = {}
        self.final: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            obj = json.loads(line)
            if obj.get("final"):
                self.final = obj
            elif not obj.get("ready"):
                self.status = obj

    def wait(self, pred: Any, what: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.status and pred(self.status):
                return self.status
            if self.proc.poll() is not None:
                pytest.fail(f"{what}: the node exited ({self.proc.returncode})")
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; last status {self.status}")

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=15)
        self._thread.join(timeout=5)
        return self.final


Topology = tuple[Host, Host, Host, Proc, Proc, Proc]


def topology(lab: Lab, *, symmetric: bool, tap: pathlib.Path) -> Topology:
    nat_a = lab.add_nat("nat-a", symmetric=symmetric)
    nat_b = lab.add_nat("nat-b", symmetric=symmetric)
    a, b = lab.add_host("a", behind=nat_a), lab.add_host("b", behind=nat_b)
    c = lab.add_host("c")
    # before: A cannot reach B directly (neither its LAN address nor its NAT's)
    udp_echo(b, 9999)
    assert not udp_reaches(a, b.ip, 9999, timeout_s=0.3)
    assert not udp_reaches(a, nat_b.wan_ip, 9999, timeout_s=0.3)
    relay = Proc(c, "relay", "--name", "c", "--port", str(PORT), "--tap", str(tap))
    relay.wait(lambda s: "relay" in s, "relay up")
    pb = Proc(b, "node", "--name", "b", "--port", str(PORT), "--relay", f"{c.ip}:{PORT}")
    pb.wait(lambda s: "path" in s, "b reserved at the relay")
    pa = Proc(
        a, "node", "--name", "a", "--port", str(PORT), "--relay", f"{c.ip}:{PORT}", "--peer", "b"
    )
    return a, b, c, relay, pa, pb


def test_punched_through_two_nats_then_direct_and_recovers_after_a_mapping_flush(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    _, b, _, relay, pa, pb = topology(lab, symmetric=False, tap=tmp_path / "tap")
    pa.wait(lambda s: s["path"] == "punched" and s["acked"] > 20, "a punched link to b")
    assert pa.status["counters"].get("punch_ok", 0) + pb.status["counters"].get("punch_ok", 0) >= 1
    # relayed first, then nothing more through C once the punched link replaced it
    pa.wait(lambda s: s["paths"] == ["punched"], "the relayed channel retired")
    time.sleep(0.5)
    through_c = relay.status["relay"]["relay_bytes"]
    acked = pa.status["acked"]
    pa.wait(lambda s: s["acked"] > acked + 100, "100 more acks over the punched link")
    assert relay.status["relay"]["relay_bytes"] == through_c
    # B's NAT forgets every mapping: the link recovers (re-punch or relay)
    assert b.behind is not None
    b.behind.flush_conntrack()
    acked = pa.status["acked"]
    pa.wait(lambda s: s["acked"] > acked + 100, "acks after the flush", timeout_s=30)
    final_a, final_b = pa.stop(), pb.stop()
    relay.stop()
    assert set(final_a["acked"]) <= set(final_b["received"])  # nothing acknowledged is lost
    assert len(final_a["acked"]) > 200


def test_symmetric_nats_end_relayed_and_the_relay_reads_nothing(
    lab: Lab, tmp_path: pathlib.Path
) -> None:
    tap = tmp_path / "tap"
    _, _, _, relay, pa, pb = topology(lab, symmetric=True, tap=tap)
    pa.wait(
        lambda s: s["acked"] > 100 and s["counters"].get("punch_failed", 0) >= 1,
        "traffic over the relay and a failed punch",
        timeout_s=30,
    )
    assert pa.status["path"].startswith("relay:")
    assert relay.status["relay"]["relay_bytes"] > 0
    final_a, final_b = pa.stop(), pb.stop()
    relay.stop()
    assert set(final_a["acked"]) <= set(final_b["received"])
    forwarded = tap.read_bytes()
    assert (
        len(forwarded) > 10_000 and b"SECRET-PAYLOAD" not in forwarded and b"SEQ " not in forwarded
    )
