"""Lease records, the backend protocol, validation and the fencing guard.

Theory of operation
-------------------
A *lease* is a time-bounded, exclusive right to act on a named resource. It
is a liveness hint, not a safety guarantee: a paused process can wake up after
its lease expired and still believe it holds it. Safety comes from the
*fencing token*: every grant of a resource carries an integer strictly greater
than every earlier grant of that resource (across holders, crashes and backend
restarts), and the place where the side effect happens keeps the highest token
it has seen and refuses older ones (:class:`FencingGuard`).

Clocks. A lease's validity is judged by the *backend's* clock (Redis ``PX``
expiry, the expiry stored in a NATS KV value, the voters' clocks of the quorum
backend). The holder cannot read that clock, so it believes its lease valid
only until ``invoke + ttl_ms * (1 - DRIFT_RATIO) - DRIFT_MS`` measured on its
own monotonic clock from the moment it *sent* the request (before the backend
could have started the TTL). This is safe as long as clocks run at rates
within ``DRIFT_RATIO`` of each other and process pauses are not longer than
the margin -- a pause *is* the case fencing tokens exist for.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hivemesh.errors import InvalidArgument
from hivemesh.leases.errors import LeaseLost, StaleFencingToken

__all__ = [
    "DRIFT_MS",
    "DRIFT_RATIO",
    "MAX_TTL_MS",
    "MIN_TTL_MS",
    "FencingGuard",
    "Lease",
    "LeaseBackend",
    "LeaseInfo",
    "validate_holder",
    "validate_resource",
    "validate_ttl_ms",
]

#: Shortest accepted lease (shorter ones would expire before a renewal lands).
MIN_TTL_MS = 50
#: Longest accepted lease (one day); use renewals for longer work.
MAX_TTL_MS = 86_400_000
#: Assumed bound on the relative clock-rate difference between holder and backend.
DRIFT_RATIO = 0.01
#: Fixed safety margin subtracted from every lease the holder believes in.
DRIFT_MS = 5

_RESOURCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}")
_HOLDER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}")


def validate_resource(resource: object) -> str:
    """Return ``resource`` if it is a valid resource name, else raise InvalidArgument.

    A resource name is 1-200 characters: ASCII letters, digits and ``._:/@+=-``,
    starting with a letter or digit.
    """
    if not isinstance(resource, str) or _RESOURCE_RE.fullmatch(resource) is None:
        raise InvalidArgument(
            f"invalid resource name {resource!r}: 1-200 chars of [A-Za-z0-9._:/@+=-], "
            "starting with a letter or digit"
        )
    return resource


def validate_holder(holder: object) -> str:
    """Return ``holder`` if it is a valid holder id, else raise InvalidArgument."""
    if not isinstance(holder, str) or _HOLDER_RE.fullmatch(holder) is None:
        raise InvalidArgument(
            f"invalid holder id {holder!r}: 1-128 chars of [A-Za-z0-9._:/@+=-], "
            "starting with a letter or digit"
        )
    return holder


def validate_ttl_ms(ttl_ms: object) -> int:
    """Return ``ttl_ms`` if it is an int in [MIN_TTL_MS, MAX_TTL_MS], else raise."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise InvalidArgument(f"ttl_ms must be an int, got {type(ttl_ms).__name__}")
    if not MIN_TTL_MS <= ttl_ms <= MAX_TTL_MS:
        raise InvalidArgument(f"ttl_ms={ttl_ms} out of range [{MIN_TTL_MS}, {MAX_TTL_MS}]")
    return ttl_ms


def skew_ms_from(query: dict[str, list[str]], default: int, url: str) -> int:
    """The ``skew_ms`` option of a backend URL's parsed query (0-60000), else raise."""
    try:
        skew = int(query.get("skew_ms", [str(default)])[0])
    except ValueError as e:
        raise InvalidArgument(f"skew_ms must be an int in {url!r}") from e
    if not 0 <= skew <= 60_000:
        raise InvalidArgument(f"skew_ms={skew} out of range [0, 60000]")
    return skew


def believed_expiry(invoked_at: float, ttl_ms: int) -> float:
    """Local monotonic time until which a lease requested at ``invoked_at`` is safe."""
    return invoked_at + (ttl_ms * (1.0 - DRIFT_RATIO) - DRIFT_MS) / 1000.0


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease as its holder sees it.

    ``expires`` is on the holder's ``time.monotonic()`` clock and already
    includes the drift margin (see the module docstring): before it the lease
    is valid, after it the holder must stop acting on the resource.
    """

    resource: str
    holder: str
    fencing_token: int
    ttl_ms: int
    expires: float

    def remaining_ms(self, now: float | None = None) -> float:
        """Milliseconds of believed validity left (negative once expired)."""
        t = time.monotonic() if now is None else now
        return (self.expires - t) * 1000.0

    def valid(self, now: float | None = None) -> bool:
        """Whether the holder may still act on the resource."""
        return self.remaining_ms(now) > 0

    def check(self, now: float | None = None) -> int:
        """Return the fencing token if the lease is still valid, else raise LeaseLost.

        Call this right before a side effect and pass the token to the
        resource, which checks it with a :class:`FencingGuard`.
        """
        if not self.valid(now):
            raise LeaseLost(f"lease on {self.resource!r} (token {self.fencing_token}) expired")
        return self.fencing_token


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """What a backend reports about a resource's current lease (``show``)."""

    resource: str
    holder: str
    fencing_token: int
    remaining_ms: int


@runtime_checkable
class LeaseBackend(Protocol):
    """The small protocol every lease backend implements.

    Every method takes ``timeout_s``, a hard deadline for the whole call; on
    expiry or any connection failure it raises
    :class:`~hivemesh.errors.BackendUnavailable` and the outcome is *unknown*
    (the operation may or may not have taken effect). Arguments are already
    validated by :class:`~hivemesh.leases.LeaseClient`.
    """

    @property
    def url(self) -> str:
        """The URL this backend was opened with (no credentials)."""
        ...

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Grant the lease if free (or expired): its new fencing token; None if held."""
        ...

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Extend the lease to ``ttl_ms`` from now if ``holder``/``token`` still hold it."""
        ...

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Free the lease if ``holder``/``token`` still hold it; False otherwise."""
        ...

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """The current unexpired lease on ``resource``, or None."""
        ...

    async def aclose(self) -> None:
        """Close connections. Idempotent."""
        ...


class FencingGuard:
    """The resource side of fencing: remember the highest token, refuse older ones.

    Keep one guard where the side effect happens (the database, the browser
    session, the tool) and call :meth:`check` with the token the caller
    presents. A token equal to the highest seen is accepted (the same holder
    continuing); a lower one raises :class:`~hivemesh.leases.errors.StaleFencingToken`.
    """

    __slots__ = ("_highest", "rejected")

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}
        #: How many stale tokens were refused.
        self.rejected = 0

    def check(self, token: int, resource: str = "") -> None:
        """Accept ``token`` for ``resource`` or raise StaleFencingToken."""
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidArgument(f"fencing token must be a non-negative int, got {token!r}")
        seen = self._highest.get(resource, -1)
        if token < seen:
            self.rejected += 1
            raise StaleFencingToken(
                f"fencing token {token} for {resource!r} is older than {seen} already seen"
            )
        self._highest[resource] = token

    def highest(self, resource: str = "") -> int | None:
        """The highest token accepted for ``resource`` so far, or None."""
        return self._highest.get(resource)
