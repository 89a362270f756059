"""Host-level helpers of the daemon: the routed interface address, the
data dir lock and the open-files limit."""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import socket
from pathlib import Path

from hivemesh.errors import ConfigError

__all__ = [
    "OPEN_FILES_WANTED",
    "handshake_slots",
    "lock_data_dir",
    "primary_ipv4",
    "raise_open_files_limit",
]


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


#: Open files a node wants: its handshake slots (512) and channels (1024 by
#: default) alone pass the common soft limit of 1024, and running out makes
#: the kernel refuse accepts (asyncio then stops accepting for a second).
OPEN_FILES_WANTED = 8192


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` toward ``wanted`` (never above the
    hard limit, never down); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def handshake_slots(cap: int = 512) -> int:
    """How many inbound handshakes may be pending at once: ``cap``, or a
    quarter of the open-files limit if that is lower (at least 16), so a
    flood cannot use up the descriptors the node needs for its channels,
    store and control socket."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(16, min(cap, soft // 4))
