"""Errors of the audit application (subclasses of the :mod:`hivemesh.errors` taxonomy)."""

from __future__ import annotations

from hivemesh.errors import InvalidArgument

__all__ = ["UnknownEscalation"]


class UnknownEscalation(InvalidArgument):
    """An answer names a question (escalation id) that no audit in this
    node's journal asked: check ``hivemesh inbox`` for the open ones."""

    code = "unknown_escalation"
