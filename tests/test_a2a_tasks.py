"""The A2A face keeps a bounded number of tasks (hivemesh.faces.a2a.tasks)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("a2a")

from a2a.server.context import ServerCallContext
from a2a.types import Task, TaskState, TaskStatus
from a2a.utils.errors import InvalidRequestError

from hivemesh.faces.a2a.tasks import BoundedTaskStore

CTX = ServerCallContext()


def _task(tid: str, state: int) -> Task:
    return Task(id=tid, context_id="c", status=TaskStatus(state=state))


def test_a_new_task_evicts_the_oldest_ended_one_and_never_a_running_one() -> None:
    async def go() -> None:
        store = BoundedTaskStore(max_tasks=3)
        await store.save(_task("run", TaskState.TASK_STATE_WORKING), CTX)
        await store.save(_task("old", TaskState.TASK_STATE_COMPLETED), CTX)
        await store.save(_task("new", TaskState.TASK_STATE_FAILED), CTX)
        await store.save(_task("x", TaskState.TASK_STATE_SUBMITTED), CTX)
        assert len(store) == 3
        assert await store.get("old", CTX) is None
        assert await store.get("run", CTX) is not None
        assert await store.get("new", CTX) is not None
        assert store.counters["tasks_evicted"] == 1
        # an update of a kept task is never refused nor evicts anything
        await store.save(_task("x", TaskState.TASK_STATE_WORKING), CTX)
        assert store.counters["tasks_evicted"] == 1

    asyncio.run(go())


def test_when_every_kept_task_is_running_a_new_one_is_refused_and_counted() -> None:
    async def go() -> None:
        store = BoundedTaskStore(max_tasks=2)
        await store.save(_task("a", TaskState.TASK_STATE_WORKING), CTX)
        await store.save(_task("b", TaskState.TASK_STATE_INPUT_REQUIRED), CTX)
        with pytest.raises(InvalidRequestError, match="too many tasks"):
            await store.save(_task("c", TaskState.TASK_STATE_SUBMITTED), CTX)
        assert store.counters["tasks_refused"] == 1
        assert len(store) == 2 and await store.get("c", CTX) is None
        # once one ends, the next new task takes its place
        await store.save(_task("a", TaskState.TASK_STATE_COMPLETED), CTX)
        await store.save(_task("c", TaskState.TASK_STATE_SUBMITTED), CTX)
        assert await store.get("a", CTX) is None and await store.get("c", CTX) is not None

    asyncio.run(go())


def test_memory_stays_bounded_over_many_tasks() -> None:
    async def go() -> None:
        store = BoundedTaskStore(max_tasks=50)
        for i in range(2000):
            await store.save(_task(f"t{i}", TaskState.TASK_STATE_SUBMITTED), CTX)
            await store.save(_task(f"t{i}", TaskState.TASK_STATE_COMPLETED), CTX)
        assert len(store) == 50
        assert store.counters["tasks_evicted"] == 1950

    asyncio.run(go())
