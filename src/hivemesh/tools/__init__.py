"""Tool sources for agents: MCP servers plugged in by configuration.

* :mod:`hivemesh.tools.spec` -- servers in the desktop MCP client format
  (``{"mcpServers": {...}}``; ``hivemesh agent --mcp FILE``, ``[mcp]`` in
  ``config.toml``); no heavy imports;
* :mod:`hivemesh.tools.mcp_client` -- sessions over stdio or streamable HTTP
  with deadlines, typed errors and reconnection; :class:`MCPToolSet` is the
  executor's tool box. ``mcp`` is imported only there, when a session opens.
"""
