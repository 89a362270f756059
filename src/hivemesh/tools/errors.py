"""The MCP tool client's errors (subclasses of :class:`hivemesh.errors.TransportError`).

::

    TransportError
    └── ToolError                    an MCP tool call failed (has .tool, .reason)
        ├── ToolUnavailable          server would not start, is unreachable or died
        ├── ToolTimeout(ToolError, DeadlineExceeded)
        ├── UnknownTool              no such tool on any configured server
        └── ToolFailed               the tool answered with an error result
"""

from __future__ import annotations

from hivemesh.errors import DeadlineExceeded, TransportError

__all__ = [
    "ToolError",
    "ToolFailed",
    "ToolTimeout",
    "ToolUnavailable",
    "UnknownTool",
]


class ToolError(TransportError):
    """An MCP tool call failed. ``tool`` names it (``server.tool``);
    ``reason`` is the server's error code when it sent one (``captcha_required``)."""

    code = "tool_error"

    def __init__(self, message: str, *, tool: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.tool = tool
        self.reason = reason


class ToolUnavailable(ToolError):
    """The tool's MCP server could not be started or reached, or it died."""

    code = "tool_unavailable"


class ToolTimeout(ToolError, DeadlineExceeded):
    """A tool call (or connecting to its server) passed its deadline."""

    code = "tool_timeout"


class UnknownTool(ToolError):
    """No configured MCP server offers this tool."""

    code = "unknown_tool"


class ToolFailed(ToolError):
    """The tool ran and answered with an error result."""

    code = "tool_failed"
