"""Calling tools on MCP servers (stdio or streamable HTTP), from configuration.

Theory of operation
-------------------
An :class:`MCPConnection` keeps one session with one configured server
(:class:`~hivemesh.tools.spec.MCPServerSpec`). The session is opened and
closed by a task of its own (the ``mcp`` client's task groups must be left
by the task that entered them); calls go through it from any task. Every
step has a deadline, the spec's ``timeout_s`` unless a call gives its own:
starting the server and the handshake (always the spec's), listing tools,
each call (from when the session is up). Failures are typed:

* :class:`~hivemesh.tools.errors.ToolUnavailable` -- the server would not start,
  is unreachable, or died. The connection is dropped and the next call
  starts a new one (after a back-off that doubles from 1 s up to 30 s while
  starts keep failing), so a crashed server costs calls, never the caller;
* :class:`~hivemesh.tools.errors.ToolTimeout` -- a deadline passed (the session
  stays: a slow tool is not a dead server);
* :class:`~hivemesh.tools.errors.ToolFailed` -- the tool answered with an error
  result; ``reason`` holds the server's error code when its text starts
  with one (``captcha_required: ...``, as :mod:`hivemesh.webtools` sends);
* :class:`~hivemesh.tools.errors.UnknownTool` -- no such tool (or not allowed).

An :class:`MCPToolSet` puts several servers behind one name space, each tool
as ``<server>.<tool>`` (server names cannot contain a dot, so the split is
unambiguous), and is the executor's
:class:`~hivemesh.roles.executor.ToolBox`: :meth:`MCPToolSet.list_tools` and
:meth:`MCPToolSet.call_tool` (text, ``error: ...`` when it failed, never an
exception), plus :meth:`MCPToolSet.call` for a typed :class:`ToolResult`.
At most ``max_in_flight`` calls run at once per server; more wait their turn
within their own deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from hivemesh.errors import HivemeshError
from hivemesh.tools.errors import ToolError, ToolFailed, ToolTimeout, ToolUnavailable, UnknownTool
from hivemesh.tools.spec import MCPServerSpec

__all__ = ["MCPConnection", "MCPToolSet", "ToolResult"]

_REASON = re.compile(r"^(?:Error executing tool \S+: )?([a-z][a-z0-9_]{2,40}): ")
MAX_OUTPUT_CHARS = 64_000


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one tool call."""

    tool: str
    text: str
    structured: dict[str, Any] | None
    is_error: bool
    #: The server's error code (``captcha_required``), or ``""``.
    reason: str
    duration_ms: int


def _reason(text: str) -> str:
    m = _REASON.match(text)
    if m:
        return m.group(1)
    if "validation error" in text:
        return "invalid_arguments"
    return "unknown_tool" if text.startswith("Unknown tool") else ""


class MCPConnection:
    """One MCP server session, reconnected on demand (see the module docs)."""

    def __init__(
        self, spec: MCPServerSpec, *, errlog: TextIO | None = None, max_in_flight: int = 16
    ) -> None:
        self.spec = spec
        self.errlog = errlog
        self.counters: Counter[str] = Counter()
        self._client: Any = None
        self._keeper: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._tools: dict[str, Any] = {}

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        spec = self.spec
        if spec.transport == "stdio":
            params = StdioServerParameters(
                command=spec.command, args=list(spec.args), env=dict(spec.env) or None, cwd=spec.cwd
            )
            return stdio_client(params, errlog=self.errlog or sys.stderr)
        if not spec.headers:
            return spec.url
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(
            headers=dict(spec.headers), timeout=httpx2.Timeout(spec.timeout_s, read=300.0)
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(spec.url, http_client=http)

    async def _keep(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                client = Client(self._transport(stack))
                await stack.enter_async_context(client)
                self._client = client
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:  # reported to the caller waiting on ready
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                self.counters["session_errors"] += 1
        finally:
            self._client = None

    async def _connected(self, deadline: float) -> Any:
        async with self._lock:
            if self._client is not None and self._keeper is not None and not self._keeper.done():
                return self._client
            await self._drop()
            now = time.monotonic()
            if now < self._retry_at:
                raise ToolUnavailable(
                    f"MCP server {self.spec.name} failed to start; next try in "
                    f"{self._retry_at - now:.1f} s",
                    tool=self.spec.name,
                )
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()
            self._stop = asyncio.Event()
            self._keeper = loop.create_task(
                self._keep(ready, self._stop), name=f"mcp-{self.spec.name}"
            )
            self.counters["starts"] += 1
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.shield(ready)
            except Exception as exc:  # TimeoutError included
                await self._drop()
                self._fail_backoff()
                name = self.spec.name
                if isinstance(exc, TimeoutError):
                    msg = f"MCP server {name} did not start in {self.spec.timeout_s:g} s"
                    raise ToolTimeout(msg, tool=name) from None
                msg = f"MCP server {name} unavailable: {_describe(exc)}"
                raise ToolUnavailable(msg, tool=name) from None
            self._backoff_s = 0.0
            self._tools = {}
            return self._client

    def _fail_backoff(self) -> None:
        self.counters["start_failures"] += 1
        self._backoff_s = min(30.0, max(1.0, self._backoff_s * 2))
        self._retry_at = time.monotonic() + self._backoff_s

    async def _drop(self) -> None:
        keeper, self._keeper = self._keeper, None
        if self._stop is not None:
            self._stop.set()
        if keeper is not None and not keeper.done():
            try:
                async with asyncio.timeout(10):
                    await asyncio.shield(keeper)
            except (TimeoutError, Exception):
                keeper.cancel()
        self._client = None

    async def tools(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The server's tools by name (``mcp`` ``Tool`` objects), listed once per session."""
        client = await self._connected(time.monotonic() + self.spec.timeout_s)
        deadline = time.monotonic() + (timeout_s or self.spec.timeout_s)
        if not self._tools:
            tools: dict[str, Any] = {}
            cursor = None
            for _ in range(100):  # pages; a server that never ends its listing is cut off
                res = await self._rpc(client.list_tools(cursor=cursor), deadline, "tools/list")
                tools.update({t.name: t for t in res.tools})
                cursor = res.next_cursor
                if not cursor:
                    break
            self._tools = tools
        return self._tools

    async def call(
        self, tool: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> Any:
        """Call ``tool``; the ``mcp`` ``CallToolResult`` (raises typed errors only)."""
        wait_s = timeout_s or self.spec.timeout_s
        try:
            async with asyncio.timeout(wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise ToolTimeout(
                f"{self.spec.name}.{tool}: no free call slot in time", tool=tool
            ) from None
        try:
            client = await self._connected(time.monotonic() + self.spec.timeout_s)
            self.counters["calls"] += 1
            deadline = time.monotonic() + wait_s
            return await self._rpc(client.call_tool(tool, arguments), deadline, tool)
        finally:
            self._slots.release()

    async def _rpc(self, coro: Any, deadline: float, what: str) -> Any:
        name = f"{self.spec.name}.{what}"
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await coro
        except TimeoutError:
            self.counters["timeouts"] += 1
            raise ToolTimeout(f"{name}: no answer in time", tool=name) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _session_broken(exc):
                self.counters["crashes"] += 1
                async with self._lock:
                    await self._drop()
                raise ToolUnavailable(
                    f"{name}: server connection lost: {_describe(exc)}", tool=name
                ) from None
            self.counters["protocol_errors"] += 1
            raise ToolFailed(
                f"{name}: {_describe(exc)}", tool=name, reason="protocol_error"
            ) from None

    async def close(self) -> None:
        """End the session (and the server process, for stdio)."""
        async with self._lock:
            await self._drop()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions[:3])
    return f"{type(exc).__name__}: {exc}"[:300]


def _session_broken(exc: BaseException) -> bool:
    """Whether ``exc`` means the session is gone (server died, stream closed)."""
    import anyio
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, BaseExceptionGroup):
        return any(_session_broken(e) for e in exc.exceptions)
    if isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)):
        return True
    if isinstance(exc, (ConnectionError, EOFError, BrokenPipeError)):
        return True
    if isinstance(exc, MCPError):
        from mcp_types import CONNECTION_CLOSED

        return exc.code == CONNECTION_CLOSED
    return False


class MCPToolSet:
    """Tools of several MCP servers as ``server.tool`` (see the module docs).

    Use as an async context manager (``async with MCPToolSet(specs) as tools``)
    or call :meth:`aclose`. Servers start lazily, on first use.
    """

    def __init__(
        self,
        specs: Iterable[MCPServerSpec],
        *,
        errlog: TextIO | None = None,
        max_output_chars: int = 8000,
    ) -> None:
        self.connections = {
            s.name: MCPConnection(s, errlog=errlog) for s in specs if not s.disabled
        }
        self.max_output_chars = max_output_chars
        self.calls = 0

    async def __aenter__(self) -> MCPToolSet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every session."""
        for conn in self.connections.values():
            await conn.close()

    def _resolve(self, name: str) -> tuple[MCPConnection, str]:
        server, dot, tool = name.partition(".")
        conn = self.connections.get(server)
        if not dot or conn is None or not tool:
            known = ", ".join(sorted(self.connections)) or "none"
            raise UnknownTool(
                f"no tool {name!r} (servers: {known}; names are server.tool)", tool=name
            )
        allow = conn.spec.allow
        if allow is not None and tool not in allow:
            raise UnknownTool(f"tool {name!r} is not allowed here", tool=name)
        return conn, tool

    async def describe(self, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Every reachable tool: ``{"name", "description", "input_schema"}``.

        A server that cannot be reached is left out (and counted), so one dead
        server never hides the others' tools.
        """
        out: list[dict[str, Any]] = []
        for server, conn in sorted(self.connections.items()):
            try:
                tools = await conn.tools(timeout_s=timeout_s)
            except ToolError:
                conn.counters["list_failures"] += 1
                continue
            for name, t in sorted(tools.items()):
                if conn.spec.allow is not None and name not in conn.spec.allow:
                    continue
                out.append(
                    {
                        "name": f"{server}.{name}",
                        "description": t.description or "",
                        "input_schema": t.input_schema or {},
                    }
                )
        return out

    async def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        """Call ``server.tool``; a :class:`ToolResult` (an error *result* is not raised).

        Raises :class:`UnknownTool`, :class:`ToolUnavailable` or :class:`ToolTimeout`.
        """
        conn, tool = self._resolve(name)
        if not isinstance(arguments, dict):
            raise UnknownTool(f"arguments of {name} must be an object", tool=name)
        self.calls += 1
        start = time.monotonic()
        res = await conn.call(tool, arguments, timeout_s=timeout_s)
        texts = [c.text for c in res.content if getattr(c, "text", None)]
        text = "\n".join(texts)
        structured = res.structured_content if isinstance(res.structured_content, dict) else None
        if not text and structured is not None:
            text = json.dumps(structured, sort_keys=True)
        return ToolResult(
            tool=name,
            text=text[:MAX_OUTPUT_CHARS],
            structured=structured,
            is_error=bool(res.is_error),
            reason=_reason(text) if res.is_error else "",
            duration_ms=int((time.monotonic() - start) * 1000),
        )

    async def call_checked(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        """Like :meth:`call`, but an error result raises :class:`ToolFailed`."""
        result = await self.call(name, arguments, timeout_s=timeout_s)
        if result.is_error:
            raise ToolFailed(f"{name}: {result.text[:500]}", tool=name, reason=result.reason)
        return result

    # -- the executor's ToolBox ------------------------------------------------

    async def list_tools(self) -> list[dict[str, Any]]:
        """:meth:`describe` (the executor's ``ToolBox`` protocol)."""
        return await self.describe()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Call a tool; its text, ``error: ...`` if it failed (never raises)."""
        try:
            result = await self.call(name, arguments)
        except HivemeshError as exc:
            return f"error: {exc.code}: {exc}"[: self.max_output_chars]
        text = result.text[: self.max_output_chars]
        return f"error: {text}" if result.is_error else text
