"""User-facing surfaces: CLI, dashboard, MCP server, framework adapters."""
