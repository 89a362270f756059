"""Executor: claims tasks it can do, runs them with the LLM (and tools), publishes.

Claim policy: on each poll, first run every task whose claim this node *won*
(``view.claim_won``: the earliest live claim, settled, under a settled
decision); then, with any spare capacity (``max_concurrent`` minus running
and still-settling claims), claim claimable tasks in order of their
``ready_hlc`` (the logical time they became ready), skipping tasks that need
capabilities this node did not advertise. Claims are made speculatively,
before the decision that created the task has settled, so the two settle
windows overlap; execution still waits for both.
A lost claim is kept as a standby: if the winner is later released (it
crashed), this node's claim becomes the winner and it runs the task.

Leaves get the results of the tasks they depend on; inner nodes are
*synthesised* from their children's results, the root into the final answer.
A failed run writes ``plan.task.release`` with ``failed=True`` (an attempt),
so another executor (or this one, later) can retry it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from hivemesh.core.plan import PlanView, TaskInfo
from hivemesh.core.plan_events import (
    KIND_CLAIM,
    KIND_HELLO,
    KIND_RELEASE,
    KIND_RESULT,
    claim_body,
    hello_body,
    release_body,
    result_body,
)
from hivemesh.llm.base import LLMProvider, Message
from hivemesh.llm.errors import LLMBadOutput
from hivemesh.roles.base import Action, Emit, RoleBase, clip
from hivemesh.roles.prompts import execute_messages, execute_schema, synth_messages

__all__ = ["Executor", "ToolBox"]

#: Results are cut to this many UTF-8 bytes (an event is at most 256 KiB).
MAX_RESULT_BYTES = 48 * 1024


class ToolBox(Protocol):
    """Tools an executor may call (an MCP client session fits behind this)."""

    async def list_tools(self) -> list[dict[str, Any]]:
        """``[{"name", "description"}]``."""
        ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool; its text output."""
        ...


class Executor(RoleBase):
    """Runs leaf tasks and syntheses; ``caps`` are advertised with ``plan.hello``."""

    name = "executor"

    def __init__(
        self,
        me: bytes,
        llm: LLMProvider,
        *,
        caps: Iterable[str] = (),
        max_concurrent: int = 4,
        synthesise: bool = True,
        tools: ToolBox | None = None,
        max_tool_steps: int = 4,
        tool_timeout_s: float = 30.0,
        timeout_s: float | None = None,
        retry_after_ms: int = 0,
        reclaim_after_ms: int = 1000,
    ) -> None:
        super().__init__(me, retry_after_ms=retry_after_ms)
        self.reclaim_after_ms = reclaim_after_ms
        self.llm = llm
        self.caps = frozenset(caps)
        self.max_concurrent = max_concurrent
        self.synthesise = synthesise
        self.tools = tools
        self.max_tool_steps = max_tool_steps
        self.tool_timeout_s = tool_timeout_s
        self.timeout_s = timeout_s
        self._claimed_at: dict[str, int] = {}
        self._ran: set[str] = set()

    def hello(self) -> Emit:
        """The capability advertisement."""
        return Emit(KIND_HELLO, hello_body(["executor"], sorted(self.caps)))

    def poll(self, view: PlanView, now_ms: int) -> list[Action]:
        """Run won claims, then claim more tasks up to capacity."""
        out: list[Action] = self.greeting()
        settling = 0
        for task, claim in view.claims_by(self.me):
            if task in self.inflight or claim in self._ran:
                continue
            if view.claim_won(task, claim, now_ms):
                info = view.task_info(task)
                if info is None:
                    continue
                self._ran.add(claim)
                self.counters["runs"] += 1
                out.append(
                    self.job(task, now_ms, self._work(view, info), self._failed(task, claim))
                )
            else:
                n = view.node(task)
                if n is not None and n.winner is not None and n.winner[1] == self.me:
                    settling += 1
        capacity = self.max_concurrent - len(self.inflight) - settling
        for t in view.claimable(now_ms, speculative=True):
            if capacity <= 0:
                break
            if t.kind == "synthesise" and not self.synthesise:
                continue
            if not set(t.caps) <= self.caps:
                continue
            last = self._claimed_at.get(t.task)
            if last is not None and now_ms < last + self.reclaim_after_ms:
                continue
            self._claimed_at[t.task] = now_ms
            self.counters["claims"] += 1
            out.append(Emit(KIND_CLAIM, claim_body(t.task)))
            capacity -= 1
        return out

    def _failed(self, task: str, claim: str) -> Any:
        def on_error(exc: Exception) -> list[Emit]:
            reason = f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"[:500]
            return [Emit(KIND_RELEASE, release_body(task, claim, failed=True, reason=reason))]

        return on_error

    def _work(self, view: PlanView, info: TaskInfo) -> Any:
        if info.kind == "synthesise":
            n = view.node(info.task)
            final = n is not None and n.parent is None
            messages = synth_messages(
                title=info.title, path=info.path, inputs=info.inputs, final=final
            )
            use_tools = False
        else:
            messages = []
            use_tools = self.tools is not None

        async def work() -> list[Emit]:
            msgs = messages
            tool_list: list[dict[str, Any]] = []
            if info.kind == "execute":
                if self.tools is not None:
                    tool_list = await self.tools.list_tools()
                msgs = execute_messages(
                    title=info.title,
                    detail=info.detail,
                    path=info.path,
                    inputs=info.inputs,
                    tools=tool_list,
                )
            text = await self._run(msgs, use_tools)
            self.counters["results"] += 1
            return [Emit(KIND_RESULT, result_body(info.task, clip(text, MAX_RESULT_BYTES)))]

        return work

    async def _run(self, msgs: list[Message], use_tools: bool) -> str:
        schema = execute_schema(use_tools)
        for _step in range(self.max_tool_steps + 1):
            res = await self.llm.complete(msgs, schema=schema, timeout_s=self.timeout_s)
            if "result" in res.parsed:
                return str(res.parsed["result"])
            assert self.tools is not None
            name = str(res.parsed["tool"])
            args = res.parsed.get("arguments") or {}
            self.counters["tool_calls"] += 1
            try:
                async with asyncio.timeout(self.tool_timeout_s):
                    output = await self.tools.call_tool(name, args)
            except Exception as exc:  # a tool failure is information for the model
                output = f"error: {type(exc).__name__}: {exc}"
            msgs = [
                *msgs,
                Message(role="assistant", content=res.text[:4000]),
                Message(role="user", content=f"Tool {name} returned:\n{output[:8000]}"),
            ]
        raise LLMBadOutput(f"no result after {self.max_tool_steps} tool calls")
