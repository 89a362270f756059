"""Shared plumbing for the CLI commands that talk to a daemon.

Common options sit in the same places on every command: ``--data-dir``
(default ``$HIVEMESH_DATA_DIR`` or ``~/.hivemesh``) and ``--json`` are
accepted before or after the action (``hivemesh lease --data-dir D acquire
r`` and ``hivemesh lease acquire r --data-dir D`` are the same), and on the
top-level ``hivemesh`` too. With ``--json`` a command prints exactly one JSON
document on stdout, an error too, in one shape on every command::

    {"error": {"code": "daemon_not_running", "type": "DaemonNotRunning",
               "message": "...", "exit": 3}}

Without it, short readable lines, and an error as ``error: MESSAGE [CODE]``
on stderr. A usage error (an unknown option, a missing argument) is
``invalid_argument`` in that shape too when ``--json`` is on the command line.
The exit code says the cause, the same for every command
(:data:`EXIT_CODES`, by error code; a code not listed exits with its
category's, else 1):

==  ==========================================================================
0   success
1   another failure (a bug, a broken store, a bad config file, ...)
2   bad input: a usage error, ``invalid_argument`` (and ``too_large``,
    ``too_deep``, ``bad_encoding``, ``unknown_command``), ``invalid_address``
3   no daemon is running on the data dir (``daemon_not_running``)
4   the node refuses writes to its own feed until it is recovered
    (``feed_not_writable``, ``feed_recovering``, ``feed_diverged``,
    ``context_catching_up``; ``hivemesh feed status``)
5   someone else has it: a lease held by another holder or lost
    (``lease_unavailable``, ``lease_contended``, ``lease_lost``,
    ``stale_fencing_token``), a claim another node won
6   no quorum: the lease voters did not answer in time (``backend_unavailable``)
7   busy: the daemon or a queue is full, retry later (``peer_busy``,
    ``queue_full``, ``spool_full``)
10  not a valid invite token (``invite_error``, ``invite_malformed``,
    ``invite_noncanonical``, ``invite_bad_signature``)
11  the invite expired (``invite_expired``)
12  the invite was already used (``invite_used``)
13  the inviter holds no such invite (``invite_unknown``)
14  the peer is unknown or refuses this node (``unknown_peer``,
    ``invite_revoked``, ``no_handler``, ``telemetry_refused``)
15  the peer cannot be reached as itself (``unreachable``, ``identity_mismatch``)
16  no answer in time (``deadline_exceeded``)
==  ==========================================================================
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.errors import HivemeshError

if TYPE_CHECKING:
    from hivemesh.client.blocking import Client
    from hivemesh.commands import Command

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILED",
    "EXIT_LOST",
    "EXIT_NO_DAEMON",
    "add_common",
    "data_dir_of",
    "emit",
    "emit_error",
    "error_json",
    "exit_code",
    "run_command",
    "run_with_client",
    "wants_json",
]

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_DAEMON = 3
EXIT_FEED_NOT_WRITABLE = 4
EXIT_LOST = 5

#: Exit code per error code (module docs); other codes exit with their
#: nearest base class's, else :data:`EXIT_FAILED`.
EXIT_CODES: dict[str, int] = {
    "invalid_argument": EXIT_BAD_INPUT,
    "invalid_address": EXIT_BAD_INPUT,
    "daemon_not_running": EXIT_NO_DAEMON,
    "feed_not_writable": EXIT_FEED_NOT_WRITABLE,
    "lease_unavailable": EXIT_LOST,
    "lease_lost": EXIT_LOST,
    "stale_fencing_token": EXIT_LOST,
    "backend_unavailable": 6,
    "peer_busy": 7,
    "queue_full": 7,
    "spool_full": 7,
    "invite_error": 10,
    "invite_expired": 11,
    "invite_used": 12,
    "invite_unknown": 13,
    "unknown_peer": 14,
    "invite_revoked": 14,
    "no_handler": 14,
    "telemetry_refused": 14,
    "unreachable": 15,
    "identity_mismatch": 15,
    "deadline_exceeded": 16,
}


def exit_code(exc: HivemeshError) -> int:
    """The exit code for ``exc``: its code's, else its nearest base class's."""
    found = EXIT_CODES.get(exc.code)
    if found is not None:
        return found
    for cls in type(exc).__mro__:
        code = getattr(cls, "code", None)
        if isinstance(code, str) and code in EXIT_CODES:
            return EXIT_CODES[code]
    return EXIT_FAILED


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data dir from ``--data-dir``, the environment or the default."""
    if getattr(args, "data_dir", None):
        return Path(args.data_dir).expanduser()
    return Path(os.environ.get("HIVEMESH_DATA_DIR", "~/.hivemesh")).expanduser()


def add_common(p: argparse.ArgumentParser) -> None:
    """Add ``--data-dir`` and ``--json`` to ``p``. Call it on a command's
    parser and on each of its actions' parsers: an option given at either
    place is kept (the defaults are applied by :func:`data_dir_of` and
    :func:`wants_json`, never by the parser, so a later level cannot reset
    what an earlier one set)."""
    p.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        help="node data dir (default $HIVEMESH_DATA_DIR or ~/.hivemesh)",
    )
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )


def wants_json(args: argparse.Namespace) -> bool:
    """True if ``--json`` was given anywhere."""
    return bool(getattr(args, "json", False))


def emit(args: argparse.Namespace, obj: Any, text: Callable[[Any], str] | None = None) -> None:
    """Print ``obj`` as JSON (``--json``) or through ``text``."""
    if wants_json(args) or text is None:
        print(json.dumps(obj, sort_keys=True))
    else:
        out = text(obj)
        if out:
            print(out)


def error_json(exc: HivemeshError) -> dict[str, Any]:
    """The one error shape of every command (module docs)."""
    return {
        "error": {
            "type": type(exc).__name__,
            "code": exc.code,
            "message": str(exc),
            "exit": exit_code(exc),
        }
    }


def emit_error(args: argparse.Namespace, exc: HivemeshError) -> int:
    """Report ``exc`` and return its exit code."""
    if wants_json(args):
        print(json.dumps(error_json(exc), sort_keys=True))
    else:
        print(f"error: {exc} [{exc.code}]", file=sys.stderr)
    return exit_code(exc)


def _client(args: argparse.Namespace, timeout_s: float | None = None) -> Client:
    from hivemesh.client.blocking import Client

    default = getattr(args, "timeout_s", None) or 10.0
    return Client(data_dir_of(args), timeout_s=timeout_s or default)


def run_with_client(
    args: argparse.Namespace,
    op: Callable[[Client], Any],
    text: Callable[[Any], str] | None = None,
) -> int:
    """Run ``op`` against the local daemon and print its result."""
    try:
        result = op(_client(args))
    except HivemeshError as exc:
        return emit_error(args, exc)
    emit(args, result, text)
    return 0


def run_command(
    args: argparse.Namespace,
    request: Command,
    text: Callable[[Any], str] | None = None,
    *,
    timeout_s: float | None = None,
) -> int:
    """Run one typed command (:mod:`hivemesh.commands`) against the local
    daemon and print its reply (its wire form: the same JSON as the control
    socket's result)."""
    try:
        reply = _client(args, timeout_s).run(request)
    except HivemeshError as exc:
        return emit_error(args, exc)
    emit(args, reply.to_wire(), text)
    return 0
