"""The mesh as an MCP server: a desktop assistant or IDE agent joins the
mesh through its local node.

::

    hivemesh up --data-dir ~/.hivemesh &           # the local node
    hivemesh mcp --data-dir ~/.hivemesh            # MCP over stdio
    hivemesh mcp --http --port 8765                # streamable HTTP on 127.0.0.1

Every tool is one command of the node's command table
(:mod:`hivemesh.faces.mcp.tools`); errors carry the command's stable code;
context documents and plan trees are resources with change notifications
(:mod:`hivemesh.faces.mcp.server`). Needs the ``mcp`` extra.
"""

from __future__ import annotations

from hivemesh.faces.mcp.serve import serve_http as serve_http
from hivemesh.faces.mcp.serve import serve_stdio as serve_stdio
from hivemesh.faces.mcp.server import MeshMcp as MeshMcp
from hivemesh.faces.mcp.server import context_uri as context_uri
from hivemesh.faces.mcp.server import plan_uri as plan_uri
from hivemesh.faces.mcp.tools import TOOLS as TOOLS

__all__ = ["TOOLS", "MeshMcp", "context_uri", "plan_uri", "serve_http", "serve_stdio"]
