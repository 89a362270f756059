"""A fault in a daemon loop, on real node processes: logged, counted, handled
as documented (:mod:`hivemesh.runtime.supervise`), never a half-alive node.

* a hand-edited ``trust.json`` with a syntax error: the node says so in its
  log and its counters, keeps the trust it last read (its invited peer stays
  admitted), and its timers go on (SWIM probes count up, a write made on the
  peer after the bad edit arrives); a fixed file is read again;
* a store failing with I/O errors: writes are refused with a typed
  ``StoreError``, each failed group commit is logged and counted, the node's
  timers and links go on, and once the disk heals everything acknowledged
  reaches the peer; a *bug* in the group commit ends the process with a
  non-zero exit code instead of leaving it half alive;
* an exception inside a frame handler (a bug, or a ``BaseException`` the way
  loro reports a panic): logged and counted, that one link is dropped and
  redialled, the other peers' links stay as they were.

Faults are armed through ``tests/faults/sitecustomize.py`` (a file in the
node's data dir), so the nodes run the shipped code paths.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.errors import StoreError

FAULTS = str(Path(__file__).resolve().parent / "faults")
ENV = {"HM_TEST_FAULTS": "1", "PYTHONPATH": FAULTS}
INVITE = ["--trust-mode", "invite"]


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path, env=ENV) as s:
        yield s


def _counters(node: NodeProc) -> dict[str, int]:
    counters: dict[str, int] = node.client.status()["counters"]
    return counters


def _probes(node: NodeProc) -> int:
    """SWIM probes ``node`` sent: only its timer task sends them."""
    return _counters(node).get("membership_probes", 0)


def _replace(path: Path, text: str) -> None:
    """Write ``path`` as an editor saving it does (rename over it), so the node
    never reads it half written (that would be a second bad version)."""
    tmp = path.with_name(path.name + ".edit")
    tmp.write_text(text)
    os.replace(tmp, path)


def _log(node: NodeProc) -> str:
    return (node.data_dir / "daemon.log").read_text(errors="replace")


def _has(node: NodeProc, key: str, value: object) -> bool:
    got = node.client.ctx_get("default", key)
    return bool(got["found"]) and got["value"] == value


def test_a_malformed_trust_file_keeps_the_last_trust_and_the_timers(swarm: LocalSwarm) -> None:
    a = swarm.start("a", extra_args=INVITE)
    b = swarm.start("b", extra_args=INVITE)
    b.client.call("join", token=a.client.call("invite", ttl_s=600)["token"])
    wait_until(lambda: swarm.member_state("a", "b") == "up", 15, what="b joined a")
    trust_file = a.data_dir / "trust.json"
    good = trust_file.read_text()
    assert b.address in json.loads(good)["trusted"]

    _replace(trust_file, good[: len(good) // 2] + "\n<<< a hand edit gone wrong")
    wait_until(lambda: _counters(a).get("trust_file_invalid") == 1, 10, what="the bad edit seen")
    assert "trust.json: unreadable trust store" in _log(a)
    probes = _probes(a)
    b.client.ctx_set("default", "after-bad-edit", 1)
    wait_until(lambda: _has(a, "after-bad-edit", 1), 10, what="b's write reaches a")
    wait_until(lambda: _probes(a) >= probes + 5, 10, what="a's SWIM timers run")
    status = a.client.status()
    assert status["tasks"]["timer"]["running"] and status["tasks"]["timer"]["failures"] == 0
    assert not any(k.startswith("task_failed") for k in status["counters"])
    assert swarm.member_state("a", "b") == "up"  # the last trust read still admits b
    assert b.address in a.client.call("trust.list")["trusted"]
    assert _counters(a).get("trust_file_invalid") == 1  # once per bad version, not per query

    _replace(trust_file, good)  # fixed: read again, nothing more to report
    a.client.ctx_set("default", "after-fix", 2)
    wait_until(lambda: _has(b, "after-fix", 2), 10, what="a's write reaches b")
    assert _counters(a).get("trust_file_invalid") == 1


def test_a_store_with_io_errors_refuses_writes_and_recovers(swarm: LocalSwarm) -> None:
    a = swarm.start("a")
    b = swarm.start("b", bootstrap=[a.endpoint])
    wait_until(lambda: swarm.member_state("a", "b") == "up", 15, what="a and b connect")
    a.client.ctx_set("default", "before", 0)
    (a.data_dir / "fault.store").write_text("error")

    with pytest.raises(StoreError) as refused:
        a.client.ctx_set("default", "during", 1)
    assert "Input/output error" in str(refused.value)
    b.client.ctx_set("default", "from-b", 2)  # a takes it in, and cannot commit it
    wait_until(lambda: _counters(a).get("group_commit_failed", 0) >= 2, 10, what="commits fail")
    assert "group commit failed" in _log(a)
    probes = _probes(a)
    wait_until(lambda: _probes(a) >= probes + 5, 10, what="timers run")
    assert a.client.status()["tasks"]["timer"]["failures"] == 0

    (a.data_dir / "fault.store").unlink()  # the disk heals: no restart needed
    a.client.ctx_set("default", "after", 3)
    wait_until(lambda: _has(b, "after", 3) and _has(b, "before", 0), 10, what="a's writes on b")
    assert _has(a, "from-b", 2)


def test_a_bug_in_the_group_commit_ends_the_process_non_zero(swarm: LocalSwarm) -> None:
    a = swarm.start("a")
    (a.data_dir / "fault.store").write_text("bug")
    a.client.ctx_set("default", "k", 1)  # durable in the append log; the commit then fails
    proc = a.proc
    assert proc is not None
    try:
        code = proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node kept running half alive:\n{_log(a)[-2000:]}")
    assert code != 0
    assert "the group_commit task failed: RuntimeError: injected bug" in _log(a)
    assert proc.stdout is not None
    error = json.loads(proc.stdout.read().splitlines()[-1])["error"]  # `up --json`'s last line
    assert error["code"] == "task_failed" and "group_commit" in error["message"]


@pytest.mark.parametrize("how", ["bug", "panic"])
def test_an_exception_in_a_frame_handler_drops_one_link_and_it_recovers(
    swarm: LocalSwarm, how: str
) -> None:
    a = swarm.start("a")
    b = swarm.start("b", bootstrap=[a.endpoint])
    c = swarm.start("c", bootstrap=[a.endpoint])
    wait_until(
        lambda: all(swarm.member_state("a", x) == "up" for x in ("b", "c")), 15, what="all up"
    )
    peers = {p["address"]: p["channel"] for p in a.client.peers()}
    c_channel = peers[c.address]["channel_id"]

    (a.data_dir / "fault.frame").write_text(f"{how} {b.address}")
    b.client.ctx_set("default", "from-b", 1)
    wait_until(lambda: not (a.data_dir / "fault.frame").exists(), 10, what="the fault fired")
    wait_until(lambda: _has(a, "from-b", 1), 15, what="b's write reaches a after the redial")
    assert _counters(a).get("reader_crashed") == 1
    assert "injected" in _log(a) and "Traceback" in _log(a)
    c.client.ctx_set("default", "from-c", 2)
    wait_until(lambda: _has(a, "from-c", 2), 10, what="c's write reaches a")
    peers = {p["address"]: p["channel"] for p in a.client.peers()}
    assert peers[c.address]["channel_id"] == c_channel  # c's link was never touched
    wait_until(lambda: swarm.member_state("a", "b") == "up", 10, what="b up again at a")
