"""The planner over the real mesh: every role a separate ``hivemesh agent`` process.

One swarm per module (an observer seed, 2 decomposers, 3 scorers, 3
executors; loopback, fast membership timings) and one scripted
OpenAI-compatible server on 127.0.0.1 (real HTTP). The tests run in order:
a plan completes; a late observer rebuilds the identical tree; then an
executor (holding a claim) and a scorer are killed with SIGKILL mid-plan and
a second plan still finishes. Every wait is a condition with a deadline;
the swarm's teardown kills every child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.core.identity import public_key_of
from hivemesh.errors import InvalidArgument
from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.meshplan import TERMINAL, started_swarm
from hivemesh.roles.prompts import EXECUTE_TAG, tag_of
from llm_server import ScriptedServer, Step

COUNTS = {"decomposers": 2, "scorers": 3, "executors": 3}
GOAL_ARGS = {"scorers": 3, "max_depth": 2, "settle_ms": 200}


class Script:
    """The scripted model: a 2 x 3 plan; execution can be made slow."""

    def __init__(self) -> None:
        self.planner = DemoPlanner((2, 3))
        self.exec_delay_s = 0.0
        self.lock = threading.Lock()

    def __call__(self, req: dict[str, Any]) -> Any:
        with self.lock:
            reply = self.planner(req["messages"], None)
        if tag_of(req["messages"]) == EXECUTE_TAG and self.exec_delay_s:
            return Step(content=reply, delay_s=self.exec_delay_s)
        return reply


class Mesh:
    def __init__(self, swarm: LocalSwarm, client: Client, script: Script) -> None:
        self.swarm = swarm
        self.client = client
        self.script = script
        self.goals: dict[str, str] = {}
        self.env: dict[str, str] = {}


def cli(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    full = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    full.update(env, PYTHONPATH=src)
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root: Path = tmp_path_factory.mktemp("planmesh")
    script = Script()
    with ScriptedServer.in_thread(script) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        with started_swarm(COUNTS, env, root=root) as (swarm, client):
            m = Mesh(swarm, client, script)
            m.env = env
            yield m


def show(client: Client, goal: str | None = None) -> dict[str, Any]:
    if goal is None:
        res: dict[str, Any] = client.call("plan.show")
    else:
        res = client.call("plan.show", goal=goal)
    return res


def run_to_end(client: Client, gid: str, timeout_s: float) -> dict[str, Any]:
    return wait_until(
        lambda: (s := show(client, gid))["tree"]["status"] in TERMINAL and s,
        timeout_s,
        what=f"goal {gid[:8]} ends",
    )


def nodes(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield tree
    for c in tree["children"]:
        yield from nodes(c)


def key_of(node_address: str) -> str:
    return public_key_of(node_address).hex()


def all_digests_equal(m: Mesh) -> str | None:
    digests = {show(n.client)["digest"] for n in m.swarm.running()}
    return digests.pop() if len(digests) == 1 else None


def test_separate_processes_reach_a_complete_tree_and_a_final_answer(mesh: Mesh) -> None:
    gid = mesh.client.call("plan.goal", title="weekend in Porto", **GOAL_ARGS)["goal"]
    mesh.goals["porto"] = gid
    shown = run_to_end(mesh.client, gid, 30)
    tree = shown["tree"]
    assert tree["status"] == "done"
    # the root was synthesised from its two accepted children (the scripted
    # model's answer for a synthesis over 2 inputs)
    assert shown["answer"] == "weekend in Porto: combined 2 results"
    assert [len(c["children"]) for c in tree["children"]] == [3, 3]
    executors = {key_of(n.address) for n in mesh.swarm.nodes.values() if "executor" in n.label}
    leaves = [n for n in nodes(tree) if n["kind"] == "leaf"]
    assert len(leaves) == 6
    for leaf in leaves:
        assert leaf["status"] == "done"
        assert leaf["result"]["text"] == f"done: {leaf['title']}"
        assert leaf["result"]["author"] in executors
    # every replica (all 9 processes) ends with the same plan
    wait_until(lambda: all_digests_equal(mesh), 15, what="every node holds the same plan")


def test_an_observer_started_after_the_plan_shows_the_identical_tree(mesh: Mesh) -> None:
    gid = mesh.goals["porto"]
    seed = show(mesh.client, gid)
    via = mesh.swarm.nodes["executor1"].endpoint  # any member will do
    late = mesh.swarm.start(
        "late-observer", bootstrap=[via], command=("agent",), extra_args=["--role", "observer"]
    )

    def caught_up() -> dict[str, Any] | None:
        mine = show(late.client)
        return mine if mine["digest"] == show(mesh.client)["digest"] else None

    wait_until(caught_up, 15, what="the late observer rebuilds the plan")
    got = show(late.client, gid)
    assert got["tree"] == seed["tree"]
    assert got["answer"] == seed["answer"]
    # it rebuilt it from the journal alone: no claim or result of its own
    mine = key_of(late.address)
    for n in nodes(got["tree"]):
        assert all(c["author"] != mine for c in n["claims"])


def test_killing_an_executor_and_a_scorer_mid_plan_still_finishes(mesh: Mesh) -> None:
    # executions hang long enough that the victim is killed mid-execution even
    # on a loaded machine (with 2 s a slow poll could see the claim only as the
    # victim was posting its result: the claim then never needs releasing)
    mesh.script.exec_delay_s = 8.0
    gid = mesh.client.call("plan.goal", title="two weeks in Japan", **GOAL_ARGS)["goal"]
    by_key = {key_of(n.address): n.label for n in mesh.swarm.nodes.values()}

    def a_running_claim() -> tuple[str, str] | None:
        for n in nodes(show(mesh.client, gid)["tree"]):
            if n["kind"] == "leaf" and n["status"] == "claimed":
                live = sorted((c["hlc"], c["author"]) for c in n["claims"] if not c["released"])
                return n["id"], by_key[live[0][1]]
        return None

    task, victim = wait_until(a_running_claim, 20, what="an executor holds a claim")
    assert victim.startswith("executor")
    assert show(mesh.client, gid)["tree"]["status"] != "done"
    mesh.swarm.kill(victim)
    mesh.swarm.kill("scorer0")
    mesh.script.exec_delay_s = 0.0
    shown = run_to_end(mesh.client, gid, 40)
    assert shown["tree"]["status"] == "done"
    assert shown["answer"] == "two weeks in Japan: combined 2 results"
    victim_key = key_of(mesh.swarm.nodes[victim].address)
    node = next(n for n in nodes(shown["tree"]) if n["id"] == task)
    # the victim's claim was released by failure detection (member.down), and
    # another executor re-claimed and finished the task
    assert [c["released"] for c in node["claims"] if c["author"] == victim_key] == [True]
    assert node["result"]["author"] != victim_key
    assert by_key[node["result"]["author"]].startswith("executor")
    wait_until(lambda: all_digests_equal(mesh), 15, what="survivors hold the same plan")


def test_plan_show_and_cancel_talk_to_the_local_daemon(mesh: Mesh) -> None:
    seed_dir = str(mesh.swarm.nodes["observer"].data_dir)
    gid = mesh.goals["porto"]
    res = cli("plan", "show", gid, "--json", "--data-dir", seed_dir, env={})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tree"] == show(mesh.client, gid)["tree"]
    assert (
        cli("plan", "show", "f" * 32, "--data-dir", seed_dir, env={}).returncode == 2
    )  # no such goal
    for op, bad in [
        ("plan.goal", {"title": ""}),
        ("plan.goal", {"title": "x", "quorum": "dictator"}),
        ("plan.goal", {"title": "x", "max_depth": 99}),
        ("plan.show", {"goal": 7}),
        ("plan.cancel", {"goal": "no-such-goal"}),
    ]:
        with pytest.raises(InvalidArgument):
            mesh.client.call(op, **bad)
    # cancel a plan that cannot finish (executions hang) from another node's daemon
    mesh.script.exec_delay_s = 30.0
    try:
        gid2 = mesh.client.call("plan.goal", title="a slow plan", **GOAL_ARGS)["goal"]
        wait_until(
            lambda: any(n["status"] == "claimed" for n in nodes(show(mesh.client, gid2)["tree"])),
            20,
            what="execution under way",
        )
        other = str(mesh.swarm.nodes["decomposer1"].data_dir)
        res = cli("plan", "cancel", gid2, "--data-dir", other, env={})
        assert res.returncode == 0, res.stderr
        for n in mesh.swarm.running():
            wait_until(
                lambda n=n: show(n.client, gid2)["tree"]["status"] == "cancelled",
                10,
                what=f"{n.label} sees the cancel",
            )
    finally:
        mesh.script.exec_delay_s = 0.0


def test_hivemesh_plan_starts_its_own_swarm_of_processes(mesh: Mesh) -> None:
    res = cli(
        "plan",
        "a day in Kyoto",
        "--swarm",
        "decomposers=1,scorers=1,executors=2",
        "--max-depth",
        "2",
        "--json",
        env=mesh.env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["answer"] == "a day in Kyoto: combined 2 results"
    assert doc["tree"]["status"] == "done"
    # the swarm it started was its own: this module's mesh never saw the goal
    assert doc["goal"] not in show(mesh.client)["goals"]


def test_plan_mesh_uses_the_agents_already_in_the_mesh(mesh: Mesh) -> None:
    seed_dir = str(mesh.swarm.nodes["observer"].data_dir)
    before = len(mesh.swarm.running())
    res = cli(
        "plan",
        "an evening in Osaka",
        "--mesh",
        "--data-dir",
        seed_dir,
        "--swarm",
        "decomposers=0,scorers=0,executors=0",
        "--max-depth",
        "2",
        "--json",
        env=mesh.env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["answer"] == "an evening in Osaka: combined 2 results"
    # the goal is in this mesh's journal, on every node
    for n in mesh.swarm.running():
        wait_until(
            lambda n=n: show(n.client, doc["goal"])["answer"] == doc["answer"],
            10,
            what=f"{n.label} holds the answer",
        )
    assert len(mesh.swarm.running()) == before


def test_an_agent_without_an_llm_explains_and_exits_2(tmp_path: Path) -> None:
    res = cli("agent", "--role", "scorer", "--data-dir", str(tmp_path / "a"), env={})
    assert res.returncode == 2
    assert "HIVEMESH_LLM_BASE_URL" in res.stderr


def test_plan_mesh_on_a_private_mesh_invites_its_agents(tmp_path: Path) -> None:
    """A default (private) node refuses agents that merely bootstrap from it:
    ``plan --mesh`` has the node invite each agent it starts."""
    script = Script()
    with ScriptedServer.in_thread(script) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        with LocalSwarm(tmp_path / "private", env=env, trust_mode=None) as swarm:
            seed = swarm.start("seed", command=("agent",), extra_args=["--role", "observer"])
            assert seed.client.call("trust.list")["mode"] == "invite"
            res = cli(
                "plan",
                "a morning in Nara",
                "--mesh",
                "--data-dir",
                str(seed.data_dir),
                "--swarm",
                "decomposers=1,scorers=1,executors=2",
                "--max-depth",
                "2",
                "--json",
                env=env,
                timeout_s=120,
            )
            assert res.returncode == 0, res.stderr[-2000:]
            doc = json.loads(res.stdout)
            assert doc["answer"] == "a morning in Nara: combined 2 results"
            joined = seed.client.status()["counters"].get("invites_redeemed", 0)
            assert joined == 4
