"""A small MCP server for the tool-source tests: run as a script over stdio.

Tools: ``echo`` (returns its text), ``sleep`` (waits), ``crash`` (the process
exits at once, mid-call), ``fail`` (an error result with a code), ``pid``.
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("test-tools", log_level="ERROR")


@app.tool()
def echo(text: str) -> str:
    """Return text unchanged."""
    return text


@app.tool()
async def sleep(seconds: float) -> str:
    """Wait, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@app.tool()
def crash() -> str:
    """End the server process mid-call."""
    os._exit(3)


@app.tool()
def fail() -> str:
    """Answer with an error result."""
    raise ToolError("boom_code: this tool always fails")


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    app.run("stdio")
