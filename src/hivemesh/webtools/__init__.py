"""Web tools for agents, served over MCP.

* :mod:`hivemesh.webtools.fetch` -- fetch pages through named routes (proxies);
* :mod:`hivemesh.webtools.extract` -- tables, structured data, prices,
  pagination, DOM snapshots (lxml);
* :mod:`hivemesh.webtools.money` -- prices as shops write them, any locale;
* :mod:`hivemesh.webtools.server` -- the MCP server (``hivemesh webtools``).
"""
