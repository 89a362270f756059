"""Errors of the LangGraph adapter (subclasses of :class:`hivemesh.errors.CoordinationError`).

::

    CoordinationError
    └── CheckpointConflict   another writer holds the thread, or wrote past our view of it

This module imports nothing of LangGraph, so error codes resolve without it.
"""

from __future__ import annotations

from hivemesh.errors import CoordinationError

__all__ = ["CheckpointConflict"]


class CheckpointConflict(CoordinationError):
    """A checkpoint, writes or delete was refused so the thread's chain cannot fork.

    Raised when another writer holds the thread's lease, when the thread's
    head moved on (written by another writer) since the state this write
    extends, or when the lease was lost before the write was confirmed. In
    that last case the outcome is unknown, as after a timeout: the write may
    be in the journal, where anything the newer writer writes ranks above it;
    if the newer writer has seen it, it continues from it. Either way the
    chain does not fork. Re-read the thread (``get_tuple``) and retry from
    its head, or give up: nothing was silently overwritten.
    """

    code = "checkpoint_conflict"
