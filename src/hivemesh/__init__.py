"""hivemesh: a leaderless coordination fabric for teams of AI agents.

Every node keeps a signed, hash-chained feed of what it did; the swarm journal
is the union of feeds; all shared state is a deterministic view over it.

The public surface is :data:`__all__`::

    import hivemesh

    async with hivemesh.Node("./agent-a", bootstrap=["10.0.0.5:7420"]) as node:
        with node.context("task-42") as ctx:
            ctx["status"] = "running"

Names are imported lazily on first use so that ``import hivemesh`` (and every
``hivemesh`` CLI command) stays fast; ``from hivemesh import Node`` works as
usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hivemesh.client.blocking import Client as Client
    from hivemesh.config import Config as Config
    from hivemesh.config import load_config as load_config
    from hivemesh.errors import HivemeshError as HivemeshError
    from hivemesh.node import EventRecord as EventRecord
    from hivemesh.node import Node as Node

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Config",
    "EventRecord",
    "HivemeshError",
    "Node",
    "__version__",
    "load_config",
]

_LAZY = {
    "Client": "hivemesh.client.blocking",
    "Config": "hivemesh.config",
    "EventRecord": "hivemesh.node",
    "HivemeshError": "hivemesh.errors",
    "Node": "hivemesh.node",
    "load_config": "hivemesh.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hivemesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
