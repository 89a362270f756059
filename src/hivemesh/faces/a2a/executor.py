"""An A2A task is a goal of the leaderless planner, followed to its end.

Theory of operation
-------------------
:class:`PlanExecutor` is the a2a-sdk ``AgentExecutor`` of a node. A message
that starts a task becomes a goal (``plan.goal``: the text's first 300
characters are the title, the rest the detail); the task is enqueued
``submitted`` with the goal's id in its metadata (``hivemesh_goal``). Then
the executor follows the goal's tree (``plan.show``, woken by the node's
plan events, see :class:`~hivemesh.faces.plan_watch.ClientSource`) and maps
it to task states with :data:`STATE_OF`:

=====================================  ==============================
plan tree root                         A2A task state
=====================================  ==============================
goal appended                          ``submitted``
any other status (open, split, ...)    ``working`` (progress message)
an open escalation in the node's inbox ``input-required`` (the question)
``done``                               ``completed`` + answer artifact
``failed``                             ``failed``
``cancelled``                          ``canceled``
=====================================  ==============================

A ``working`` update is sent when the progress text changes (how many of
the tree's tasks are done), not on every event. Escalations are the node's
open questions to a human (``audit.inbox``); the task's next message is the
answer (``audit.answer`` to each question asked, whose ids ride in the
status message's metadata), and following resumes. Cancelling the task
cancels the goal (``plan.cancel``). A goal that does not end within
``timeout_s`` fails the task. A node error while following fails the task
with the error's stable code in the message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from a2a.helpers.proto_helpers import new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import TaskState

from hivemesh.commands import AuditAnswer, AuditInbox, PlanCancel, PlanGoal, PlanShow
from hivemesh.errors import HivemeshError
from hivemesh.faces.plan_watch import REFRESH_S, ClientSource

__all__ = ["GOAL_KEY", "STATE_OF", "PlanExecutor", "progress"]

#: The task metadata key holding the goal's id.
GOAL_KEY = "hivemesh_goal"
#: The status message metadata key holding the escalated questions' ids.
QUESTIONS_KEY = "hivemesh_questions"
#: Final plan statuses and their task states (any other status is ``working``).
STATE_OF: Mapping[str, Any] = {
    "done": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}


def _nodes(tree: dict[str, Any]) -> list[dict[str, Any]]:
    out = [tree]
    for child in tree["children"]:
        out += _nodes(child)
    return out


def progress(tree: dict[str, Any]) -> str:
    """A one-line progress report of a goal's tree."""
    nodes = _nodes(tree)
    done = sum(1 for n in nodes if n["status"] == "done")
    return f"{tree['status']}: {done} of {len(nodes)} tasks done"


class PlanExecutor(AgentExecutor):
    """Runs A2A tasks as goals on the node ``client`` reaches (module docs)."""

    def __init__(
        self,
        client: Any,
        *,
        goal_args: Mapping[str, Any] | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.goal_args = dict(goal_args or {})
        self.timeout_s = timeout_s

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Start a goal for a new task, or take an escalation's answer; then follow."""
        task_id, context_id = str(context.task_id), str(context.context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        text = context.get_user_input().strip()
        task = context.current_task
        if task is None:
            if not text:
                await updater.reject(updater.new_agent_message([new_text_part("an empty goal")]))
                return
            try:
                request = PlanGoal(title=text[:300], detail=text[300:4000], **self.goal_args)
                goal = (await self.client.run(request)).to_wire()["goal"]
            except HivemeshError as exc:
                await updater.reject(updater.new_agent_message([new_text_part(_why(exc))]))
                return
            history = [context.message] if context.message is not None else []
            submitted = new_task(
                task_id, context_id, TaskState.TASK_STATE_SUBMITTED, history=history
            )
            submitted.metadata[GOAL_KEY] = goal
            await event_queue.enqueue_event(submitted)
        else:
            goal = str(task.metadata[GOAL_KEY])
            if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                meta = task.status.message.metadata  # a protobuf Struct
                asked = list(meta[QUESTIONS_KEY]) if QUESTIONS_KEY in meta else []
                try:
                    for qid in asked:
                        await self.client.run(AuditAnswer(id=str(qid), text=text[:2000] or "ok"))
                except HivemeshError as exc:
                    await updater.failed(updater.new_agent_message([new_text_part(_why(exc))]))
                    return
        await self._follow(goal, updater)

    async def _follow(self, goal: str, updater: TaskUpdater) -> None:
        source = ClientSource(self.client, goal)
        said = ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            while True:
                done, said = await self._step(goal, source, updater, said)
                if done:
                    return
                if loop.time() > deadline:
                    why = f"goal {goal} did not end in {self.timeout_s:g}s"
                    await updater.failed(updater.new_agent_message([new_text_part(why)]))
                    return
                await source.changed(REFRESH_S)
        except HivemeshError as exc:
            await updater.failed(updater.new_agent_message([new_text_part(_why(exc))]))
        finally:
            await source.aclose()

    async def _step(
        self, goal: str, source: ClientSource, updater: TaskUpdater, said: str
    ) -> tuple[bool, str]:
        """One look at the goal: whether the task has left ``working``, and the
        progress text last sent (``said``, or the new one)."""
        trees = await source.trees()
        if not trees:  # not in the node's plan view yet: wait for it
            return False, said
        tree = trees[0]
        final = STATE_OF.get(tree["status"])
        if final is not None:
            await self._finish(goal, tree, final, updater)
            return True, said
        questions = (await self.client.run(AuditInbox())).to_wire()["questions"]
        if questions:
            ask = "\n".join(f"[{q['id']}] {q['question']}" for q in questions)
            ids = [q["id"] for q in questions]
            msg = updater.new_agent_message([new_text_part(ask)], {QUESTIONS_KEY: ids})
            await updater.requires_input(msg)
            return True, said
        now = progress(tree)
        if now != said:
            await updater.start_work(updater.new_agent_message([new_text_part(now)]))
        return False, now

    async def _finish(
        self, goal: str, tree: dict[str, Any], state: Any, updater: TaskUpdater
    ) -> None:
        if state == TaskState.TASK_STATE_COMPLETED:
            shown = (await self.client.run(PlanShow(goal=goal))).to_wire()
            answer = shown.get("answer") or ""
            await updater.add_artifact([new_text_part(answer)], name="answer")
            await updater.complete(updater.new_agent_message([new_text_part(progress(tree))]))
        elif state == TaskState.TASK_STATE_CANCELED:
            await updater.cancel(updater.new_agent_message([new_text_part(progress(tree))]))
        else:
            await updater.failed(updater.new_agent_message([new_text_part(progress(tree))]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Cancel the task's goal in the plan, then the task."""
        updater = TaskUpdater(event_queue, str(context.task_id), str(context.context_id))
        task = context.current_task
        if task is not None and GOAL_KEY in task.metadata:
            goal = str(task.metadata[GOAL_KEY])
            try:
                await self.client.run(PlanCancel(goal=goal, reason="cancelled through A2A"))
            except HivemeshError as exc:
                await updater.failed(updater.new_agent_message([new_text_part(_why(exc))]))
                return
        await updater.cancel()


def _why(exc: HivemeshError) -> str:
    return f"{exc.code}: {exc}"
