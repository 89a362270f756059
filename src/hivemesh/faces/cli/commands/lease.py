"""``hivemesh lease acquire|release|show RESOURCE``: leases from the shell.

The backend comes from ``--backend URL`` or ``$HIVEMESH_LEASE_URL``; the
default is ``mesh://``: the embedded quorum of the swarm of the local daemon
(``--data-dir``, ``$HIVEMESH_DATA_DIR`` or ``~/.hivemesh``). Other backends:
``redis://...``, ``nats://...`` or ``quorum://IP:PORT,...`` (standalone UDP
voters: ``hivemesh lease voter --listen IP:PORT --state FILE``).
A lease acquired here outlives the command until its TTL; release it with the
printed holder and token::

    hivemesh lease acquire deploy-prod --ttl-ms 60000 --holder ci-42
    hivemesh lease release deploy-prod --holder ci-42 --token 17

Output is one JSON object per command; ``--data-dir`` and ``--json`` go
before or after the action, and an error has the one shape and exit code of
every command (:mod:`hivemesh.client.cli`): 2 bad input, 3 no daemon
running (``mesh://``), 5 held by someone else / not held, 6 no quorum or
backend unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit, emit_error
from hivemesh.errors import DaemonNotRunning, HivemeshError
from hivemesh.leases import Lease, LeaseClient, VoterServer, open_backend
from hivemesh.leases._quorum import parse_voters

DEFAULT_URL = "mesh://"


def register(sub: Any) -> None:
    """Add the ``lease`` subcommand."""
    p = sub.add_parser("lease", help="acquire, release or show a lease with a fencing token")
    p.add_argument(
        "--backend",
        default=os.environ.get("HIVEMESH_LEASE_URL", DEFAULT_URL),
        help="backend URL (default $HIVEMESH_LEASE_URL or %(default)s: the local swarm)",
    )
    add_common(p)
    p.add_argument("--timeout-s", type=float, default=2.0, help="deadline of each backend call")
    lsub = p.add_subparsers(dest="lease_cmd", metavar="ACTION", required=True)

    a = lsub.add_parser("acquire", help="acquire RESOURCE (waits up to --wait-s)")
    a.add_argument("resource")
    a.add_argument("--ttl-ms", type=int, default=5000)
    a.add_argument("--holder", default=None, help="holder id (default: unique per process)")
    a.add_argument("--wait-s", type=float, default=0.0, help="wait for the holder (0: try once)")
    add_common(a)
    a.set_defaults(func=_run)

    r = lsub.add_parser("release", help="release RESOURCE held by --holder with --token")
    r.add_argument("resource")
    r.add_argument("--holder", required=True)
    r.add_argument("--token", type=int, required=True)
    add_common(r)
    r.set_defaults(func=_run)

    s = lsub.add_parser("show", help="show the current lease on RESOURCE")
    s.add_argument("resource")
    add_common(s)
    s.set_defaults(func=_run)

    v = lsub.add_parser("voter", help="run one quorum:// voter on UDP until interrupted")
    v.add_argument("--listen", default="127.0.0.1:7001", help="IP:PORT (port 0: any)")
    v.add_argument("--state", default=None, help="file for durable voter state (fsynced)")
    v.set_defaults(func=_voter)


def _url(args: argparse.Namespace) -> str:
    if args.backend == DEFAULT_URL and args.data_dir:
        return "mesh://" + str(Path(args.data_dir).expanduser().resolve())
    return str(args.backend)


def _check_daemon(args: argparse.Namespace) -> None:
    """For ``mesh://``: :class:`DaemonNotRunning` if no daemon answers on the
    data dir's socket (else the backend would report it as no quorum)."""
    if args.backend != DEFAULT_URL:
        return
    path = data_dir_of(args) / "ctl.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
    except OSError as exc:
        raise DaemonNotRunning(f"no daemon answering at {path}: {exc}") from None
    finally:
        s.close()


async def _act(args: argparse.Namespace) -> dict[str, Any]:
    _check_daemon(args)
    client = LeaseClient(
        open_backend(_url(args)), getattr(args, "holder", None), call_timeout_s=args.timeout_s
    )
    try:
        if args.lease_cmd == "acquire":
            if args.wait_s > 0:
                lease = await client.acquire(args.resource, args.ttl_ms, wait_s=args.wait_s)
            else:
                lease = await client.try_acquire(args.resource, args.ttl_ms)
            return {
                "resource": lease.resource,
                "holder": lease.holder,
                "fencing_token": lease.fencing_token,
                "ttl_ms": lease.ttl_ms,
            }
        if args.lease_cmd == "release":
            lease = Lease(args.resource, args.holder, args.token, 5000, time.monotonic())
            await client.release(lease)
            return {"resource": args.resource, "released": True}
        info = await client.show(args.resource)
        if info is None:
            return {"resource": args.resource, "held": False}
        return {
            "resource": info.resource,
            "held": True,
            "holder": info.holder,
            "fencing_token": info.fencing_token,
            "remaining_ms": info.remaining_ms,
        }
    finally:
        await client.aclose()


async def _serve_voter(args: argparse.Namespace) -> None:
    ((host, port),) = parse_voters(args.listen, allow_port_zero=True)
    server = VoterServer(host, port, state_path=args.state)
    address = await server.start()
    print(json.dumps({"voter": address}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        server.close()


def _voter(args: argparse.Namespace) -> int:
    try:
        asyncio.run(_serve_voter(args))
    except HivemeshError as e:
        print(json.dumps({"error": e.code, "message": str(e)}), file=sys.stderr)
        return 2
    except OSError as e:
        print(json.dumps({"error": "os_error", "message": str(e)}), file=sys.stderr)
        return 4
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        out = asyncio.run(_act(args))
    except HivemeshError as e:
        return emit_error(args, e)
    emit(args, out)
    return 0
