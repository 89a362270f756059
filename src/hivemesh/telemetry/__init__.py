"""Fleet telemetry and health.

Agents record through :class:`Metrics` (``node.metrics``) into a durable
:class:`Spool`; a :class:`Sender` ships batches to the node named
``metrics-collector``, whose :class:`Collector` validates, de-duplicates,
reports gaps and stores into DuckDB (:class:`MetricsStore`), mirrored to
optional sinks. A :class:`HealthMonitor` turns membership and metrics into
alerts delivered by :class:`WebhookNotifier` (Slack, PagerDuty Events v2).
:class:`NodeTelemetry` and :class:`CollectorNode` are the wiring a node uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports

if TYPE_CHECKING:
    from hivemesh.telemetry.alerting import HealthService as HealthService
    from hivemesh.telemetry.alerting import WebhookNotifier as WebhookNotifier
    from hivemesh.telemetry.alerting import pagerduty_payload as pagerduty_payload
    from hivemesh.telemetry.alerting import slack_payload as slack_payload
    from hivemesh.telemetry.collector import Collector as Collector
    from hivemesh.telemetry.collector import SenderReport as SenderReport
    from hivemesh.telemetry.health import Alert as Alert
    from hivemesh.telemetry.health import CallStats as CallStats
    from hivemesh.telemetry.health import HealthMonitor as HealthMonitor
    from hivemesh.telemetry.health import NodeStatus as NodeStatus
    from hivemesh.telemetry.health import Thresholds as Thresholds
    from hivemesh.telemetry.health import Transition as Transition
    from hivemesh.telemetry.node import COLLECTOR_NAME as COLLECTOR_NAME
    from hivemesh.telemetry.node import CollectorNode as CollectorNode
    from hivemesh.telemetry.node import NodeTelemetry as NodeTelemetry
    from hivemesh.telemetry.recorder import Metrics as Metrics
    from hivemesh.telemetry.sender import Deliver as Deliver
    from hivemesh.telemetry.sender import Sender as Sender
    from hivemesh.telemetry.spool import Spool as Spool
    from hivemesh.telemetry.store import MetricsStore as MetricsStore

__all__ = [
    "COLLECTOR_NAME",
    "Alert",
    "CallStats",
    "Collector",
    "CollectorNode",
    "Deliver",
    "HealthMonitor",
    "HealthService",
    "Metrics",
    "MetricsStore",
    "NodeStatus",
    "NodeTelemetry",
    "Sender",
    "SenderReport",
    "Spool",
    "Thresholds",
    "Transition",
    "WebhookNotifier",
    "pagerduty_payload",
    "slack_payload",
]

# Imported on first use (see hivemesh._lazy).
__getattr__ = lazy_exports(
    __name__,
    {
        "HealthService": "hivemesh.telemetry.alerting",
        "WebhookNotifier": "hivemesh.telemetry.alerting",
        "pagerduty_payload": "hivemesh.telemetry.alerting",
        "slack_payload": "hivemesh.telemetry.alerting",
        "Collector": "hivemesh.telemetry.collector",
        "SenderReport": "hivemesh.telemetry.collector",
        "Alert": "hivemesh.telemetry.health",
        "CallStats": "hivemesh.telemetry.health",
        "HealthMonitor": "hivemesh.telemetry.health",
        "NodeStatus": "hivemesh.telemetry.health",
        "Thresholds": "hivemesh.telemetry.health",
        "Transition": "hivemesh.telemetry.health",
        "COLLECTOR_NAME": "hivemesh.telemetry.node",
        "CollectorNode": "hivemesh.telemetry.node",
        "NodeTelemetry": "hivemesh.telemetry.node",
        "Metrics": "hivemesh.telemetry.recorder",
        "Deliver": "hivemesh.telemetry.sender",
        "Sender": "hivemesh.telemetry.sender",
        "Spool": "hivemesh.telemetry.spool",
        "MetricsStore": "hivemesh.telemetry.store",
    },
)
