"""``hivemesh plan``: the leaderless planner (see :mod:`hivemesh.roles.run`)."""

from hivemesh.roles.run import register as register

__all__ = ["register"]
