"""One view of each kind per node, shared by every adapter on it.

A view added to a node stays registered for the node's life (the daemon
feeds it every event), so an adapter that added its own view each time it
was created -- a saver per request in a server -- would grow the node
without bound. :func:`shared_view` keeps one per node and view class.
"""

from __future__ import annotations

import weakref
from typing import Any, TypeVar

from hivemesh.node import Node

__all__ = ["shared_view"]

V = TypeVar("V")

_VIEWS: weakref.WeakKeyDictionary[Node, dict[type[Any], Any]] = weakref.WeakKeyDictionary()


def shared_view(node: Node, cls: type[V]) -> V:
    """The node's instance of view ``cls``, added to it on first use."""
    views = _VIEWS.setdefault(node, {})
    view = views.get(cls)
    if view is None:
        view = cls()
        node.add_view(view)
        views[cls] = view
    return view
