"""The lease history checker now lives with the simulator
(:mod:`hivemesh.sim.lease_history`); the lease tests import it from here."""

from hivemesh.sim.lease_history import Op, Violation, check_history

__all__ = ["Op", "Violation", "check_history"]
