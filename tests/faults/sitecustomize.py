"""Faults a test arms inside a real node process (tests/test_supervision_e2e.py).

A test puts this directory first on a node's ``PYTHONPATH`` and sets
``HM_TEST_FAULTS=1``; Python imports ``sitecustomize`` at start-up, and this
one wraps a few methods so that the
test arms a fault by writing a file into the node's data dir (nothing is
armed until then, and production code has no hook for it):

* ``fault.store`` -- ``error``: the store's append log and group commit
  fail like a disk with I/O errors (``OSError(EIO)``, which the store reports
  as ``StoreError``); ``bug``: the group commit raises ``RuntimeError`` (a
  bug in our code). Removing the file heals the disk.
* ``fault.frame`` -- ``<how> <address>``: the next frame received from
  ``address`` raises inside the frame handler, once (the file is removed);
  ``how`` is ``bug`` (a ``RuntimeError``) or ``panic`` (a ``BaseException``
  subclass, the way loro reports a Rust panic).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any


def _data_dir() -> Path | None:
    argv = sys.argv
    for i, arg in enumerate(argv[:-1]):
        if arg == "--data-dir":
            return Path(argv[i + 1])
    return None


def _armed(name: str) -> str | None:
    data_dir = _data_dir()
    if data_dir is None:
        return None
    try:
        return (data_dir / f"fault.{name}").read_text().strip()
    except FileNotFoundError:
        return None


class InjectedPanic(BaseException):
    """Stands in for loro's ``PanicException`` (not an ``Exception``)."""


def _install() -> None:
    from hivemesh.core.node import Node
    from hivemesh.stores.appendlog import AppendLog
    from hivemesh.stores.sqlite import SQLiteStore

    sync, write, receive = SQLiteStore.sync, AppendLog.write, Node.receive

    def faulty_sync(self: Any) -> None:
        how = _armed("store")
        if how == "bug":
            raise RuntimeError("injected bug in the group commit")
        if how == "error" and self.pending:
            from hivemesh.errors import StoreError

            raise StoreError(f"{self.path}: appending: disk I/O error (injected)")
        sync(self)

    def faulty_write(self: Any, author: bytes, sig: bytes, raws: Any) -> None:
        if _armed("store") == "error":
            raise OSError(errno.EIO, "Input/output error (injected)")
        write(self, author, sig, raws)

    def faulty_receive(self: Any, peer: str, frame: bytes, now_ms: int) -> None:
        armed = _armed("frame")
        if armed is not None:
            how, _, address = armed.partition(" ")
            if peer == address:
                data_dir = _data_dir()
                assert data_dir is not None
                os.unlink(data_dir / "fault.frame")
                if how == "panic":
                    raise InjectedPanic("injected panic in the frame handler")
                raise RuntimeError("injected bug in the frame handler")
        receive(self, peer, frame, now_ms)

    SQLiteStore.sync = faulty_sync  # type: ignore[method-assign]
    AppendLog.write = faulty_write  # type: ignore[method-assign]
    Node.receive = faulty_receive  # type: ignore[method-assign]


if os.environ.get("HM_TEST_FAULTS") == "1":
    _install()
