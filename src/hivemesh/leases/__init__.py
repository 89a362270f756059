"""Leases with fencing tokens, behind one small backend protocol.

::

    backend = open_backend("redis://127.0.0.1:6379/0")
    client = LeaseClient(backend)
    async with client.hold("browser-session-7", ttl_ms=5000) as held:
        await do_work(fencing_token=held.token)   # the resource checks it

The resource side keeps a :class:`FencingGuard` and calls ``guard.check(token)``
before every side effect. See :mod:`hivemesh.leases._api` for the clock
assumptions and each backend module for its guarantees.
"""

from hivemesh.leases._api import DRIFT_MS as DRIFT_MS
from hivemesh.leases._api import DRIFT_RATIO as DRIFT_RATIO
from hivemesh.leases._api import MAX_TTL_MS as MAX_TTL_MS
from hivemesh.leases._api import MIN_TTL_MS as MIN_TTL_MS
from hivemesh.leases._api import FencingGuard as FencingGuard
from hivemesh.leases._api import Lease as Lease
from hivemesh.leases._api import LeaseBackend as LeaseBackend
from hivemesh.leases._api import LeaseInfo as LeaseInfo
from hivemesh.leases._api import validate_holder as validate_holder
from hivemesh.leases._api import validate_resource as validate_resource
from hivemesh.leases._api import validate_ttl_ms as validate_ttl_ms
from hivemesh.leases._client import HeldLease as HeldLease
from hivemesh.leases._client import LeaseClient as LeaseClient
from hivemesh.leases._open import open_backend as open_backend
from hivemesh.leases._quorum import LocalQuorum as LocalQuorum
from hivemesh.leases._quorum import QuorumLeaseBackend as QuorumLeaseBackend
from hivemesh.leases._quorum import VoterServer as VoterServer

__all__ = [
    "DRIFT_MS",
    "DRIFT_RATIO",
    "MAX_TTL_MS",
    "MIN_TTL_MS",
    "FencingGuard",
    "HeldLease",
    "Lease",
    "LeaseBackend",
    "LeaseClient",
    "LeaseInfo",
    "LocalQuorum",
    "QuorumLeaseBackend",
    "VoterServer",
    "open_backend",
    "validate_holder",
    "validate_resource",
    "validate_ttl_ms",
]
