"""Leaving nothing behind: lab names, the exit hook and stale labs.

Every namespace a lab makes is named ``hmlab-<pid>-<seq>-<host>``: the pid
of the process that owns the lab and a counter within it. So

* a lab removes its own namespaces when its ``with`` block ends, and
  :func:`atexit` removes any lab still open when the interpreter exits (a
  failed test, ``KeyboardInterrupt``, ``sys.exit``);
* after a crash (``SIGKILL``, a lost machine) :func:`cleanup_stale` removes
  the namespaces whose owner is no longer running, and leaves alone the
  labs of processes still alive (another test run, a chaos campaign).

Removing a namespace first ends the processes still running inside it
(they were started there by a lab), then deletes it; the veth pairs and
bridges inside go with it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import time
from collections.abc import Callable

from hivemesh.netlab._run import run

__all__ = ["PREFIX", "cleanup_stale", "delete_namespace", "lab_namespaces", "on_exit"]

#: Every lab namespace's name starts with this.
PREFIX = "hmlab-"

_NAME = re.compile(r"^hmlab-(\d+)-(\d+)-")
_exit_hooks: dict[int, Callable[[], None]] = {}
_registered: list[bool] = []


def lab_namespaces() -> list[str]:
    """The names of every lab namespace on this machine (any owner)."""
    out = run(["ip", "netns", "list"], timeout_s=5.0).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(PREFIX))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pids_in(namespace: str) -> list[int]:
    out = run(["ip", "netns", "pids", namespace], timeout_s=5.0, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def delete_namespace(namespace: str, *, grace_s: float = 2.0) -> None:
    """End the processes inside ``namespace`` (TERM, then KILL after ``grace_s``)
    and delete it. Missing namespaces are fine."""
    pids = _pids_in(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        if pids:
            time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run(["ip", "netns", "del", namespace], timeout_s=10.0, check=False)


def cleanup_stale() -> list[str]:
    """Delete the lab namespaces whose owning process has ended; return their names."""
    gone: list[str] = []
    for name in lab_namespaces():
        match = _NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and _alive(int(match.group(1))):
            continue
        if match and int(match.group(1)) == os.getpid():
            continue  # our own labs are closed by their owners
        delete_namespace(name)
        gone.append(name)
    return gone


def _run_exit_hooks() -> None:
    for key in list(_exit_hooks):
        hook = _exit_hooks.pop(key, None)
        if hook is not None:
            hook()


def on_exit(key: int, hook: Callable[[], None] | None) -> None:
    """Register (or with ``None`` drop) the exit hook of the lab ``key``."""
    if hook is None:
        _exit_hooks.pop(key, None)
        return
    _exit_hooks[key] = hook
    if not _registered:
        atexit.register(_run_exit_hooks)
        _registered.append(True)
