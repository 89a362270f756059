"""LangGraph on the mesh: a checkpointer that cannot fork and a shared store.

::

    from hivemesh.faces.langgraph import MeshCheckpointSaver, MeshStore

* :class:`MeshCheckpointSaver` -- a ``BaseCheckpointSaver`` whose threads
  live in the swarm's journal; a write that would fork a thread's chain
  fails with :class:`CheckpointConflict` (:mod:`.checkpoint` states the rule).
* :class:`MeshStore` -- a ``BaseStore`` (long-term memory) replicated to
  every node, last writer wins per item (:mod:`.store`).
* :class:`ChainView` -- the deterministic view of the checkpoint trees.

Needs the ``langgraph`` extra (``pip install 'hivemesh[langgraph]'``); the
names are imported on first use, so :mod:`.errors` and :mod:`.chain` load
without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports

if TYPE_CHECKING:
    from hivemesh.faces.langgraph.chain import ChainView as ChainView
    from hivemesh.faces.langgraph.checkpoint import MeshCheckpointSaver as MeshCheckpointSaver
    from hivemesh.faces.langgraph.errors import CheckpointConflict as CheckpointConflict
    from hivemesh.faces.langgraph.store import MeshStore as MeshStore

__all__ = ["ChainView", "CheckpointConflict", "MeshCheckpointSaver", "MeshStore"]

_WHERE = {
    "ChainView": "hivemesh.faces.langgraph.chain",
    "CheckpointConflict": "hivemesh.faces.langgraph.errors",
    "MeshCheckpointSaver": "hivemesh.faces.langgraph.checkpoint",
    "MeshStore": "hivemesh.faces.langgraph.store",
}

__getattr__ = lazy_exports(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
