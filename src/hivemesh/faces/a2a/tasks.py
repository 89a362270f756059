"""A bounded A2A task store: at most ``max_tasks`` tasks kept in memory.

The a2a-sdk's :class:`~a2a.server.tasks.InMemoryTaskStore` keeps every task
for the life of the process. Here a task ending (completed, failed,
cancelled, rejected) makes it evictable: when a new task would exceed
``max_tasks``, the oldest ended task is forgotten (counted as
``tasks_evicted``; its goal stays in the journal, ``GetTask`` then answers
task-not-found). When every kept task is still running, the new one is
refused with a JSON-RPC invalid-request error that says so (counted as
``tasks_refused``): a client learns to retry later, and memory stays bounded.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import Any

from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import TaskState
from a2a.utils.errors import InvalidRequestError

__all__ = ["DEFAULT_MAX_TASKS", "BoundedTaskStore"]

log = logging.getLogger(__name__)

#: Tasks an A2A face keeps by default.
DEFAULT_MAX_TASKS = 1000

_ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


class BoundedTaskStore(TaskStore):
    """An in-memory task store that keeps at most ``max_tasks`` tasks (module docs)."""

    def __init__(self, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be >= 1")
        self.max_tasks = max_tasks
        #: ``tasks_evicted`` and ``tasks_refused``.
        self.counters: Counter[str] = Counter()
        self._inner = InMemoryTaskStore()
        #: task id -> whether it has ended, oldest first
        self._kept: OrderedDict[str, bool] = OrderedDict()

    async def save(self, task: Any, context: Any) -> None:
        """Save ``task``; a new one may evict the oldest ended task, or be refused."""
        if task.id not in self._kept and len(self._kept) >= self.max_tasks:
            victim = next((tid for tid, ended in self._kept.items() if ended), None)
            if victim is None:
                self.counters["tasks_refused"] += 1
                log.warning("a2a: refused a task: %d tasks are all still running", self.max_tasks)
                raise InvalidRequestError(
                    message=f"too many tasks in flight ({self.max_tasks}); retry later"
                )
            await self._inner.delete(victim, context)
            del self._kept[victim]
            self.counters["tasks_evicted"] += 1
        await self._inner.save(task, context)
        self._kept[task.id] = task.status.state in _ENDED

    async def get(self, task_id: str, context: Any) -> Any:
        """The task with ``task_id``, or None (never seen, or evicted)."""
        return await self._inner.get(task_id, context)

    async def list(self, params: Any, context: Any) -> Any:
        """The kept tasks, as the in-memory store lists them."""
        return await self._inner.list(params, context)

    async def delete(self, task_id: str, context: Any) -> None:
        """Forget ``task_id``."""
        await self._inner.delete(task_id, context)
        self._kept.pop(task_id, None)

    def __len__(self) -> int:
        return len(self._kept)
