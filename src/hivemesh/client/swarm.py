"""A local swarm of real node processes on loopback (demo and e2e tests).

:class:`LocalSwarm` starts ``python -m hivemesh up`` processes, each with its
own data dir under one root, on ``127.0.0.1`` with ephemeral ports, and talks
to each through its control socket (:class:`~hivemesh.client.blocking.Client`).
It can ``kill -9`` a node and restart it on the same data dir and port.
Nodes are private (``invite`` trust) by default; a :class:`LocalSwarm` is a
loopback harness for tests, the demo and benchmarks, and opts its nodes into
``open`` trust (:data:`OPEN_TRUST`) unless told ``trust_mode="invite"`` (or
``None``: the node's own default). Every wait has a deadline
(:func:`wait_until`); :meth:`LocalSwarm.close`
terminates every child (SIGTERM, then SIGKILL after a grace period), and
each child asks the kernel to SIGKILL it if its parent dies (Linux
``PR_SET_PDEATHSIG``), so a test or demo never leaks processes, even when
it is itself killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import hivemesh
from hivemesh.client.blocking import Client
from hivemesh.errors import DeadlineExceeded, HivemeshError

__all__ = ["FAST_TIMINGS", "OPEN_TRUST", "LocalSwarm", "NodeProc", "die_with_parent", "wait_until"]

T = TypeVar("T")

#: Membership and replication timings suited to a loopback swarm.
FAST_TIMINGS: dict[str, str] = {
    "HIVEMESH_SYNC_INTERVAL_MS": "300",
    "HIVEMESH_PROBE_INTERVAL_MS": "200",
    "HIVEMESH_PROBE_TIMEOUT_MS": "100",
    "HIVEMESH_SUSPICION_MULT": "3",
    "HIVEMESH_RECONNECT_MIN_S": "0.1",
    "HIVEMESH_RECONNECT_MAX_S": "0.5",
    "HIVEMESH_DIAL_TIMEOUT_S": "2",
}

#: The explicit opt-in of loopback test, demo and bench swarms into ``open``
#: trust (any authenticated peer): nodes are private by default.
OPEN_TRUST: dict[str, str] = {"HIVEMESH_TRUST_MODE": "open"}


def die_with_parent() -> None:
    """In the child: get SIGKILL if the parent dies (Linux), so nodes never leak."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float,
    *,
    what: str = "condition",
    interval_s: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns a truthy value; raise on deadline.

    Exceptions from :mod:`hivemesh.errors` inside ``predicate`` count as
    "not yet" (a node may be restarting).
    """
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except HivemeshError as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_exc})" if last_exc else ""
            raise DeadlineExceeded(f"{what} not reached within {timeout_s}s{extra}")
        time.sleep(interval_s)


@dataclass
class NodeProc:
    """One node process of a :class:`LocalSwarm`."""

    label: str
    data_dir: Path
    port: int = 0
    address: str = ""
    proc: subprocess.Popen[bytes] | None = None
    bootstrap: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    #: The subcommand that runs the node (``up``, or ``agent`` for a planner role).
    command: tuple[str, ...] = ("up",)

    @property
    def client(self) -> Client:
        """A control-socket client for this node."""
        return Client(self.data_dir, timeout_s=5.0)

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.proc is not None and self.proc.poll() is None


class LocalSwarm:
    """Separate node processes under ``root`` (see module docs).

    ``trust_mode`` is the nodes' trust mode: ``"open"`` (this harness's
    default, :data:`OPEN_TRUST`), ``"invite"``, or None for the node default
    (private). ``env`` and a node's ``extra_args`` still override it.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 15.0,
        trust_mode: str | None = "open",
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.nodes: dict[str, NodeProc] = {}
        self.start_timeout_s = start_timeout_s
        src = str(Path(hivemesh.__file__).resolve().parent.parent)
        # a clean slate: the caller's HIVEMESH_* settings must not leak in
        base = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
        base.update(FAST_TIMINGS)
        if trust_mode == "open":
            base.update(OPEN_TRUST)
        elif trust_mode is not None:
            base["HIVEMESH_TRUST_MODE"] = trust_mode
        base.update(env or {})
        base["PYTHONPATH"] = os.pathsep.join(p for p in (src, base.get("PYTHONPATH", "")) if p)
        base["PYTHONUNBUFFERED"] = "1"
        self.env = base

    # -- lifecycle -------------------------------------------------------------

    def start(
        self,
        label: str,
        *,
        bootstrap: list[str] | None = None,
        extra_args: list[str] | None = None,
        command: tuple[str, ...] = ("up",),
    ) -> NodeProc:
        """Start a new node process and wait until it is ready; a node that
        refuses to start raises the error it printed (a ``HivemeshError``).

        ``command`` is the subcommand (any that prints ``up --json``'s ready
        line and takes ``--data-dir``, ``--listen`` and ``--bootstrap``)."""
        if label in self.nodes:
            raise ValueError(f"node {label} exists; use restart()")
        node = NodeProc(
            label,
            self.root / label,
            bootstrap=list(bootstrap or []),
            extra_args=list(extra_args or []),
            command=tuple(command),
        )
        self.nodes[label] = node
        self._spawn(node)
        return node

    def start_many(self, labels: list[str], *, bootstrap: list[str]) -> list[NodeProc]:
        """:meth:`start` several new nodes at once (they boot in parallel)."""
        for label in labels:
            if label in self.nodes:
                raise ValueError(f"node {label} exists; use restart()")
        nodes = [NodeProc(label, self.root / label, bootstrap=list(bootstrap)) for label in labels]
        for node in nodes:
            self.nodes[node.label] = node
            self._launch(node)
        for node in nodes:
            self._ready(node)
        return nodes

    def _spawn(self, node: NodeProc) -> None:
        self._launch(node)
        self._ready(node)

    def _ready(self, node: NodeProc) -> None:
        ready = self._read_ready(node)
        if "error" in ready:  # it refused to start, saying why (the one error shape)
            from hivemesh.error_codes import error_from_wire

            self._reap(node, signal.SIGKILL)
            raise error_from_wire(ready["error"])
        node.address = ready["address"]
        node.port = int(ready["listen"].rpartition(":")[2])

    def _launch(self, node: NodeProc) -> None:
        cmd = [
            sys.executable,
            "-m",
            "hivemesh",
            *node.command,
            "--json",
            "--data-dir",
            str(node.data_dir),
            "--listen",
            f"127.0.0.1:{node.port}",
        ]
        for b in node.bootstrap:
            cmd += ["--bootstrap", b]
        cmd += node.extra_args
        node.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        log = os.fdopen(os.open(node.data_dir / "daemon.log", flags, 0o600), "ab")
        try:
            node.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            log.close()

    def _read_ready(self, node: NodeProc) -> dict[str, Any]:
        proc = node.proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        buf = b""
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or proc.poll() is not None:
                self._reap(node, signal.SIGKILL)
                tail = (node.data_dir / "daemon.log").read_text(errors="replace")[-2000:]
                raise DeadlineExceeded(f"node {node.label} did not start:\n{tail}")
            # poll, not select: a test may hold more than FD_SETSIZE sockets
            poller = select.poll()
            poller.register(proc.stdout, select.POLLIN)
            if poller.poll(remaining * 1000):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                buf += chunk
        doc: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
        return doc

    def kill(self, label: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) to a node and reap it."""
        self._reap(self.nodes[label], sig)

    def restart(self, label: str) -> NodeProc:
        """Start a stopped node again on its data dir and port."""
        node = self.nodes[label]
        if node.running:
            raise ValueError(f"node {label} is still running")
        self._spawn(node)
        return node

    def restart_many(self, labels: list[str]) -> list[NodeProc]:
        """:meth:`restart` several stopped nodes at once (they boot in parallel,
        and dial each other and everyone else together); wait until all are ready."""
        nodes = [self.nodes[label] for label in labels]
        for node in nodes:
            if node.running:
                raise ValueError(f"node {node.label} is still running")
        for node in nodes:
            self._launch(node)
        for node in nodes:
            self._ready(node)
        return nodes

    def _reap(self, node: NodeProc, sig: int | None, grace_s: float = 5.0) -> None:
        """Send ``sig`` (None: it was sent already), wait ``grace_s``, then SIGKILL."""
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is None:
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(grace_s)
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        """Stop every node: SIGTERM, then SIGKILL after a grace period."""
        for node in self.nodes.values():
            if node.running and node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            # not a second SIGTERM: a daemon exits without cleanup on a second signal
            self._reap(node, None)

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observations ------------------------------------------------------------

    def running(self) -> list[NodeProc]:
        """Nodes whose process is alive, in start order."""
        return [n for n in self.nodes.values() if n.running]

    def status(self, label: str) -> dict[str, Any]:
        """``status`` of one node."""
        return self.nodes[label].client.status()

    def converged(self, labels: list[str] | None = None) -> dict[str, int] | None:
        """The common version vector if every named node holds the same one."""
        nodes = [self.nodes[label] for label in labels] if labels else self.running()
        vvs = [n.client.status()["journal"]["version_vector"] for n in nodes]
        first: dict[str, int] = vvs[0]
        return first if all(v == first for v in vvs[1:]) else None

    def member_state(self, observer: str, subject: str) -> str | None:
        """What ``observer`` believes about ``subject`` (up/suspect/down/left)."""
        members = self.nodes[observer].client.status()["members"]
        got = members.get(self.nodes[subject].address)
        return None if got is None else str(got["state"])
