"""Health monitor rules, alert dedup/resolve, webhook delivery (Slack, PagerDuty v2), CLI."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import io
import json
import threading
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from hivemesh.faces.cli import main as cli_main
from hivemesh.telemetry.alerting import HealthService, WebhookNotifier
from hivemesh.telemetry.collector import Collector
from hivemesh.telemetry.health import (
    CallStats,
    HealthMonitor,
    NodeStatus,
    Thresholds,
)
from hivemesh.telemetry.store import MetricsStore

A = "hm" + "a" * 56
B = "hm" + "b" * 56


def test_node_down_fires_once_and_resolves() -> None:
    m = HealthMonitor(Thresholds(heartbeat_timeout_ms=1000))
    up = [NodeStatus(A, "alive", 0), NodeStatus(B, "alive", 0)]
    assert m.evaluate(500, up) == []
    down = [NodeStatus(A, "dead", 0), NodeStatus(B, "alive", 900)]
    (t,) = m.evaluate(1000, down)
    assert (t.status, t.alert.rule, t.alert.key) == ("firing", "node_down", f"node_down:{A}")
    assert m.evaluate(1500, down) == []  # deduplicated while the condition holds
    (r,) = m.evaluate(2000, [NodeStatus(A, "alive", 1990), NodeStatus(B, "alive", 1990)])
    assert (r.status, r.alert.key, r.alert.started_ms) == ("resolved", f"node_down:{A}", 1000)
    assert m.active() == []


def test_no_heartbeat_error_rate_latency_and_backlog_rules() -> None:
    th = Thresholds(heartbeat_timeout_ms=1000, error_rate=0.2, min_calls=10,
                    latency_p99_ms=500, backlog_max=10_000, backlog_growth_evals=3,
                    backlog_growth_min=100)  # fmt: skip
    m = HealthMonitor(th)
    calls = [
        CallStats("tool", "search", 20, 10, 100.0),  # 50% failing
        CallStats("tool", "rare", 3, 3, 10.0),  # too few calls to judge
        CallStats("agent", "planner", 50, 1, 900.0),  # slow
    ]
    ts = m.evaluate(5000, [NodeStatus(A, "suspect", 1000)], calls, {"s1": 50})
    assert sorted(t.alert.key for t in ts) == [
        "error_rate:tool:search",
        "latency:agent:planner",
        f"no_heartbeat:{A}",
    ]
    growing = [m.evaluate(5000 + i, [], [], {"s1": 200 * (i + 1)}) for i in range(4)]
    fired = [t.alert.key for ts in growing for t in ts if t.status == "firing"]
    assert fired == ["backlog:s1"]
    resolved = sorted(t.alert.key for ts in growing for t in ts if t.status == "resolved")
    assert resolved == ["error_rate:tool:search", "latency:agent:planner", f"no_heartbeat:{A}"]
    assert m.evaluate(6000, [], [], {"s1": 20_000}) == []  # over the limit: still the same alert
    assert [a.key for a in m.active()] == ["backlog:s1"]
    (r,) = m.evaluate(7000, [], [], {"s1": 0})
    assert (r.status, r.alert.key) == ("resolved", "backlog:s1")


def test_backlog_from_heartbeats_when_the_collector_is_unreachable() -> None:
    m = HealthMonitor(Thresholds(backlog_max=100))
    (t,) = m.evaluate(0, [NodeStatus(A, "alive", 0, spool_backlog=500)])
    assert t.alert.key == f"backlog:{A}"


def test_resolve_hysteresis() -> None:
    m = HealthMonitor(Thresholds(resolve_after_ms=1000))
    m.evaluate(0, [NodeStatus(A, "dead", 0)])
    assert m.evaluate(100, [NodeStatus(A, "alive", 100)]) == []
    assert m.evaluate(600, [NodeStatus(A, "dead", 100)]) == []  # flapped back: no re-fire
    assert m.evaluate(700, [NodeStatus(A, "alive", 700)]) == []
    (r,) = m.evaluate(1700, [NodeStatus(A, "alive", 1700)])
    assert r.status == "resolved"


class _Receiver:
    """A local webhook endpoint that records JSON bodies; can fail the first N posts."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail_left = fail_first
        self.hits = 0
        recv = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                recv.hits += 1
                if recv.fail_left > 0:
                    recv.fail_left -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                assert self.headers.get("Content-Type") == "application/json"
                recv.bodies.append(json.loads(body))
                self.send_response(202 if self.path == "/pd" else 200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver(fail_first=1)
    yield r
    r.close()


def _check_pagerduty(events: list[dict[str, Any]], key: str) -> None:
    trig, res = events
    assert trig["routing_key"] == res["routing_key"] == "R" * 32
    assert (trig["event_action"], res["event_action"]) == ("trigger", "resolve")
    assert trig["dedup_key"] == res["dedup_key"] == key
    p = trig["payload"]
    assert p["severity"] in {"critical", "error", "warning", "info"}
    assert 0 < len(p["summary"]) <= 1024 and p["source"]
    dt.datetime.fromisoformat(p["timestamp"])
    assert "payload" not in res


def _check_slack(msgs: list[dict[str, Any]], key: str) -> None:
    fire, res = msgs
    assert fire["text"].startswith("FIRING") and res["text"].startswith("RESOLVED")
    for m in msgs:
        (att,) = m["attachments"]
        assert att["color"].startswith("#") and isinstance(att["ts"], int)
        assert {"title": "key", "value": key, "short": False} in att["fields"]


def test_webhooks_deliver_slack_and_pagerduty_with_retry(
    tmp_path: Path, receiver: _Receiver
) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    collector = Collector(store)
    now = [1_000_000]
    members = [NodeStatus(A, "alive", now[0], name="worker-1")]
    slack = WebhookNotifier(f"http://127.0.0.1:{receiver.port}/slack", "slack", backoff_s=0.01)
    pd = WebhookNotifier(
        f"http://127.0.0.1:{receiver.port}/pd", "pagerduty", routing_key="R" * 32,
        backoff_s=0.01,
    )  # fmt: skip
    svc = HealthService(
        collector, HealthMonitor(), [slack, pd], members=lambda: members, clock_ms=lambda: now[0]
    )

    async def main() -> None:
        stop = asyncio.Event()
        runners = [asyncio.create_task(n.run(stop)) for n in (slack, pd)]
        assert await svc.evaluate_once() == []
        members[0] = NodeStatus(A, "dead", now[0], name="worker-1")
        now[0] += 1000
        assert len(await svc.evaluate_once()) == 1
        now[0] += 1000
        assert await svc.evaluate_once() == []  # still down: nothing new is sent
        members[0] = NodeStatus(A, "alive", now[0], name="worker-1")
        now[0] += 1000
        assert len(await svc.evaluate_once()) == 1
        for n in (slack, pd):
            assert await n.wait_idle(10)
        deadline = asyncio.get_running_loop().time() + 10
        while len(receiver.bodies) < 4 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*runners)

    asyncio.run(main())
    key = f"node_down:{A}"
    slack_msgs = [b for b in receiver.bodies if "attachments" in b]
    pd_events = [b for b in receiver.bodies if "event_action" in b]
    _check_slack(slack_msgs, key)
    _check_pagerduty(pd_events, key)
    assert receiver.hits == 5  # one 503 retried
    assert slack.statistics().retries + pd.statistics().retries == 1
    assert slack.statistics().sent == pd.statistics().sent == 2

    # `hivemesh alerts --all` reads the same store after the collector is gone.
    collector.close()
    store.close()
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["alerts", "--all", "--json", "--store", str(tmp_path / "m.duckdb")]) == 0
    (row,) = json.loads(out.getvalue())
    assert (row["key"], row["status"], row["severity"]) == (key, "resolved", "critical")


def test_permanent_webhook_error_is_counted_not_retried(receiver: _Receiver) -> None:
    receiver.fail_left = 0
    n = WebhookNotifier(f"http://127.0.0.1:{receiver.port}/nope", backoff_s=0.01)
    n._post = lambda body: 400  # type: ignore[method-assign]
    m = HealthMonitor()
    (t,) = m.evaluate(0, [NodeStatus(A, "dead", 0)])
    assert asyncio.run(n.deliver(t)) is False
    assert n.statistics().failed == 1 and n.statistics().retries == 0


def test_error_rate_alert_from_stored_metrics(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    collector = Collector(store)
    now = 2_000_000_000_000
    recs = [
        {"seq": i + 1, "ts_ms": now - 1000, "kind": "tool_call", "name": "gen_ai.tool.duration",
         "value": 5.0, "unit": "ms", "agent": "exec-1",
         "attrs": {"gen_ai.tool.name": "browser", **({"error.type": "Timeout"} if i % 2 else {})}}
        for i in range(40)
    ]  # fmt: skip
    assert collector.ingest_now("s1", {"records": recs}, True)["accepted"] == 40
    svc = HealthService(collector, HealthMonitor(), clock_ms=lambda: now)
    keys = sorted(t.alert.key for t in asyncio.run(svc.evaluate_once()))
    assert keys == ["error_rate:agent:exec-1", "error_rate:tool:browser"]
    assert {a["key"] for a in store.alerts(active_only=True)} == set(keys)
    collector.close()
