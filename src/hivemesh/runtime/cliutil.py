"""Shared plumbing for the CLI subcommands that talk to a daemon.

Every such command takes ``--data-dir`` (default ``$HIVEMESH_DATA_DIR`` or
``~/.hivemesh``) and ``--json``. With ``--json`` it prints exactly one JSON
document on stdout (errors too, as ``{"error": {...}}``); without it, short
readable lines. Exit codes: 0 success, 1 the operation failed, 3 no daemon
is running, 4 the node refuses writes to its own feed until it is recovered
(:class:`~hivemesh.errors.FeedNotWritable`; ``hivemesh feed status``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hivemesh.errors import DaemonNotRunning, FeedNotWritable, HivemeshError
from hivemesh.runtime.client import Client

__all__ = ["add_common", "data_dir_of", "emit", "run_with_client"]

EXIT_FAILED = 1
EXIT_NO_DAEMON = 3
EXIT_FEED_NOT_WRITABLE = 4


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data dir from ``--data-dir``, the environment or the default."""
    if getattr(args, "data_dir", None):
        return Path(args.data_dir).expanduser()
    return Path(os.environ.get("HIVEMESH_DATA_DIR", "~/.hivemesh")).expanduser()


def add_common(p: argparse.ArgumentParser) -> None:
    """Add ``--data-dir`` and ``--json``."""
    p.add_argument("--data-dir", help="node data dir (default $HIVEMESH_DATA_DIR or ~/.hivemesh)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def emit(args: argparse.Namespace, obj: Any, text: Callable[[Any], str] | None = None) -> None:
    """Print ``obj`` as JSON (``--json``) or through ``text``."""
    if getattr(args, "json", False) or text is None:
        print(json.dumps(obj, sort_keys=True))
    else:
        out = text(obj)
        if out:
            print(out)


def emit_error(args: argparse.Namespace, exc: HivemeshError) -> int:
    """Report ``exc`` and return the exit code."""
    err = {"type": type(exc).__name__, "code": exc.code, "message": str(exc)}
    if getattr(args, "json", False):
        print(json.dumps({"error": err}, sort_keys=True))
    else:
        print(f"error: {exc} [{exc.code}]", file=sys.stderr)
    if isinstance(exc, DaemonNotRunning):
        return EXIT_NO_DAEMON
    return EXIT_FEED_NOT_WRITABLE if isinstance(exc, FeedNotWritable) else EXIT_FAILED


def run_with_client(
    args: argparse.Namespace,
    op: Callable[[Client], Any],
    text: Callable[[Any], str] | None = None,
) -> int:
    """Run ``op`` against the local daemon and print its result."""
    client = Client(data_dir_of(args), timeout_s=getattr(args, "timeout_s", None) or 10.0)
    try:
        result = op(client)
    except HivemeshError as exc:
        return emit_error(args, exc)
    emit(args, result, text)
    return 0
