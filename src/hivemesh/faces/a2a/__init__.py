"""The node as an A2A agent (a2a-sdk): an Agent Card describing the mesh's
roles, and goals submitted as A2A tasks whose states follow the plan tree.

::

    hivemesh a2a --data-dir ~/.hivemesh --port 8766
    curl http://127.0.0.1:8766/.well-known/agent-card.json

See :mod:`hivemesh.faces.a2a.executor` for the mapping of plan statuses to
task states. Needs the ``a2a`` extra.
"""

from __future__ import annotations

from hivemesh.faces.a2a.card import build_card as build_card
from hivemesh.faces.a2a.executor import PlanExecutor as PlanExecutor
from hivemesh.faces.a2a.serve import build_app as build_app
from hivemesh.faces.a2a.serve import serve_a2a as serve_a2a

__all__ = ["PlanExecutor", "build_app", "build_card", "serve_a2a"]
