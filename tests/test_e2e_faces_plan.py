"""The planner's faces over a real swarm: A2A and the live terminal observer.

One swarm for the module: an observer seed, a decomposer, a scorer and two
executors, each a separate ``hivemesh agent`` process on loopback, with the
scripted model of ``test_e2e_plan`` served by ``llm_server`` on 127.0.0.1.

* A2A: ``hivemesh a2a`` serves the seed; the a2a-sdk client reads its Agent
  Card (the mesh's roles as skills), sends a goal as a streaming message and
  follows the task from submitted through working to completed, the final
  answer as an artifact; ``GetTask`` agrees.
* ``hivemesh plan watch GOAL --until-done`` (not a terminal) prints the tree
  as it changes and ends on the final tree; on a node that joined after the
  goal finished, ``plan watch --once`` and ``hivemesh agent --role observer``
  show the same final tree, rebuilt from the journal.

Every wait is a condition with a deadline; the swarm's teardown kills every child.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import hivemesh
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.roles.meshplan import TERMINAL, started_swarm
from hivemesh.roles.observer import render_text
from llm_server import ScriptedServer
from test_e2e_plan import Script  # the scripted 2 x 3 plan, execution optionally slow

COUNTS = {"decomposers": 1, "scorers": 1, "executors": 2}
GOAL_ARGS = {"scorers": 1, "max_depth": 2, "settle_ms": 200}


@dataclass
class Mesh:
    swarm: LocalSwarm
    client: Client
    script: Script


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL past a grace period."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root: Path = tmp_path_factory.mktemp("facesplan")
    script = Script()
    with ScriptedServer.in_thread(script) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        with started_swarm(COUNTS, env, root=root) as (swarm, client):
            yield Mesh(swarm, client, script)


def hivemesh_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "hivemesh", *args]


def env_of(swarm: LocalSwarm) -> dict[str, str]:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    return {**swarm.env, "PYTHONPATH": src}


def watch_cli(mesh: Mesh, node: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``hivemesh plan watch ARGS`` on ``node``, to its end (output captured)."""
    return subprocess.run(
        hivemesh_cmd("plan", "watch", *args, "--data-dir", str(node.data_dir)),
        env=env_of(mesh.swarm),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def last_frame(out: str) -> str:
    """The last tree ``plan watch`` printed (the text under its last header)."""
    return out.split("-- plan ")[-1].split("\n", 1)[1].strip()


def final_tree(client: Client, goal: str, timeout_s: float = 60) -> dict[str, Any]:
    shown: dict[str, Any] = wait_until(
        lambda: (s := client.call("plan.show", goal=goal))["tree"]["status"] in TERMINAL and s,
        timeout_s,
        what=f"goal {goal[:8]} ends",
    )
    return shown


def test_a2a_client_follows_a_goal_to_completed(mesh: Mesh) -> None:
    from a2a.client import ClientConfig, create_client
    from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState

    seed = mesh.swarm.nodes["observer"]
    args = ["a2a", "--data-dir", str(seed.data_dir), "--port", "0", "--json"]
    args += ["--scorers", "1", "--max-depth", "2", "--settle-ms", "200"]
    proc = subprocess.Popen(
        hivemesh_cmd(*args),
        env=env_of(mesh.swarm),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())  # the process prints it once it listens
        url = ready["url"]
        card = httpx.get(ready["card"], timeout=10).json()
        assert card["supportedInterfaces"][0]["url"] == url
        skills = {s["id"]: s for s in card["skills"]}
        assert {"goal", "role.decomposer", "role.scorer", "role.executor"} <= set(skills)
        assert skills["role.executor"]["name"] == "executor (2 live)"

        async def follow() -> tuple[list[int], Any, str]:
            async with httpx.AsyncClient(timeout=60) as http:
                config = ClientConfig(streaming=True, httpx_client=http)
                client = await create_client(url, client_config=config)
                message = Message(
                    role=Role.ROLE_USER,
                    message_id="m-porto",
                    parts=[Part(text="weekend in Porto")],
                )
                states: list[int] = []
                task_id = ""
                answer = ""
                async with asyncio.timeout(60):
                    async for ev in client.send_message(SendMessageRequest(message=message)):
                        if ev.HasField("task"):
                            task_id = ev.task.id
                            states.append(ev.task.status.state)
                        elif ev.HasField("status_update"):
                            states.append(ev.status_update.status.state)
                        elif ev.HasField("artifact_update"):
                            answer = ev.artifact_update.artifact.parts[0].text
                task = await client.get_task(GetTaskRequest(id=task_id))
                await client.close()
                return states, task, answer

        states, task, answer = asyncio.run(follow())
        assert states[0] == TaskState.TASK_STATE_SUBMITTED
        assert TaskState.TASK_STATE_WORKING in states
        assert states[-1] == TaskState.TASK_STATE_COMPLETED
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert answer == "weekend in Porto: combined 2 results"
        assert task.artifacts[0].parts[0].text == answer
        goal = str(task.metadata["hivemesh_goal"])
        shown = mesh.client.call("plan.show", goal=goal)
        assert shown["tree"]["status"] == "done" and shown["answer"] == answer
    finally:
        stop(proc)


def test_plan_watch_live_and_for_a_late_joiner(mesh: Mesh, tmp_path: Path) -> None:
    seed = mesh.swarm.nodes["observer"]
    mesh.script.exec_delay_s = 1.0  # the tree visibly grows while the watch runs
    try:
        goal = mesh.client.call("plan.goal", title="city break in Lisbon", **GOAL_ARGS)["goal"]
        watch = watch_cli(mesh, seed, goal, "--until-done", "--timeout-s", "60")
    finally:
        mesh.script.exec_delay_s = 0.0
    assert watch.returncode == 0, watch.stderr
    final = final_tree(mesh.client, goal)["tree"]
    assert final["status"] == "done"
    frames = watch.stdout.split("-- plan ")[1:]
    assert len(frames) >= 2, watch.stdout  # it redrew as the tree grew
    first = frames[0].split("\n", 1)[1].strip()
    last = last_frame(watch.stdout)
    assert last == render_text(final)
    assert first != last

    # a node that joins after the goal ended rebuilds the tree from the journal:
    # watched at once, before it has caught up, it shows the goal when it arrives
    late = mesh.swarm.start("late", bootstrap=[seed.endpoint])
    caught_up = watch_cli(mesh, late, goal, "--until-done", "--timeout-s", "30")
    assert caught_up.returncode == 0, caught_up.stderr
    assert last_frame(caught_up.stdout) == render_text(final)
    once = watch_cli(mesh, late, goal, "--once")
    assert once.returncode == 0, once.stderr
    assert last_frame(once.stdout) == render_text(final)
    unknown = watch_cli(mesh, late, "f" * 32, "--once")
    assert unknown.returncode == 2 and "no goal" in unknown.stderr, unknown.stderr

    # and so does a late observer agent, drawing on a non-terminal stdout
    out_path = tmp_path / "observer.out"
    args = ["agent", "--role", "observer", "--data-dir", str(tmp_path / "obs")]
    args += ["--listen", "127.0.0.1:0", "--bootstrap", seed.endpoint]
    with out_path.open("w") as out:
        observer = subprocess.Popen(
            hivemesh_cmd(*args), env=env_of(mesh.swarm), stdout=out, stderr=subprocess.PIPE
        )
    try:
        wait_until(
            lambda: render_text(final) in out_path.read_text(),
            30,
            what="the late observer draws the final tree",
        )
    finally:
        stop(observer)
    assert observer.returncode == 0
    assert os.path.getsize(out_path) > 0


def test_a2a_escalation_is_input_required_and_the_answer_resumes(mesh: Mesh) -> None:
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

    seed = mesh.swarm.nodes["observer"]
    args = ["a2a", "--data-dir", str(seed.data_dir), "--port", "0", "--json"]
    args += ["--scorers", "1", "--max-depth", "2", "--settle-ms", "200"]
    proc = subprocess.Popen(
        hivemesh_cmd(*args), env=env_of(mesh.swarm), stdout=subprocess.PIPE, text=True
    )

    def escalate() -> None:
        """An agent of the mesh asks a human (the audit's escalation events)."""
        shops = [{"id": "shop-1", "url": "http://127.0.0.1:9/"}]
        start = {"audit": "a2a-test", "shops": shops, "routes": ["direct"], "batch_size": 1}
        start["market"] = "test"
        mesh.client.call("append", kind="audit.start", body=start)
        question = {"audit": "a2a-test", "id": "q-a2a-1", "shop": "shop-1"}
        question |= {"ref": "x:1", "question": "Which price counts?", "reason": "two prices"}
        mesh.client.call("append", kind="audit.escalation", body=question)

    async def converse(url: str) -> tuple[list[int], str, list[int]]:
        async with httpx.AsyncClient(timeout=60) as http:
            client = await create_client(
                url, client_config=ClientConfig(streaming=True, httpx_client=http)
            )
            first = Message(
                role=Role.ROLE_USER, message_id="m-1", parts=[Part(text="trip to Oslo")]
            )
            states: list[int] = []
            asked = ""
            task_id = context_id = ""
            escalated = False
            async with asyncio.timeout(60):
                async for ev in client.send_message(SendMessageRequest(message=first)):
                    if ev.HasField("task"):
                        task_id, context_id = ev.task.id, ev.task.context_id
                        states.append(ev.task.status.state)
                    elif ev.HasField("status_update"):
                        status = ev.status_update.status
                        states.append(status.state)
                        if status.state == TaskState.TASK_STATE_WORKING and not escalated:
                            escalated = True
                            await asyncio.to_thread(escalate)
                        if status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                            asked = status.message.parts[0].text
            assert states[-1] == TaskState.TASK_STATE_INPUT_REQUIRED, states
            answer = Message(
                role=Role.ROLE_USER,
                message_id="m-2",
                task_id=task_id,
                context_id=context_id,
                parts=[Part(text="the list price")],
            )
            after: list[int] = []
            async with asyncio.timeout(60):
                async for ev in client.send_message(SendMessageRequest(message=answer)):
                    if ev.HasField("task"):
                        after.append(ev.task.status.state)
                    elif ev.HasField("status_update"):
                        after.append(ev.status_update.status.state)
            await client.close()
            return states, asked, after

    mesh.script.exec_delay_s = 2.0  # the goal is still running when the question comes
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        states, asked, after = asyncio.run(converse(ready["url"]))
    finally:
        mesh.script.exec_delay_s = 0.0
        stop(proc)
    assert states[0] == TaskState.TASK_STATE_SUBMITTED
    assert states[-1] == TaskState.TASK_STATE_INPUT_REQUIRED, states
    assert "Which price counts?" in asked and "q-a2a-1" in asked
    assert after[-1] == TaskState.TASK_STATE_COMPLETED, after
    every = mesh.client.call("audit.inbox", all=True)["questions"]
    assert [q["answer"] for q in every if q["id"] == "q-a2a-1"] == ["the list price"]


def test_mcp_goal_runs_to_its_answer_with_tree_notifications(mesh: Mesh) -> None:
    """Through ``hivemesh mcp`` on the seed: a goal submitted with plan_goal is
    planned and run by the swarm; its tree resource is announced as it grows."""
    from mcp import Client, StdioServerParameters

    from hivemesh.faces.mcp import plan_uri

    seed = mesh.swarm.nodes["observer"]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "hivemesh", "mcp", "--data-dir", str(seed.data_dir)],
        env=env_of(mesh.swarm),
    )

    async def main() -> tuple[int, dict[str, Any]]:
        async with Client(params, read_timeout_seconds=30) as client:
            res = await client.call_tool("plan_goal", {"title": "picnic in Sintra", **GOAL_ARGS})
            assert not res.is_error and res.structured_content is not None
            goal = res.structured_content["goal"]
            updates = 0
            async with (
                asyncio.timeout(60),
                client.listen(resource_subscriptions=[plan_uri(goal)]) as sub,
            ):
                read = await client.read_resource(plan_uri(goal))  # it may have run already
                shown = json.loads(read.contents[0].text)  # type: ignore[union-attr]
                if shown["tree"]["status"] in TERMINAL:
                    return updates, shown
                async for _event in sub:
                    updates += 1
                    read = await client.read_resource(plan_uri(goal))
                    shown = json.loads(read.contents[0].text)  # type: ignore[union-attr]
                    if shown["tree"]["status"] in TERMINAL:
                        return updates, shown
        raise AssertionError("the subscription ended before the goal did")

    updates, shown = asyncio.run(main())
    assert shown["tree"]["status"] == "done"
    assert shown["answer"] == "picnic in Sintra: combined 2 results"
    assert updates >= 2  # announced as it grew, not only at the end (a goal takes ~1 s)


def test_a2a_cancel_cancels_the_goal(mesh: Mesh) -> None:
    from a2a.client import ClientConfig, create_client
    from a2a.types import (
        CancelTaskRequest,
        GetTaskRequest,
        Message,
        Part,
        Role,
        SendMessageRequest,
        TaskState,
    )

    seed = mesh.swarm.nodes["observer"]
    args = ["a2a", "--data-dir", str(seed.data_dir), "--port", "0", "--json"]
    args += ["--scorers", "1", "--max-depth", "2", "--settle-ms", "200"]
    proc = subprocess.Popen(
        hivemesh_cmd(*args), env=env_of(mesh.swarm), stdout=subprocess.PIPE, text=True
    )

    async def cancel_midway(url: str) -> Any:
        async with httpx.AsyncClient(timeout=60) as http:
            client = await create_client(
                url, client_config=ClientConfig(streaming=True, httpx_client=http)
            )
            text = [Part(text="tour of Braga")]
            message = Message(role=Role.ROLE_USER, message_id="m-braga", parts=text)
            task_id = ""
            async with asyncio.timeout(60):
                async for ev in client.send_message(SendMessageRequest(message=message)):
                    if ev.HasField("task"):
                        task_id = ev.task.id
                    if ev.HasField("status_update") and task_id:
                        state = ev.status_update.status.state
                        if state == TaskState.TASK_STATE_WORKING:
                            break  # the goal runs: cancel it
                cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
                task = await client.get_task(GetTaskRequest(id=task_id))
            await client.close()
            return cancelled, task

    mesh.script.exec_delay_s = 3.0  # still running when the cancel comes
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        cancelled, task = asyncio.run(cancel_midway(ready["url"]))
    finally:
        mesh.script.exec_delay_s = 0.0
        stop(proc)
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    goal = str(task.metadata["hivemesh_goal"])
    tree = final_tree(mesh.client, goal)["tree"]
    assert tree["status"] == "cancelled"
