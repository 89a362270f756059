"""Checkers for recorded histories of real or simulated runs.

:mod:`hivemesh.verify.linearizability` checks a history of lease calls and
returns (exclusion, fencing-token order, no spurious failure). The simulator's
leases workload, the real-process lease tests and the chaos runner
(:mod:`hivemesh.chaos`) all feed it their histories.
"""

from hivemesh.verify.linearizability import Kind as Kind
from hivemesh.verify.linearizability import Op as Op
from hivemesh.verify.linearizability import Outcome as Outcome
from hivemesh.verify.linearizability import Violation as Violation
from hivemesh.verify.linearizability import check_history as check_history

__all__ = ["Kind", "Op", "Outcome", "Violation", "check_history"]
