"""The lease client's errors (subclasses of :class:`hivemesh.errors.CoordinationError`).

::

    CoordinationError
    ├── LeaseUnavailable        held by another holder (or no majority granted it)
    │   └── LeaseContended      lost a race after reaching some voters
    ├── LeaseLost               the lease expired or was taken while held
    └── StaleFencingToken       a fencing token older than one already seen

:class:`~hivemesh.errors.BackendUnavailable` (no majority, backend down) stays
in :mod:`hivemesh.errors`: the core's quorum raises it too.
"""

from __future__ import annotations

from hivemesh.errors import CoordinationError

__all__ = [
    "LeaseContended",
    "LeaseLost",
    "LeaseUnavailable",
    "StaleFencingToken",
]


class LeaseUnavailable(CoordinationError):
    """The lease is held by someone else (try_acquire) or could not be granted."""

    code = "lease_unavailable"


class LeaseContended(LeaseUnavailable):
    """Not granted, but the attempt reached some quorum voters before losing a race.

    Those voters may refuse other acquirers until the attempt's abort lands or
    its TTL passes: for a history checker the outcome is "maybe applied".
    """

    code = "lease_contended"


class LeaseLost(CoordinationError):
    """A lease expired or was taken over before renew/release."""

    code = "lease_lost"


class StaleFencingToken(CoordinationError):
    """A side effect was attempted with a fencing token older than one seen."""

    code = "stale_fencing_token"
