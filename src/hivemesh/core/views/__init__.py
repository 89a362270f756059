"""Deterministic views (reducers) over the swarm journal.

* :class:`ContextView` -- shared agent state in loro CRDT documents
  (``ctx.update``);
* :class:`MaxRegisterView` -- monotone integers for fencing tokens
  (``reg.max``);
* :class:`NamesView` -- name -> address (``name.claim``, ``name.release``);
* :class:`BlobIndex` -- content-addressed blobs announced in the journal
  (``blob.put``), fetched on demand by :class:`BlobFetcher`.

Every view satisfies :class:`View`: see :mod:`hivemesh.core.views.base`.
:func:`standard_views` builds the set a node registers with its journal.
"""

from __future__ import annotations

from hivemesh.core.views.base import View as View
from hivemesh.core.views.blobs import BlobFetcher as BlobFetcher
from hivemesh.core.views.blobs import BlobIndex as BlobIndex
from hivemesh.core.views.context import Context as Context
from hivemesh.core.views.context import ContextView as ContextView
from hivemesh.core.views.names import NamesView as NamesView
from hivemesh.core.views.registers import MaxRegisterView as MaxRegisterView

__all__ = [
    "BlobFetcher",
    "BlobIndex",
    "Context",
    "ContextView",
    "MaxRegisterView",
    "NamesView",
    "View",
    "standard_views",
]


def standard_views(author: bytes | None = None) -> list[View]:
    """One of each view; ``author`` (the local public key) enables context writes.

    The node keeps these objects to query them (``resolve``, ``context``,
    ``value``, ``info``) and registers each with ``journal.add_view``.
    """
    return [ContextView(author), MaxRegisterView(), NamesView(), BlobIndex()]
