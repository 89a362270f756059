"""``hivemesh plan``: the leaderless planner (see :mod:`hivemesh.roles.run`).

Importing it also registers the ``plan.goal``/``plan.show``/``plan.cancel``
control operations (:mod:`hivemesh.roles.meshops`), so every daemon started
by the CLI (``hivemesh up``, ``hivemesh agent``) serves them.
"""

import hivemesh.roles.meshops as _meshops  # noqa: F401 - registers control ops
from hivemesh.roles.run import register as register

__all__ = ["register"]
