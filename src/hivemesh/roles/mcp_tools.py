"""Executor tools from an MCP server.

:class:`MCPToolBox` adapts an open ``mcp`` client (``mcp.Client`` in 2.x,
over stdio, HTTP or in memory) to the executor's
:class:`~hivemesh.roles.executor.ToolBox`. It is duck-typed, so ``mcp`` stays
an optional dependency: anything with ``await list_tools()`` (``.tools`` with
``name``, ``description``, ``input_schema``) and ``await call_tool(name,
arguments)`` (``.content`` items with ``.text``, ``.is_error``) works.
An allow-list limits what the model may call; a tool error comes back as
text for the model to react to, never as an exception.

For servers named in configuration (``hivemesh agent --mcp``, ``[mcp]``),
with deadlines, typed errors and restarts, use
:class:`hivemesh.tools.mcp_client.MCPToolSet`; this adapter is for a client
session the caller already holds (an in-memory ``mcp.Client(app)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["MCPToolBox"]


class MCPToolBox:
    """:class:`~hivemesh.roles.executor.ToolBox` over an MCP client session."""

    def __init__(
        self, client: Any, *, allow: Iterable[str] | None = None, max_output_chars: int = 8000
    ) -> None:
        self.client = client
        self.allow = frozenset(allow) if allow is not None else None
        self.max_output_chars = max_output_chars
        self.calls = 0

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools (allowed ones only): name, description, schema."""
        res = await self.client.list_tools()
        out = []
        for t in getattr(res, "tools", res):
            if self.allow is not None and t.name not in self.allow:
                continue
            schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}
            out.append({"name": t.name, "description": t.description or "", "input_schema": schema})
        return out

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Call one tool; its text output (prefixed ``error:`` if it failed)."""
        if self.allow is not None and name not in self.allow:
            return f"error: tool {name!r} is not allowed here"
        self.calls += 1
        res = await self.client.call_tool(name, arguments)
        texts = [c.text for c in getattr(res, "content", ()) if getattr(c, "text", None)]
        text = "\n".join(texts)[: self.max_output_chars]
        failed = getattr(res, "is_error", None) or getattr(res, "isError", False)
        return f"error: {text}" if failed else text
