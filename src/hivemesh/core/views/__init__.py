"""Deterministic views (reducers) over the swarm journal.

* :class:`ContextView` -- shared agent state in loro CRDT documents
  (``ctx.update``);
* :class:`MaxRegisterView` -- monotone integers for fencing tokens
  (``reg.max``);
* :class:`NamesView` -- name -> address (``name.claim``, ``name.release``);
* :class:`BlobIndex` -- content-addressed blobs announced in the journal
  (``blob.put``), fetched on demand by :class:`BlobFetcher`.

Every view satisfies :class:`View`: see :mod:`hivemesh.core.views.base`.
"""

from hivemesh.core.views.base import View as View
from hivemesh.core.views.context import Context as Context
from hivemesh.core.views.context import ContextView as ContextView
from hivemesh.core.views.names import NamesView as NamesView
from hivemesh.core.views.registers import MaxRegisterView as MaxRegisterView

__all__ = ["Context", "ContextView", "MaxRegisterView", "NamesView", "View"]
