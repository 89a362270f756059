"""The web dashboard's errors (subclasses of :mod:`hivemesh.errors` categories).

::

    RemoteProtocolError
    ├── DashboardUnauthorized   a request without the dashboard's token (HTTP 401)
    └── DashboardForbidden      a request from another site or host name (HTTP 403)
    LocalProtocolError
    └── DashboardClientSlow     a browser that did not keep up: its stream is dropped
        └── DashboardClientStalled   one that stopped reading: its connection is closed

Each is counted by its code in the dashboard's statistics (``/api/health``).
"""

from __future__ import annotations

from hivemesh.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DashboardClientSlow",
    "DashboardClientStalled",
    "DashboardForbidden",
    "DashboardUnauthorized",
]


class DashboardUnauthorized(RemoteProtocolError):
    """The request lacks the dashboard's token, or carries a wrong one."""

    code = "dashboard_unauthorized"


class DashboardForbidden(RemoteProtocolError):
    """A write from another origin, or a request naming a host the dashboard
    does not serve (a DNS-rebinding page)."""

    code = "dashboard_forbidden"


class DashboardClientSlow(LocalProtocolError):
    """A browser's queue of updates filled up: its event stream is closed
    (it reconnects and starts from a fresh snapshot)."""

    code = "dashboard_client_slow"


class DashboardClientStalled(DashboardClientSlow):
    """A browser took no data for a whole write deadline: its connection is
    closed, so it holds no slot among the dashboard's clients."""

    code = "dashboard_client_stalled"
