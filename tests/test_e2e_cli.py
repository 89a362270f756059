"""The CLI against real daemons: every command, --json, exit codes, bad input.

Two `hivemesh up` processes; the commands are run as separate processes
(`python -m hivemesh ...`) exactly as a user would, and their effects are
checked through the other node's control socket, not through their output.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.client.swarm import LocalSwarm, wait_until

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


def cli(*args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hivemesh", *args]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    return subprocess.run(
        cmd,
        env={"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=30,
    )


def cli_json(*args: str, data_dir: Path) -> Any:
    out = cli(*args, "--json", data_dir=data_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("cli")) as s:
        a = s.start("a")
        s.start("b", bootstrap=[a.endpoint])
        wait_until(
            lambda: any(m["state"] == "up" for m in s.status("a")["members"].values()),
            10,
            what="a and b see each other",
        )
        yield s


def test_init_creates_identity_config_and_private_files(tmp_path: Path) -> None:
    d = tmp_path / "n"
    first = cli_json("init", data_dir=d)
    again = cli_json("init", data_dir=d)
    assert first["created"] and not again["created"]
    assert first["address"] == again["address"]
    assert (d / "config.toml").exists()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "node.key").stat().st_mode) == 0o600


def test_commands_without_a_daemon_exit_3_with_a_typed_error(tmp_path: Path) -> None:
    out = cli("status", "--json", data_dir=tmp_path / "none")
    assert out.returncode == 3
    assert json.loads(out.stdout)["error"]["code"] == "daemon_not_running"


def test_control_socket_is_mode_0600(pair: LocalSwarm) -> None:
    sock = pair.nodes["a"].data_dir / "ctl.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600


def test_ctx_set_on_one_node_is_read_on_the_other(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    cli_json("ctx", "set", "plan", '{"steps": 3}', "-c", "t1", data_dir=a.data_dir)
    got = wait_until(
        lambda: b.client.ctx_get("t1", "plan")["found"] and b.client.ctx_get("t1", "plan"),
        10,
        what="plan visible on b",
    )
    assert got["value"] == {"steps": 3}
    whole = cli_json("ctx", "get", "-c", "t1", data_dir=b.data_dir)
    assert whole["kv"] == {"plan": {"steps": 3}}


def test_ctx_lists_and_counters_from_the_cli_replicate(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    appended = cli_json("ctx", "append", "chat", "hi", '{"n": 2}', "-c", "lc", data_dir=a.data_dir)
    assert appended == {"length": 2, "events": 1}
    assert cli_json("ctx", "incr", "tokens", "5", "-c", "lc", data_dir=a.data_dir)["value"] == 5
    on_b = cli_json("ctx", "incr", "tokens", "-2", "-c", "lc", data_dir=b.data_dir)["value"]
    assert on_b in (-2, 3)  # b's value: with a's +5 if it has arrived yet
    wait_until(
        lambda: (
            b.client.ctx_get("lc") == {"list": {"chat": ["hi", {"n": 2}]}, "counter": {"tokens": 3}}
        ),
        10,
        what="the list and both increments on b",
    )


def test_ctx_sets_from_the_cli_replicate(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    added = cli_json("ctx", "add", "who", "ann", "bob", "-c", "room", data_dir=a.data_dir)
    assert added["members"] == ["ann", "bob"] and added["events"] >= 1
    cli_json("ctx", "add", "done", "shop-07", "--grow-only", "-c", "room", data_dir=a.data_dir)
    wait_until(
        lambda: (
            b.client.ctx_members("room", "who") == ["ann", "bob"]
            and b.client.ctx_members("room", "done", grow_only=True) == ["shop-07"]
        ),
        10,
        what="both sets on b",
    )
    removed = cli_json("ctx", "remove", "who", "ann", "-c", "room", data_dir=b.data_dir)
    assert removed["members"] == ["bob"]
    wait_until(lambda: a.client.ctx_members("room", "who") == ["bob"], 10, what="remove on a")
    listed = cli_json("ctx", "members", "who", "-c", "room", data_dir=a.data_dir)
    assert listed == {"members": ["bob"]}
    text = cli("ctx", "members", "done", "--grow-only", "-c", "room", data_dir=b.data_dir)
    assert text.returncode == 0 and text.stdout.split() == ["shop-07"]
    whole = cli_json("ctx", "get", "-c", "room", data_dir=a.data_dir)
    assert whole["orset"] == {"who": ["bob"]} and whole["gset"] == {"done": ["shop-07"]}
    # A grow-only set has no remove; a huge element is a typed error.
    assert cli("ctx", "remove", "done", "x", "--grow-only", data_dir=a.data_dir).returncode == 2
    out = cli("ctx", "add", "who", "x" * 5000, "--json", data_dir=a.data_dir)
    assert out.returncode == 2  # bad input
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    with pytest.raises(hivemesh.HivemeshError):
        a.client.ctx_remove("room", "done", [])


def test_ctx_watch_streams_remote_changes(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    cmd = [sys.executable, "-m", "hivemesh", "ctx", "watch", "-c", "w", "--json"]
    cmd += ["--idle-timeout-s", "10", "--data-dir", str(b.data_dir)]
    proc = subprocess.Popen(
        cmd,
        env={"PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # initial state
        assert first["context"] == "w"
        a.client.ctx_set("w", "k", "v")
        ev = json.loads(proc.stdout.readline())
        assert ev["author"] == a.address and ev["state"]["kv"] == {"k": "v"}
    finally:
        proc.kill()
        proc.wait(10)


def test_name_claim_and_send_message_by_name_lands_in_the_inbox(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    claimed = cli_json("name", "claim", "collector", data_dir=b.data_dir)
    assert claimed["ours"]
    wait_until(lambda: a.client.call("names").get("collector") == b.address, 10, what="name on a")
    sent = cli_json("send-message", "collector", "--data", '{"tokens": 42}', data_dir=a.data_dir)
    assert sent["acked"] and sent["to"] == b.address
    inbox = b.client.inbox()
    assert [m["data"] for m in inbox if m["msg_id"] == sent["msg_id"]] == [{"tokens": 42}]
    assert inbox[-1]["sender"] == a.address
    listed = cli_json("inbox", "--take", data_dir=b.data_dir)
    assert any(m["msg_id"] == sent["msg_id"] for m in listed)
    assert b.client.inbox() == []


def test_inbox_survives_a_restart(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    sent = a.client.send(b.address, {"keep": True})
    pair.kill("b")
    pair.restart("b")
    assert [m["data"] for m in b.client.inbox() if m["msg_id"] == sent["msg_id"]] == [
        {"keep": True}
    ]


def test_ping_peers_and_status(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]
    wait_until(lambda: b.address in a.client.status()["members"], 10, what="b known to a")
    wait_until(
        lambda: any(p["address"] == b.address and p["channel"] for p in a.client.peers()),
        10,
        what="a has a channel to b",
    )
    pong = cli_json("ping", b.address, data_dir=a.data_dir)
    assert pong["address"] == b.address and pong["rtt_ms"] >= 0
    peers = cli_json("peers", data_dir=a.data_dir)
    assert b.address in {p["address"] for p in peers}
    st = cli_json("status", data_dir=a.data_dir)
    assert st["address"] == a.address and "dropped_total" in st
    # human-readable forms work too
    for args in (("status",), ("peers",), ("ctx", "get"), ("inbox",), ("trust", "list")):
        out = cli(*args, data_dir=a.data_dir)
        assert out.returncode == 0 and out.stdout.strip(), (args, out.stderr)


def test_bad_input_gets_typed_errors_and_their_exit_codes(pair: LocalSwarm) -> None:
    a = pair.nodes["a"]
    out = cli("send-message", "nobody-has-this-name", "--data", "1", "--json", data_dir=a.data_dir)
    assert out.returncode == 14  # unknown peer
    assert json.loads(out.stdout)["error"]["code"] == "unknown_peer"
    out = cli("send-message", "x", "--data", "{not json", "--json", data_dir=a.data_dir)
    assert out.returncode == 2  # bad input
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    out = cli("trust", "revoke", "not-an-address", "--json", data_dir=a.data_dir)
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    # the daemon counted the garbage on its control socket and is still fine
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(a.data_dir / "ctl.sock"))
        s.sendall(b"this is not json\n")
        resp = json.loads(s.makefile().readline())
    assert resp["ok"] is False and resp["error"]["code"] == "invalid_argument"
    assert a.client.status()["counters"]["control_bad_request"] >= 1


def test_a_second_daemon_on_the_same_data_dir_is_refused(pair: LocalSwarm) -> None:
    a = pair.nodes["a"]
    out = cli("up", "--listen", "127.0.0.1:0", "--json", data_dir=a.data_dir)
    assert out.returncode == 1
    assert json.loads(out.stdout)["error"]["code"] == "config_error"
    assert a.client.status()["address"] == a.address  # the first one is unharmed


def test_a_port_in_use_is_a_config_error_not_a_traceback(pair: LocalSwarm, tmp_path: Path) -> None:
    a = pair.nodes["a"]
    out = cli("up", "--listen", a.endpoint, "--json", data_dir=tmp_path / "x")
    assert out.returncode == 1, out.stderr
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "config_error" and "cannot listen" in err["message"]
    assert "Traceback" not in out.stderr


def test_a_tampered_journal_is_refused_at_start_with_a_typed_error(tmp_path: Path) -> None:
    import sqlite3

    with LocalSwarm(tmp_path) as s:
        n = s.start("n")
        n.client.ctx_set("default", "k", "v")
        s.kill("n", signal.SIGTERM)
    from store_rows import event_raw, set_event_raw

    db = sqlite3.connect(n.data_dir / "store.db", isolation_level=None)
    author, seq = db.execute(
        "SELECT author, last_seq FROM feeds ORDER BY last_seq DESC LIMIT 1"
    ).fetchone()
    raw = event_raw(db, author, seq)
    set_event_raw(db, author, seq, raw[:-1] + bytes([raw[-1] ^ 1]))  # one flipped bit, newest
    db.close()
    out = cli("up", "--listen", "127.0.0.1:0", "--json", data_dir=n.data_dir)
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "store_corrupt"
    assert "Traceback" not in out.stderr


def test_sigterm_stops_cleanly_and_sigint_too(pair: LocalSwarm) -> None:
    b = pair.nodes["b"]
    pair.kill("b", signal.SIGINT)
    assert b.proc is not None and b.proc.returncode == 0
    assert not (b.data_dir / "ctl.sock").exists()
    pair.restart("b")


def test_offline_trust_edit_applies_at_next_start(tmp_path: Path) -> None:
    d = tmp_path / "n"
    cli_json("init", data_dir=d)
    other = cli_json("init", data_dir=tmp_path / "other")["address"]
    out = cli_json("trust", "revoke", other, data_dir=d)
    assert out == {"offline": True, "revoked": other}
    from hivemesh.trust import TrustStore

    assert TrustStore(d).is_revoked(other)


def test_trust_file_edited_while_running_disconnects_the_peer(pair: LocalSwarm) -> None:
    from hivemesh.trust import TrustStore

    a, b = pair.nodes["a"], pair.nodes["b"]
    wait_until(lambda: b.address in a.client.status()["members"], 10, what="b known")
    wait_until(
        lambda: any(p["address"] == b.address and p["channel"] for p in a.client.peers()),
        10,
        what="a has a channel to b",
    )
    TrustStore(a.data_dir).revoke(b.address, 0)  # as another tool would
    wait_until(
        lambda: not any(p["address"] == b.address and p["channel"] for p in a.client.peers()),
        10,
        what="a notices the edited trust.json and drops b",
    )
    assert a.client.status()["counters"]["disconnected_revoked"] >= 1
