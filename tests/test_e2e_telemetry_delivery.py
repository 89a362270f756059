"""Telemetry sent by hand, over the real mesh: stored, or answered with the reason.

Real ``hivemesh up`` processes (:class:`LocalSwarm`) and the real CLI as a
subprocess. A message to the name ``metrics-collector`` is either turned into
telemetry (the flat shapes people write by hand are mapped onto the GenAI
names) and reported "delivered" only once the collector stored it, or it is
refused with the reason: a non-zero exit and the reason on stderr.
``hivemesh metrics record`` records a metric on a node. A node that holds the
name without running a collector is reported as exactly that (not a
timeout); a sender's shutdown stays prompt and its spooled records stay
spooled until a real collector takes the name. The collector mirrors into
the InfluxDB on 127.0.0.1:8086, into a database that does not exist yet.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until

ENV = {
    "HIVEMESH_TELEMETRY_TIMEOUT_S": "5",
    "HIVEMESH_TELEMETRY_MAX_BACKOFF_S": "0.3",
    "HIVEMESH_TELEMETRY_HEARTBEAT_S": "1",
    "HIVEMESH_HEALTH_INTERVAL_S": "0.3",
    "HIVEMESH_METRICS_SENDERS": "sender-1",
}
WAIT_S = 20.0
INFLUX = "http://127.0.0.1:8086"
SEED = {"agent_id": "agent-7", "tokens_used": 1200, "duration_ms": 3400, "model": "gpt-4o-mini",
        "success": True}  # fmt: skip


def cli(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


def send(node: NodeProc, data: Any, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("send-message", "metrics-collector", "--data", json.dumps(data),
               "--data-dir", str(node.data_dir), *extra)  # fmt: skip


def sql(c: NodeProc, query: str) -> list[list[Any]]:
    rows: list[list[Any]] = c.client.call("metrics", what="query", sql=query)["rows"]
    return rows


def influx(q: str, db: str = "") -> list[list[Any]]:
    params = {"q": q, **({"db": db} if db else {})}
    req = urllib.request.Request(f"{INFLUX}/query", data=urllib.parse.urlencode(params).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        res = json.loads(r.read())["results"][0]
    return [v for s in res.get("series") or [] for v in s.get("values", [])]


@pytest.fixture(scope="module")
def influx_db() -> Iterator[str]:
    db = f"hm_e2e_{uuid.uuid4().hex[:12]}"
    assert [db] not in influx("SHOW DATABASES")  # fails loudly if InfluxDB is not running
    try:
        yield db
    finally:
        influx(f'DROP DATABASE "{db}"')


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, influx_db: str) -> Iterator[LocalSwarm]:
    root: Path = tmp_path_factory.mktemp("delivery")
    with LocalSwarm(root, env=ENV) as s:
        sink = f"influxdb:url={INFLUX},database={influx_db}"
        c = s.start("c", extra_args=["--collector", "--sink", sink])
        s1 = s.start("s1", bootstrap=[c.endpoint], extra_args=["--name", "sender-1"])
        s.start("out", bootstrap=[c.endpoint], extra_args=["--name", "outsider"])
        wait_until(lambda: s1.client.call("names").get("metrics-collector") == c.address,
                   WAIT_S, what="the collector's name")  # fmt: skip
        yield s


def test_seed_flat_message_becomes_telemetry(swarm: LocalSwarm) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    out = send(s1, SEED)
    assert out.returncode == 0, out.stderr
    assert "stored" in out.stdout
    # "delivered" means stored: the record is in the collector's store now, no waiting
    top = json.loads(cli("metrics", "top", "--by", "agent", "--data-dir", str(c.data_dir),
                         "--json").stdout)  # fmt: skip
    (row,) = [r for r in top if r["agent"] == "agent-7"]
    assert (row["records"], row["failures"], row["p50_ms"], row["tokens"]) == (1, 0, 3400, 1200)
    ((kind, name, model, unit),) = sql(
        c, "SELECT kind, name, model, unit FROM metrics WHERE agent = 'agent-7'"
    )
    assert (kind, name, model, unit) == (
        "llm_call",
        "gen_ai.client.operation.duration",
        "gpt-4o-mini",
        "ms",
    )
    assert c.client.inbox() == []  # not a plain message left in the collector's inbox
    # a batch sent to the collector's address (not its name) is acked once the collector
    # is done with it: stored by the time "delivered" is reported
    batch = {"type": "metrics", "records": [{"name": "by.address", "value": 1, "id": "a1"}]}
    out = cli("send-message", c.address, "--data", json.dumps(batch),
              "--data-dir", str(s1.data_dir))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sql(c, "SELECT count(*) FROM metrics WHERE name = 'by.address'") == [[1]]


def test_more_flat_shapes_map_onto_genai_names(swarm: LocalSwarm) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    shapes = [
        {"agent": "agent-8", "tool_name": "search", "latency_ms": 12.5, "status": "error",
         "error": "Timeout"},
        {"agent_id": "agent-8", "model": "m", "prompt_tokens": 10, "completion_tokens": 3,
         "duration_s": 0.25, "cost_usd": 0.002},
        [{"agent": "agent-8", "task_id": "t1", "duration_ms": 99}],
    ]  # fmt: skip
    for shape in shapes:
        out = send(s1, shape, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
    rows = sql(c, "SELECT kind, name, value, tool, error_type, input_tokens, output_tokens, attrs"
                  " FROM metrics WHERE agent = 'agent-8' ORDER BY kind")  # fmt: skip
    assert rows == [
        ["llm_call", "gen_ai.client.operation.duration", 250.0, None, None, 10, 3,
         '{"cost_usd":0.002}'],
        ["task", "hivemesh.task.duration", 99.0, None, None, None, None,
         '{"hivemesh.task.id":"t1"}'],
        ["tool_call", "gen_ai.tool.duration", 12.5, "search", "Timeout", None, None, ""],
    ]  # fmt: skip


def test_unmappable_or_refused_message_is_answered_with_the_reason(swarm: LocalSwarm) -> None:
    c, s1, outsider = swarm.nodes["c"], swarm.nodes["s1"], swarm.nodes["out"]
    cases = [
        (s1, {"agent_id": "agent-9", "mood": "great"}, "no measurement"),
        (s1, {"agent_id": "agent-9", "tokens_used": "lots"}, "tokens_used"),
        (s1, {"type": "metrics", "records": [{"name": "e.x", "value": 1, "zz": 2}]},
         "unknown_field"),
        (s1, "just text", "malformed"),
        # trusted by the mesh, not by the collector's metrics_senders: refused, not "delivered"
        (outsider, SEED, "untrusted_author"),
    ]  # fmt: skip
    for node, data, reason in cases:
        out = send(node, data)
        assert out.returncode != 0, (data, out.stdout)
        assert reason in out.stderr, (data, out.stderr)
        assert "delivered" not in out.stdout
    assert sql(c, "SELECT count(*) FROM metrics WHERE agent = 'agent-9'") == [[0]]
    assert sql(c, f"SELECT count(*) FROM metrics WHERE sender = '{outsider.address}'") == [[0]]
    assert c.client.inbox() == []


def test_metrics_record_cli_records_and_waits_until_stored(swarm: LocalSwarm) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    out = cli(
        *("metrics", "record", "gen_ai.client.operation.duration", "812.5", "--kind", "llm_call"),
        *("--unit", "ms", "--agent", "planner-3", "--model", "gpt-x", "--input-tokens", "120"),
        *("--output-tokens", "7", "--attr", "temperature=0.2", "--attr", "stream=true", "--wait"),
        *("--data-dir", str(s1.data_dir), "--json"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["recorded"] == 1 and got["stored"] is True
    rows = sql(c, "SELECT kind, value, unit, model, input_tokens, output_tokens, attrs, seq"
                  " FROM metrics WHERE agent = 'planner-3'")  # fmt: skip
    assert rows == [["llm_call", 812.5, "ms", "gpt-x", 120, 7,
                     '{"stream":true,"temperature":0.2}', got["last_seq"]]]  # fmt: skip
    bad = cli("metrics", "record", "x.y", "1", "--attr", "novalue", "--data-dir", str(s1.data_dir))
    assert bad.returncode != 0 and "KEY=VALUE" in bad.stderr


def test_collector_mirrors_into_an_influxdb_database_created_on_first_write(
    swarm: LocalSwarm, influx_db: str
) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    s1.client.call("metrics.record", name="influx.e2e", value=2.0, count=200)
    want = 200

    def mirrored() -> int:
        rows = influx('SELECT count("value") FROM "influx.e2e"', influx_db)
        return int(rows[0][1]) if rows else 0

    wait_until(lambda: mirrored() >= want, WAIT_S, what="rows in InfluxDB")
    assert mirrored() == want
    (stored,) = sql(c, "SELECT count(*) FROM metrics WHERE name = 'influx.e2e'")
    assert stored == [want]
    st = c.client.status()["telemetry"]["collector"]["sink_stats"]["InfluxDbSink"]
    assert (st["failed_tables"], st["dropped_tables"]) == (0, 0), st


# -- a node that holds the name without running a collector --------------------------------


def spooled(node: NodeProc, name: str) -> int:
    db = sqlite3.connect(f"file:{node.data_dir / 'telemetry-spool.sqlite3'}?mode=ro", uri=True)
    try:
        recs = [msgpack.unpackb(r) for (r,) in db.execute("SELECT rec FROM spool")]
    finally:
        db.close()
    return sum(1 for r in recs if r.get("name") == name)


def test_name_held_by_a_node_without_a_collector(tmp_path: Path) -> None:
    # A 30 s delivery timeout: waiting for one (main's behaviour) cannot pass for an answer.
    env = {**ENV, "HIVEMESH_METRICS_SENDERS": "", "HIVEMESH_TELEMETRY_TIMEOUT_S": "30"}
    with LocalSwarm(tmp_path, env=env) as s:
        q = s.start("q", extra_args=["--name", "metrics-collector"])  # no --collector
        s1 = s.start("s1", bootstrap=[q.endpoint], extra_args=["--name", "sender-1"])
        wait_until(lambda: s1.client.call("names").get("metrics-collector") == q.address,
                   WAIT_S, what="the name")  # fmt: skip
        s1.client.call("metrics.record", name="squat", value=1.0, count=20)

        def reported() -> dict[str, Any] | None:
            sender: dict[str, Any] = s1.client.status()["telemetry"]["sender"]
            return sender if sender.get("last_error_code") == "no_handler" else None

        sender = wait_until(reported, WAIT_S, what="the sender reports no collector")
        assert "does not run a collector" in sender["last_error"]
        assert q.address[:12] in sender["last_error"]

        out = send(s1, SEED, "--timeout-s", "60")
        assert out.returncode != 0, out.stdout
        assert "does not run a collector" in out.stderr and "[no_handler]" in out.stderr
        assert q.client.inbox() == []

        t0 = time.monotonic()
        assert s1.proc is not None
        s1.proc.send_signal(signal.SIGTERM)
        s1.proc.wait(60)
        shutdown_s = time.monotonic() - t0
        print(f"sender shutdown took {shutdown_s:.2f}s")
        assert shutdown_s < 6.0, f"sender shutdown took {shutdown_s:.1f}s"  # main: >= 30 s
        assert spooled(s1, "squat") == 20  # still spooled, nothing lost

        # the holder starts running a collector: the spooled records are delivered
        s.kill("q", signal.SIGTERM)
        q.extra_args.append("--collector")
        s.restart("q")
        s.restart("s1")

        def stored() -> int:
            rows = sql(q, f"SELECT count(DISTINCT seq) FROM metrics WHERE name = 'squat'"
                          f" AND sender = '{s1.address}'")  # fmt: skip
            return int(rows[0][0])

        wait_until(lambda: stored() >= 20, WAIT_S, what="spooled records delivered")
        assert stored() == 20


# -- plain direct messages: "delivered" means in the durable inbox ---------------------------


def test_plain_message_is_delivered_only_once_in_the_durable_inbox(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path, env={**ENV, "HIVEMESH_INBOX_MAX": "2"}) as s:
        r = s.start("r", extra_args=["--name", "receiver"])
        a = s.start("a", bootstrap=[r.endpoint])
        wait_until(lambda: a.client.call("names").get("receiver") == r.address,
                   WAIT_S, what="the name")  # fmt: skip
        delivered = []
        for i in range(4):  # the durable inbox holds 2: the rest must not be "delivered"
            out = cli("send-message", "receiver", "--data", json.dumps({"n": i}),
                      "--timeout-s", "2", "--data-dir", str(a.data_dir))  # fmt: skip
            if out.returncode == 0:
                delivered.append(i)
            else:
                assert "deadline_exceeded" in out.stderr, out.stderr
        s.kill("r")  # kill -9: only what is in inbox.db survives
        s.restart("r")
        kept = [m["data"]["n"] for m in r.client.inbox()]
        assert kept == delivered == [0, 1]
        # backpressure, not loss: once the inbox is read, the next message is delivered
        r.client.inbox(remove=True)
        out = cli("send-message", "receiver", "--data", '{"n": 9}', "--data-dir", str(a.data_dir))
        assert out.returncode == 0, out.stderr
        s.kill("r")
        s.restart("r")
        assert [m["data"]["n"] for m in r.client.inbox()] == [9]
