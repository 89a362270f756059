"""Host-level helpers of the daemon: the routed interface address and the
data dir lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from hivemesh.errors import ConfigError

__all__ = ["lock_data_dir", "primary_ipv4"]


def primary_ipv4() -> str:
    """The IPv4 address of the interface that routes off-host (for 0.0.0.0).

    A UDP ``connect`` only consults the routing table: no packet is sent.
    Falls back to the host name's address, then to loopback.
    """
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed, never contacted
        ip: str = s.getsockname()[0]
        if not ip.startswith("127.") and ip != "0.0.0.0":
            return ip
    with contextlib.suppress(OSError):
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    return "127.0.0.1"


def lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on ``data_dir/daemon.lock`` for the process lifetime."""
    fd = os.open(data_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(f"another hivemesh daemon is running on {data_dir}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
