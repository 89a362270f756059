"""User-facing surfaces: the CLI (:mod:`~hivemesh.faces.cli`), the web
dashboard, the MCP server (:mod:`~hivemesh.faces.mcp`), the A2A agent
(:mod:`~hivemesh.faces.a2a`), the live plan tree in a terminal
(:mod:`~hivemesh.faces.plan_watch`) and framework adapters (LangGraph).
Each is a thin front of the node's command table."""
