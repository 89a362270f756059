"""Chaos runs of real ``hivemesh up`` daemons in Linux network namespaces.

``hivemesh chaos [--scenario NAME] [--nodes N] [--duration S] [--seed N] [--json]``
starts one daemon per namespace (:mod:`hivemesh.chaos.hosts`, over
:mod:`hivemesh.netlab`), puts acknowledged writes, leases with a fenced
resource and telemetry on them (:mod:`hivemesh.chaos.workload`), injects the
faults its seed picks (:mod:`hivemesh.chaos.scenarios`: ``kill -9`` and
restart, SIGSTOP past the lease TTL, partitions of every shape, packet
loss, clock offsets through libfaketime, a full disk, a restore from an
older store copy), heals, and checks (:mod:`hivemesh.chaos.runner`). The
report is a verdict, the seed and the fault timeline. Needs root.

Three scenarios run the other capabilities under faults: ``audit`` (the
price audit's roles as daemons, the fixture in a host of its own, the
audit's checks as chaos checks: :mod:`hivemesh.chaos.audit`), ``broker``
(``--mesh nats://`` on a NATS server in the lab, killed and cut off) and
``nat`` (nodes behind NAT routers over QUIC, relayed and punched). See
docs/chaos.md.

This is a test tool: nothing in a node imports it.
"""

from hivemesh.chaos.runner import Check as Check
from hivemesh.chaos.runner import Report as Report
from hivemesh.chaos.runner import run_scenario as run_scenario
from hivemesh.chaos.scenarios import CI_SET as CI_SET
from hivemesh.chaos.scenarios import SCENARIOS as SCENARIOS
from hivemesh.chaos.scenarios import Fault as Fault
from hivemesh.chaos.scenarios import Scenario as Scenario
from hivemesh.chaos.scenarios import schedule as schedule

__all__ = [
    "CI_SET",
    "SCENARIOS",
    "Check",
    "Fault",
    "Report",
    "Scenario",
    "run_scenario",
    "schedule",
]
