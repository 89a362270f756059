"""One end-to-end suite in three modes: peer to peer, NATS JetStream, Redis Streams.

Real ``hivemesh up`` / ``hivemesh agent`` processes (:class:`LocalSwarm`)
against the real nats-server (127.0.0.1:4222, JetStream) and Redis
(127.0.0.1:6379) that ``scripts/services.sh`` starts. Every broker-mode run
uses a swarm name of its own, so runs never see each other's streams.
The same checks pass in every mode: context replication, a late joiner, a
kill -9 and restart that loses nothing, leases (a checked history: the
embedded quorum peer to peer, the broker's own lease engine in broker mode),
telemetry delivered to the collector by name, the planner to a final answer,
and the main demo. Run it alone with ``pytest -m broker``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from broker_cleanup import drop_swarm
from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.leases import open_backend
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.meshplan import TERMINAL, started_swarm
from hivemesh.verify import check_history
from lease_workload import run_workload
from llm_server import ScriptedServer

pytestmark = pytest.mark.broker

MODES = ["p2p", "nats", "redis"]
BROKERS = {"nats": "nats://127.0.0.1:4222", "redis": "redis://127.0.0.1:6379/0"}
SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
TELEMETRY = {
    "HIVEMESH_TELEMETRY_TIMEOUT_S": "5",
    "HIVEMESH_TELEMETRY_MAX_BACKOFF_S": "0.3",
}


_MADE: list[str] = []  # swarms this module made on the shared servers


def mesh_url(mode: str) -> str | None:
    """A fresh swarm on the mode's broker (None peer to peer); dropped from
    the server when the module is done (tests/broker_cleanup.py)."""
    if mode == "p2p":
        return None
    url = f"{BROKERS[mode]}?swarm=e2e{uuid.uuid4().hex[:10]}"
    _MADE.append(url)
    return url


@pytest.fixture(scope="module", autouse=True)
def _drop_swarms() -> Iterator[None]:
    yield
    while _MADE:
        drop_swarm(_MADE.pop())


def env_for(mode: str) -> dict[str, str]:
    url = mesh_url(mode)
    return {} if url is None else {"HIVEMESH_MESH": url}


def cli(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    full.update(env or {}, PYTHONPATH=SRC)
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class Mode:
    """One mode's swarm: a, b, and the collector c (d joins late)."""

    def __init__(self, name: str, swarm: LocalSwarm) -> None:
        self.name = name
        self.swarm = swarm

    def start(self, label: str, **kw: Any) -> NodeProc:
        if self.name == "p2p" and self.swarm.nodes:
            first = next(iter(self.swarm.nodes.values()))
            kw.setdefault("bootstrap", [first.endpoint])
        return self.swarm.start(label, **kw)


@pytest.fixture(scope="module", params=MODES)
def mode(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mode]:
    name: str = request.param
    root: Path = tmp_path_factory.mktemp(f"broker-{name}")
    with LocalSwarm(root, env={**env_for(name), **TELEMETRY}) as swarm:
        m = Mode(name, swarm)
        c = m.start("c", extra_args=["--collector"])
        a, b = m.start("a"), m.start("b")
        addrs = {a.address, b.address, c.address}
        for n in (a, b, c):
            wait_until(
                lambda n=n: (
                    {x for x, s in n.client.status()["members"].items() if s["state"] == "up"}
                    >= addrs - {n.address}
                ),
                20,
                what=f"{n.label} sees every member up",
            )
        yield m


def up_members(n: NodeProc) -> set[str]:
    return {x for x, s in n.client.status()["members"].items() if s["state"] == "up"}


def found(node: NodeProc, key: str, ctx: str = "default") -> Any:
    got = node.client.ctx_get(ctx, key)
    return got["value"] if got.get("found") else None


def test_context_replicates_late_joiner_and_restart_lose_nothing(mode: Mode) -> None:
    s = mode.swarm
    a, b = s.nodes["a"], s.nodes["b"]
    for i in range(20):
        a.client.ctx_set("shared", f"k{i}", i)
    b.client.ctx_set("shared", "from-b", "hello")
    wait_until(lambda: found(b, "k19", "shared") == 19, 15, what="a's writes on b")
    wait_until(lambda: found(a, "from-b", "shared") == "hello", 15, what="b's write on a")
    d = mode.start("d")  # a late joiner gets the whole journal
    wait_until(
        lambda: found(d, "k19", "shared") == 19 and found(d, "from-b", "shared") == "hello",
        20,
        what="the late joiner catches up",
    )
    s.kill("b")  # kill -9; writes go on meanwhile
    for i in range(20, 30):
        a.client.ctx_set("shared", f"k{i}", i)
    s.restart("b")
    wait_until(lambda: found(b, "k29", "shared") == 29, 20, what="the restarted node catches up")
    vv = a.client.status()["journal"]["version_vector"]
    for n in (b, d):
        wait_until(
            lambda n=n: all(n.client.status()["journal"]["version_vector"].get(x, 0) >= seq
                            for x, seq in vv.items()),
            20,
            what=f"{n.label} holds everything a held",
        )  # fmt: skip
    counters = d.client.status()["counters"]
    assert counters.get("bad_signature", 0) == 0 and counters.get("broker_misrouted", 0) == 0


def test_direct_message_by_name_is_acknowledged(mode: Mode) -> None:
    a, b = mode.swarm.nodes["a"], mode.swarm.nodes["b"]
    b.client.claim_name(f"worker-{mode.name}")
    wait_until(
        lambda: a.client.call("names").get(f"worker-{mode.name}") == b.address, 15, what="name"
    )
    out = a.client.send(f"worker-{mode.name}", {"job": 1})
    assert out["acked"]
    wait_until(lambda: any(m["data"] == {"job": 1} for m in b.client.inbox()), 10, what="inbox")


def test_a_stopped_node_is_seen_as_left_not_down(mode: Mode) -> None:
    s = mode.swarm
    a = s.nodes["a"]
    e = mode.start("e")
    wait_until(lambda: e.address in up_members(a), 20, what="e is up on a")
    # "left" goes to the members the leaver sees live: a must be one of them
    # (a fresh node may not have learnt of a yet; then only gossip tells a)
    wait_until(lambda: a.address in up_members(e), 20, what="a is up on e")
    s.kill("e", signal.SIGTERM)  # a clean stop announces "left" before it goes

    def state() -> str | None:
        m = a.client.status()["members"].get(e.address)
        return None if m is None else str(m["state"])

    wait_until(lambda: state() in ("left", "down"), 20, what="a notices e is gone")
    assert state() == "left"


def test_leases_pass_the_checker(mode: Mode) -> None:
    urls = [f"mesh://{mode.swarm.nodes[x].data_dir.resolve()}" for x in ("a", "b")]
    picks = iter(range(1_000_000))

    def backend() -> Any:
        return open_backend(urls[next(picks) % 2])

    async def main() -> Any:
        async with asyncio.timeout(60):
            return await run_workload(backend, seed=17, clients=4, duration_s=2.5)

    res = asyncio.run(main())
    violations = check_history(res.ops, slack_ms=150, replicated=mode.name == "p2p")
    assert violations == [], violations[:5]
    oks = sum(1 for o in res.ops if o.kind == "acquire" and o.outcome == "ok")
    assert oks >= 10 and res.stale_tokens == 0
    where = mode.swarm.nodes["a"].client.call("lease.show", resource="e2e-none")
    assert where is None or isinstance(where, dict)


def test_telemetry_reaches_the_collector_by_name(mode: Mode) -> None:
    c, a = mode.swarm.nodes["c"], mode.swarm.nodes["a"]
    wait_until(
        lambda: a.client.call("names").get("metrics-collector") == c.address, 20, what="name"
    )
    agent = f"agent-{mode.name}-{uuid.uuid4().hex[:6]}"
    seed = {"agent_id": agent, "tokens_used": 7, "duration_ms": 30, "model": "m", "success": True}
    out = cli(
        "send-message", "metrics-collector", "--data", json.dumps(seed), "--data-dir",
        str(a.data_dir),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = c.client.call(
        "metrics", what="query", sql=f"SELECT count(*) FROM metrics WHERE agent = '{agent}'"
    )["rows"]
    assert rows == [[1]]  # "delivered" means stored, exactly once


def stored(c: NodeProc, name: str) -> list[tuple[str, int]]:
    rows = c.client.call(
        "metrics", what="query", sql=f"SELECT sender, seq FROM metrics WHERE name = '{name}'"
    )["rows"]
    return [(str(r[0]), int(r[1])) for r in rows]


def test_collectors_share_the_queue_nothing_lost_or_stored_twice(mode: Mode) -> None:
    if mode.name == "p2p":
        pytest.skip("the collectors' shared queue exists in broker mode only")
    s = mode.swarm
    a, b, c = s.nodes["a"], s.nodes["b"], s.nodes["c"]
    c2 = mode.start("c2", extra_args=["--collector"])
    name = f"shared.{uuid.uuid4().hex[:8]}"
    total = 0

    def union() -> list[tuple[str, int]]:
        return stored(c, name) + stored(c2, name)

    def record(node: NodeProc, n: int) -> None:
        nonlocal total
        for _ in range(n // 50):
            node.client.call("metrics.record", name=name, count=50)
            total += 50

    record(a, 200)
    record(b, 200)
    wait_until(lambda: len(union()) >= total, 30, what="the first records stored")
    s.kill("c")  # a collector crashes: the queue goes on to the other one
    record(a, 200)
    record(b, 200)
    wait_until(lambda: len(stored(c2, name)) + 0 >= 1, 30, what="the survivor takes records")
    s.restart("c")
    record(a, 100)
    wait_until(lambda: len(union()) >= total, 45, what="every record stored")
    rows = union()
    assert len(rows) == len(set(rows)) == total  # none lost, none stored twice
    assert {x for x, _ in rows} == {a.address, b.address}
    assert stored(c2, name)  # the second collector took a share
    counters = c2.client.status()["counters"]
    assert counters.get("mesh_telemetry_batches", 0) >= 1


def test_planner_reaches_a_final_answer(
    mode: Mode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    planner = DemoPlanner((2, 2))
    root: Path = tmp_path_factory.mktemp(f"plan-{mode.name}")
    with ScriptedServer.in_thread(lambda req: planner(req["messages"], None)) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        env.update(env_for(mode.name))
        counts = {"decomposers": 1, "scorers": 1, "executors": 2}
        with started_swarm(counts, env, root=root) as (swarm, client):
            gid = client.call("plan.goal", title="trip", scorers=1, max_depth=2, settle_ms=200)[
                "goal"
            ]
            shown = wait_until(
                lambda: (
                    (s := client.call("plan.show", goal=gid))["tree"]["status"] in TERMINAL and s
                ),
                40,
                what="the goal ends",
            )
            assert shown["tree"]["status"] == "done", shown["tree"]
            assert shown["answer"]
            digests = lambda: {n.client.call("plan.show")["digest"] for n in swarm.running()}  # noqa: E731
            wait_until(lambda: len(digests()) == 1, 20, what="every replica holds the same plan")


def test_main_demo_passes(mode: Mode, tmp_path: Path) -> None:
    args = ["demo", "mesh", "--json", "--nodes", "3", "--dir", str(tmp_path)]
    url = mesh_url(mode.name)
    if url is not None:
        args += ["--mesh", url]
    out = cli(*args, timeout_s=90)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads(out.stdout)["ok"]
