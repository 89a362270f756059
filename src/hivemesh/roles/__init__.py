"""Planner roles: agents that read the plan view and return events to append.

* :class:`Decomposer` -- proposes splits of open goals (one strategy each);
* :class:`Scorer` -- votes on competing proposals with scores and notes;
* :class:`Executor` -- claims tasks it can do, runs them, publishes results;
* :class:`Observer` -- never writes; renders the tree from the journal.

:class:`MCPToolBox` gives executors the tools of an open MCP client session;
:class:`hivemesh.tools.mcp_client.MCPToolSet` those of configured MCP servers
(``hivemesh agent --mcp``).

Roles do no networking: a driver polls them (:class:`LocalSwarm` in-process,
:class:`RoleDriver` on a running :class:`hivemesh.Node`, which is what
``hivemesh agent --role ROLE`` runs) and appends what they emit. A custom
role is any object with ``name``, ``me`` and ``poll(view, now_ms)``::

    async with hivemesh.Node("./agent") as node:
        driver = RoleDriver(node, MyRole(node.daemon.identity.public))
        await driver.run(stop_event)
 See
:mod:`hivemesh.roles.base` for the contract and :func:`failure_events` for
what failure detection writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports

if TYPE_CHECKING:
    from hivemesh.roles.agent import RoleDriver as RoleDriver
    from hivemesh.roles.base import Action as Action
    from hivemesh.roles.base import Emit as Emit
    from hivemesh.roles.base import Job as Job
    from hivemesh.roles.base import Role as Role
    from hivemesh.roles.base import failure_events as failure_events
    from hivemesh.roles.decomposer import Decomposer as Decomposer
    from hivemesh.roles.executor import Executor as Executor
    from hivemesh.roles.executor import ToolBox as ToolBox
    from hivemesh.roles.local import LocalJournal as LocalJournal
    from hivemesh.roles.mcp_tools import MCPToolBox as MCPToolBox
    from hivemesh.roles.observer import Observer as Observer
    from hivemesh.roles.scorer import Scorer as Scorer
    from hivemesh.roles.swarm import LocalSwarm as LocalSwarm

__all__ = [
    "Action",
    "Decomposer",
    "Emit",
    "Executor",
    "Job",
    "LocalJournal",
    "LocalSwarm",
    "MCPToolBox",
    "Observer",
    "Role",
    "RoleDriver",
    "Scorer",
    "ToolBox",
    "failure_events",
]

# Imported on first use (see hivemesh._lazy).
__getattr__ = lazy_exports(
    __name__,
    {
        "RoleDriver": "hivemesh.roles.agent",
        "Action": "hivemesh.roles.base",
        "Emit": "hivemesh.roles.base",
        "Job": "hivemesh.roles.base",
        "Role": "hivemesh.roles.base",
        "failure_events": "hivemesh.roles.base",
        "Decomposer": "hivemesh.roles.decomposer",
        "Executor": "hivemesh.roles.executor",
        "ToolBox": "hivemesh.roles.executor",
        "LocalJournal": "hivemesh.roles.local",
        "MCPToolBox": "hivemesh.roles.mcp_tools",
        "Observer": "hivemesh.roles.observer",
        "Scorer": "hivemesh.roles.scorer",
        "LocalSwarm": "hivemesh.roles.swarm",
    },
)
