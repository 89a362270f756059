"""LeaseClient: the one lease API over any :class:`LeaseBackend`.

Every call has a deadline (``timeout_s``, default :attr:`LeaseClient.call_timeout_s`);
a backend that does not answer in time raises
:class:`~hivemesh.errors.BackendUnavailable`, never hangs. Errors are counted
by their ``code`` in :meth:`LeaseClient.statistics`.

``async with client.hold(resource, ttl_ms) as held:`` acquires, renews every
``ttl_ms / 3`` in the background, and if the lease is lost (taken over,
expired, backend unreachable until the believed expiry) cancels the body and
raises :class:`~hivemesh.leases.errors.LeaseLost` from the ``async with``, the way
:func:`asyncio.timeout` turns its cancellation into ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import time
from collections import Counter
from types import TracebackType

from hivemesh.errors import BackendUnavailable, HivemeshError, InvalidArgument
from hivemesh.leases._api import (
    Lease,
    LeaseBackend,
    LeaseInfo,
    believed_expiry,
    validate_holder,
    validate_resource,
    validate_ttl_ms,
)
from hivemesh.leases.errors import LeaseLost, LeaseUnavailable

__all__ = ["HeldLease", "LeaseClient", "default_holder"]


def default_holder() -> str:
    """A holder id unique to this process: ``host-pid-random``."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.") or "host"
    return f"{host[:60]}-{os.getpid()}-{secrets.token_hex(4)}"


def _check_timeout(timeout_s: float) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidArgument(f"timeout_s must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= 3600:
        raise InvalidArgument(f"timeout_s={timeout_s} out of range (0, 3600]")
    return float(timeout_s)


class LeaseClient:
    """Acquire, renew, release and hold leases through one backend.

    ``holder`` identifies this client in the backend (default: unique per
    process). One client may hold leases on many resources.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        holder: str | None = None,
        *,
        call_timeout_s: float = 2.0,
    ) -> None:
        self.backend = backend
        self.holder = validate_holder(default_holder() if holder is None else holder)
        self.call_timeout_s = _check_timeout(call_timeout_s)
        self._counters: Counter[str] = Counter()

    # -- plumbing ---------------------------------------------------------------

    def _count(self, err: HivemeshError) -> None:
        self._counters[err.code] += 1

    def statistics(self) -> dict[str, int]:
        """Counts of operations and errors by code (a copy)."""
        return dict(sorted(self._counters.items()))

    def _timeout(self, timeout_s: float | None) -> float:
        return self.call_timeout_s if timeout_s is None else _check_timeout(timeout_s)

    # -- operations -------------------------------------------------------------

    async def try_acquire(
        self, resource: str, ttl_ms: int = 5000, *, timeout_s: float | None = None
    ) -> Lease:
        """Acquire now or raise LeaseUnavailable (never waits for the holder)."""
        try:
            resource = validate_resource(resource)
            ttl_ms = validate_ttl_ms(ttl_ms)
            t = self._timeout(timeout_s)
            invoked = time.monotonic()
            token = await self.backend.acquire(resource, self.holder, ttl_ms, timeout_s=t)
            if token is None:
                raise LeaseUnavailable(f"{resource!r} is held by someone else")
        except HivemeshError as e:
            self._count(e)
            raise
        self._counters["acquired"] += 1
        return Lease(resource, self.holder, token, ttl_ms, believed_expiry(invoked, ttl_ms))

    async def acquire(
        self,
        resource: str,
        ttl_ms: int = 5000,
        *,
        wait_s: float = 10.0,
        timeout_s: float | None = None,
    ) -> Lease:
        """Acquire, waiting up to ``wait_s`` for the current holder to let go.

        Raises LeaseUnavailable when ``wait_s`` passes, BackendUnavailable if
        the backend does not answer within ``timeout_s`` on an attempt.
        """
        wait_s = _check_timeout(wait_s)
        deadline = time.monotonic() + wait_s
        backoff = 0.005
        while True:
            # Each attempt gets the full per-call deadline: wait_s bounds the
            # waiting between attempts, never one round trip.
            try:
                return await self.try_acquire(resource, ttl_ms, timeout_s=timeout_s)
            except LeaseUnavailable:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            await asyncio.sleep(min(left, backoff * (0.5 + random.random())))
            backoff = min(backoff * 2, 0.2, ttl_ms / 4000)

    async def renew(self, lease: Lease, *, timeout_s: float | None = None) -> Lease:
        """Extend ``lease`` by its TTL from now; raise LeaseLost if it is gone."""
        try:
            t = self._timeout(timeout_s)
            invoked = time.monotonic()
            ok = await self.backend.renew(
                lease.resource, lease.holder, lease.fencing_token, lease.ttl_ms, timeout_s=t
            )
            if not ok:
                raise LeaseLost(
                    f"lease on {lease.resource!r} (token {lease.fencing_token}) "
                    "expired or was taken"
                )
        except HivemeshError as e:
            self._count(e)
            raise
        self._counters["renewed"] += 1
        return Lease(
            lease.resource,
            lease.holder,
            lease.fencing_token,
            lease.ttl_ms,
            believed_expiry(invoked, lease.ttl_ms),
        )

    async def release(self, lease: Lease, *, timeout_s: float | None = None) -> None:
        """Release ``lease``; raise LeaseLost if it had already expired or been taken."""
        try:
            t = self._timeout(timeout_s)
            ok = await self.backend.release(
                lease.resource, lease.holder, lease.fencing_token, timeout_s=t
            )
            if not ok:
                raise LeaseLost(
                    f"lease on {lease.resource!r} (token {lease.fencing_token}) was not held"
                )
        except HivemeshError as e:
            self._count(e)
            raise
        self._counters["released"] += 1

    async def show(self, resource: str, *, timeout_s: float | None = None) -> LeaseInfo | None:
        """The current lease on ``resource`` as the backend sees it, or None."""
        try:
            resource = validate_resource(resource)
            return await self.backend.show(resource, timeout_s=self._timeout(timeout_s))
        except HivemeshError as e:
            self._count(e)
            raise

    def hold(self, resource: str, ttl_ms: int = 5000, *, wait_s: float = 10.0) -> HeldLease:
        """``async with client.hold(resource, ttl_ms) as held:`` -- see HeldLease."""
        return HeldLease(self, validate_resource(resource), validate_ttl_ms(ttl_ms), wait_s)

    async def aclose(self) -> None:
        """Close the backend."""
        await self.backend.aclose()


class HeldLease:
    """A lease held for the duration of an ``async with`` block, renewed at ttl/3.

    Inside the block, ``held.lease`` is the current lease and ``held.token``
    its fencing token. If renewal fails for good, the block is cancelled and
    ``LeaseLost`` is raised from the ``async with``; the lease is released on
    normal exit.
    """

    def __init__(self, client: LeaseClient, resource: str, ttl_ms: int, wait_s: float) -> None:
        self._client = client
        self._resource = resource
        self._ttl_ms = ttl_ms
        self._wait_s = wait_s
        self._lease: Lease | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._host: asyncio.Task[object] | None = None
        self._lost: str | None = None

    @property
    def lease(self) -> Lease:
        """The current lease (replaced on every renewal)."""
        if self._lease is None:
            raise InvalidArgument("lease not acquired yet")
        return self._lease

    @property
    def token(self) -> int:
        """The fencing token (constant for the life of the hold)."""
        return self.lease.fencing_token

    @property
    def lost(self) -> bool:
        """Whether the lease has been lost."""
        return self._lost is not None

    async def __aenter__(self) -> HeldLease:
        self._lease = await self._client.acquire(self._resource, self._ttl_ms, wait_s=self._wait_s)
        self._host = asyncio.current_task()
        self._renewer = asyncio.create_task(
            self._renew_loop(), name=f"lease-renew:{self._resource}"
        )
        return self

    async def _renew_loop(self) -> None:
        interval = self._ttl_ms / 3000.0
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            lease = self.lease
            left_s = lease.expires - time.monotonic()
            if left_s <= 0:
                self._lose("lease expired before it could be renewed")
                return
            try:
                timeout = min(self._client.call_timeout_s, left_s)
                self._lease = await self._client.renew(lease, timeout_s=timeout)
                next_at = time.monotonic() + interval
            except LeaseLost as e:
                self._lose(str(e))
                return
            except BackendUnavailable:
                # Unknown outcome: retry soon while the old lease is still believed valid.
                next_at = time.monotonic() + min(interval / 4, 0.05)

    def _lose(self, why: str) -> None:
        self._lost = why
        if self._host is not None:
            self._host.cancel(msg=f"hivemesh lease lost: {why}")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._lost is not None:
            if self._host is not None and self._host.cancelling():
                self._host.uncancel()
            raise LeaseLost(f"lease on {self._resource!r} lost: {self._lost}") from exc
        try:
            await self._client.release(self.lease)
        except (LeaseLost, BackendUnavailable):
            if exc_type is None:
                raise
        return False
