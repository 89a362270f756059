"""The live web dashboard of a node: ``hivemesh dashboard``.

Any node serves it. The page shows the node's peers (health, link,
round-trip time), the plan trees growing as proposals are voted and leaves
claimed, the audit's progress and its escalations (answerable from the
page), the shared context's keys, the collector's alerts and telemetry
charts, updated live over server-sent events as the node's journal changes.
Everything on it is the answer of a typed command of
:mod:`hivemesh.commands`; the page is static files of this package (no build
step, nothing fetched at run time).

::

    hivemesh dashboard --data-dir ./agent-a            # http://127.0.0.1:7480/
    hivemesh dashboard --host 0.0.0.0 --token "$T"     # elsewhere: a token is required

or from Python, beside an in-process node::

    from hivemesh.faces.dashboard import DashboardServer, NodeSource

    async with hivemesh.Node("./agent-a") as node:
        async with DashboardServer(NodeSource(node), port=0) as dash:
            print(dash.url)

Parts: :mod:`~hivemesh.faces.dashboard.source` (how a node is read),
:mod:`~hivemesh.faces.dashboard.live` (which command answers which section,
and when), :mod:`~hivemesh.faces.dashboard.hub` (fan-out with bounded
per-browser queues), :mod:`~hivemesh.faces.dashboard.server` (HTTP, the
token, the stream), :mod:`~hivemesh.faces.dashboard.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports

if TYPE_CHECKING:
    from hivemesh.faces.dashboard.server import DashboardServer as DashboardServer
    from hivemesh.faces.dashboard.source import ControlSource as ControlSource
    from hivemesh.faces.dashboard.source import NodeSource as NodeSource
    from hivemesh.faces.dashboard.source import Source as Source

__all__ = ["ControlSource", "DashboardServer", "NodeSource", "Source"]

_WHERE = {
    "ControlSource": "hivemesh.faces.dashboard.source",
    "DashboardServer": "hivemesh.faces.dashboard.server",
    "NodeSource": "hivemesh.faces.dashboard.source",
    "Source": "hivemesh.faces.dashboard.source",
}

__getattr__ = lazy_exports(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
