"""Running the lab's commands: every one with a deadline, failures typed.

:func:`run` wraps :func:`subprocess.run` (a list of arguments, never a
shell), raising :class:`~hivemesh.netlab.errors.NetlabCommandFailed` with the
command's stderr. :func:`unavailable_reason` says once per process why
namespaces cannot be used here, or ``None`` when they can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from hivemesh.netlab.errors import NetlabCommandFailed

__all__ = ["run", "unavailable_reason"]

#: Tools the lab needs, by the Debian package that brings each.
TOOLS = {"ip": "iproute2", "nft": "nftables", "conntrack": "conntrack"}

_reason: list[str | None] = []


def run(
    argv: Sequence[str],
    *,
    stdin: str | None = None,
    timeout_s: float = 10.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return its result; raise on a non-zero exit (if ``check``)
    or when it overruns ``timeout_s``."""
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise NetlabCommandFailed(f"{' '.join(argv)}: no answer within {timeout_s}s") from exc
    except OSError as exc:
        raise NetlabCommandFailed(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetlabCommandFailed(
            f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[:500]}"
        )
    return done


def _probe() -> str | None:
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    missing = [
        f"{tool} (Debian package {pkg})" for tool, pkg in TOOLS.items() if not shutil.which(tool)
    ]
    if missing:
        return "missing tools: " + ", ".join(missing)
    name = f"hmlab-probe-{os.getpid()}"
    try:
        run(["ip", "netns", "add", name], timeout_s=5.0)
    except NetlabCommandFailed as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        run(["ip", "netns", "exec", name, "nft", "list", "tables"], timeout_s=5.0)
    except NetlabCommandFailed as exc:
        return f"nftables does not work inside a namespace: {exc}"
    finally:
        run(["ip", "netns", "del", name], timeout_s=5.0, check=False)
    return None


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (``None``: they can). Probed once."""
    if not _reason:
        _reason.append(_probe())
    return _reason[0]
