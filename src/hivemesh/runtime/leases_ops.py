"""Control-socket operations for leases and claims (``lease.*``, ``claim.*``).

Arguments are validated here (typed errors, counted by the control server);
the work is done by :mod:`hivemesh.runtime.leases`. Every lease op takes
``timeout_s`` (default 2 s), the deadline of the quorum round trips.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh.errors import InvalidArgument
from hivemesh.leases import validate_holder, validate_resource, validate_ttl_ms
from hivemesh.runtime.control import register_op

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["register"]


def _timeout(args: dict[str, Any]) -> float:
    t = args.get("timeout_s", 2.0)
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 3600:
        raise InvalidArgument("timeout_s must be a number in (0, 3600]")
    return float(t)


def _token(args: dict[str, Any]) -> int:
    t = args.get("token")
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise InvalidArgument("token must be a positive int")
    return t


def _backend(d: Daemon) -> Any:
    return d.leases.client().backend


async def _acquire(d: Daemon, args: dict[str, Any]) -> Any:
    r, h = validate_resource(args.get("resource")), validate_holder(args.get("holder"))
    ttl = validate_ttl_ms(args.get("ttl_ms", 5000))
    token = await _backend(d).acquire(r, h, ttl, timeout_s=_timeout(args))
    return {"token": token}


async def _renew(d: Daemon, args: dict[str, Any]) -> Any:
    r, h = validate_resource(args.get("resource")), validate_holder(args.get("holder"))
    ttl = validate_ttl_ms(args.get("ttl_ms", 5000))
    ok = await _backend(d).renew(r, h, _token(args), ttl, timeout_s=_timeout(args))
    return {"ok": ok}


async def _release(d: Daemon, args: dict[str, Any]) -> Any:
    r, h = validate_resource(args.get("resource")), validate_holder(args.get("holder"))
    ok = await _backend(d).release(r, h, _token(args), timeout_s=_timeout(args))
    return {"ok": ok}


async def _show(d: Daemon, args: dict[str, Any]) -> Any:
    info = await _backend(d).show(validate_resource(args.get("resource")), timeout_s=_timeout(args))
    if info is None:
        return {"held": False}
    return {
        "held": True,
        "holder": info.holder,
        "fencing_token": info.fencing_token,
        "remaining_ms": info.remaining_ms,
    }


async def _voters(d: Daemon, args: dict[str, Any]) -> Any:
    voters = d.leases.voters()
    return {"voters": voters, "majority": len(voters) // 2 + 1, **d.leases.statistics()}


def _resource(args: dict[str, Any]) -> str:
    r = args.get("resource")
    if not isinstance(r, str):
        raise InvalidArgument("missing argument 'resource' (a string)")
    return r


async def _claim(d: Daemon, args: dict[str, Any]) -> Any:
    r = _resource(args)
    seq = await d.claims.claim(r)
    return {"resource": r, "seq": seq, "winner": d.claims.winner(r)}


async def _claim_wait(d: Daemon, args: dict[str, Any]) -> Any:
    r = _resource(args)
    winner = await d.claims.wait_decided(r, timeout_s=_timeout(args))
    return {"resource": r, "winner": winner, "ours": winner == d.address}


async def _claim_release(d: Daemon, args: dict[str, Any]) -> Any:
    return {"released": await d.claims.release(_resource(args))}


async def _claim_done(d: Daemon, args: dict[str, Any]) -> Any:
    await d.claims.done(_resource(args))
    return {"done": True}


async def _claim_show(d: Daemon, args: dict[str, Any]) -> Any:
    snap = d.claims.snapshot()
    r = args.get("resource")
    if isinstance(r, str):
        return {"resource": r, **snap["resources"].get(r, {"winner": None, "live": 0})}
    return snap


_OPS = {
    "claim": _claim,
    "claim.done": _claim_done,
    "claim.release": _claim_release,
    "claim.show": _claim_show,
    "claim.wait": _claim_wait,
    "lease.acquire": _acquire,
    "lease.release": _release,
    "lease.renew": _renew,
    "lease.show": _show,
    "lease.voters": _voters,
}


def register() -> None:
    """Add the lease and claim ops to the control server (idempotent)."""
    for name, op in _OPS.items():
        register_op(name, op)
