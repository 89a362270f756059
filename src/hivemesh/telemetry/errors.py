"""Telemetry's errors (subclasses of :mod:`hivemesh.errors` categories).

::

    DecodeError
    └── InvalidRecord           a metric record that fails the schema
        └── UnknownField
    LocalProtocolError
    ├── SpoolFull               the sender's spool is full: the record was dropped
    └── TelemetryRefused        the collector refused hand-sent telemetry (has .reason)
    TransportError
    ├── SinkUnavailable         an external sink failed for now (retried until written)
    └── SinkRefused             an external sink refuses the body itself (permanent)
"""

from __future__ import annotations

from hivemesh.errors import DecodeError, LocalProtocolError, TransportError

__all__ = [
    "InvalidRecord",
    "SinkRefused",
    "SinkUnavailable",
    "SpoolFull",
    "TelemetryRefused",
    "UnknownField",
]


class InvalidRecord(DecodeError):
    """A metric record or batch is well-formed bytes but breaks the record schema."""

    code = "invalid_record"


class UnknownField(InvalidRecord):
    """A metric record or batch carries a field the schema does not define."""

    code = "unknown_field"


class SpoolFull(LocalProtocolError):
    """The sender's telemetry spool is at its bound; the record was dropped (counted)."""

    code = "spool_full"


class SinkUnavailable(TransportError):
    """An external telemetry sink (InfluxDB, ClickHouse, ...) cannot take a write now."""

    code = "sink_unavailable"


class SinkRefused(TransportError):
    """An external telemetry sink refuses the written body itself (retrying cannot help)."""

    code = "sink_refused"


class TelemetryRefused(LocalProtocolError):
    """The collector refused telemetry we sent by hand; :attr:`reason` is its code
    (``unknown_field``, ``invalid_record``, ``untrusted_author``, ``busy``, ...)."""

    code = "telemetry_refused"

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason
