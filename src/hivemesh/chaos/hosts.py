"""Real ``hivemesh up`` daemons, one per network namespace, and their faults.

A :class:`ChaosCluster` builds a :class:`hivemesh.netlab.Lab` (one host per
node on the lab's public segment, ``198.18.0.0/24``, inside namespaces only)
and runs one ``hivemesh up`` in each host. The runner talks to a node through
its control socket, a unix socket in its data dir: namespaces separate the
network only, so the workload and the checks reach a node even while the
node is cut off from its peers.

Process faults act on the daemon's own pid (``ip netns exec`` and
``faketime`` both exec): ``kill -9``, ``SIGSTOP``/``SIGCONT``, a restart
under libfaketime (the Debian ``faketime`` command: a clock offset for that
process only; nothing inside hivemesh knows), a restart from an older copy
of its store, and a full disk (the node's data dir is a small tmpfs, filled
with a ballast file). Network faults are :class:`hivemesh.netlab.Faults`
(nftables on the receiving host: partitions, one-way cuts, ``numgen random``
loss); delay and reordering go through NFQUEUE to :mod:`hivemesh.chaos.delay`
inside the host.

Cleanup: :meth:`ChaosCluster.close` (and the ``with`` block) ends every
daemon, deletes the namespaces and unmounts the tmpfs, on every exit path;
each daemon also gets ``SIGKILL`` if the runner dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import hivemesh
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import FAST_TIMINGS, OPEN_TRUST, die_with_parent
from hivemesh.errors import DeadlineExceeded, HivemeshError
from hivemesh.netlab import Faults, Host, Lab, Nat

__all__ = ["TOPOLOGIES", "ChaosCluster", "ChaosNode", "ChaosService"]

PORT = 7000
#: Size of the tmpfs a node gets when it may see a full disk.
DISK_BYTES = 48 * 1024 * 1024
#: ``flat``: every node on the public segment; ``nat``: n0 on the public
#: segment, every other node behind a NAT router of its own, every third
#: one (n2, n5, n8) a symmetric one (``fully-random``), the others
#: port-preserving MASQUERADE.
TOPOLOGIES = ("flat", "nat")


@dataclass
class ChaosNode:
    """One daemon in one namespace."""

    label: str
    host: Host
    data_dir: Path
    address: str = ""
    proc: subprocess.Popen[bytes] | None = None
    clock_offset_s: float = 0.0
    paused: bool = False
    small_disk: bool = False
    #: runs the telemetry collector (``hivemesh up --collector``)
    collector: bool = False
    starts: int = 0
    #: exit codes of lives that ended on their own (not by a fault of ours)
    exits: list[int] = field(default_factory=list)
    #: typed errors a start was refused with (a full disk, a corrupt store)
    refusals: list[str] = field(default_factory=list)
    #: the hivemesh command it runs (``up``; ``audit node`` for an audit role)
    command: tuple[str, ...] = ("up",)
    #: more arguments for that command (``--mesh URL``, ``--role ROLE`` ...)
    args: list[str] = field(default_factory=list)
    #: more environment for the daemon (``HIVEMESH_RELAYS`` ...)
    env: dict[str, str] = field(default_factory=dict)
    #: endpoints it bootstraps from (None: every other node's)
    bootstrap: list[str] | None = None

    @property
    def endpoint(self) -> str:
        """``ip:port`` of its host (on the public segment, or on its NAT's LAN)."""
        return f"{self.host.ip}:{PORT}"

    @property
    def nat(self) -> Nat | None:
        """The NAT router it sits behind (``topology="nat"``), if any."""
        return self.host.behind

    @property
    def running(self) -> bool:
        """The process is alive (paused or not)."""
        return self.proc is not None and self.proc.poll() is None

    def client(self, timeout_s: float = 5.0) -> Client:
        """A control-socket client (reachable whatever the network does)."""
        return Client(self.data_dir, timeout_s=timeout_s)


@dataclass
class ChaosService:
    """A helper process in a host of its own (a NATS server, the audit's
    fixture): ``argv`` is run inside ``host``; it is ready when its stdout's
    first line is a JSON object (``ready_line``) or when ``ready_text``
    appears in its log."""

    label: str
    host: Host
    argv: list[str]
    ready_text: str = ""
    proc: subprocess.Popen[bytes] | None = None
    #: the JSON object its first stdout line held (``ready_text`` empty)
    ready: dict[str, Any] = field(default_factory=dict)
    starts: int = 0

    @property
    def running(self) -> bool:
        """The process is alive."""
        return self.proc is not None and self.proc.poll() is None


class ChaosCluster:
    """``n`` nodes in a fresh lab under ``root`` (see the module docs)."""

    def __init__(
        self,
        root: Path,
        n: int,
        *,
        small_disks: frozenset[int] = frozenset(),
        start_timeout_s: float = 30.0,
        topology: str = "flat",
    ) -> None:
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}")
        self.root = root
        self.n = n
        self.topology = topology
        self.services: list[ChaosService] = []
        self.small_disks = small_disks
        self.start_timeout_s = start_timeout_s
        self.lab = Lab()
        self.faults: Faults | None = None
        self.nodes: list[ChaosNode] = []
        self._mounts: list[Path] = []
        self._delays: dict[str, subprocess.Popen[bytes]] = {}
        src = str(Path(hivemesh.__file__).resolve().parent.parent)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HIVEMESH_", "OPENAI_"))  # no LLM in the lab
        }
        env.update(FAST_TIMINGS)
        env.update(OPEN_TRUST)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> ChaosCluster:
        try:
            self.lab.__enter__()
            self.faults = Faults(self.lab)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _build(self) -> None:
        from hivemesh.stores.keyfile import load_or_create_identity
        from hivemesh.stores.private import secure_data_dir

        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(self.n):
            label = f"n{i}"
            data_dir = self.root / label
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if i in self.small_disks:
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs",
                     str(data_dir)],
                    check=True, capture_output=True, timeout=10,
                )  # fmt: skip
                self._mounts.append(data_dir)
            secure_data_dir(data_dir)
            ident = load_or_create_identity(data_dir)
            behind = None
            if self.topology == "nat" and i > 0:
                behind = self.lab.add_nat(f"nat{i}", symmetric=i % 3 == 2)
            host = self.lab.add_host(label, behind=behind)
            node = ChaosNode(label, host, data_dir, ident.address, small_disk=i in self.small_disks)
            self.nodes.append(node)
        # one voter set for every proposer, fixed before the first lease call
        voters = sorted(n.address for n in self.nodes)
        for node in self.nodes:
            (node.data_dir / "lease_voters.json").write_text(json.dumps({"voters": voters}))
            os.chmod(node.data_dir / "lease_voters.json", 0o600)

    def close(self) -> None:
        """End every daemon and service, delete the lab, unmount the small
        disks (idempotent)."""
        for node in self.nodes:
            with contextlib.suppress(HivemeshError, OSError, subprocess.SubprocessError):
                self.undelay(node)
        for svc in self.services:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self.stop_service(svc)
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGCONT)
                    node.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(5)
            if node.proc is not None and node.proc.stdout is not None:
                node.proc.stdout.close()
        self.lab.close()
        for path in self._mounts:
            done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self._mounts.clear()

    # -- processes -------------------------------------------------------------

    def start(self, node: ChaosNode, *, bootstrap: list[ChaosNode] | None = None) -> None:
        """Start (or restart) ``node``'s daemon and wait for its ready line.

        Raises the typed error the daemon printed if it refused to start, or
        :class:`~hivemesh.errors.DeadlineExceeded` with its log's tail."""
        if bootstrap is not None:
            peers = [p.endpoint for p in bootstrap]
        elif node.bootstrap is not None:
            peers = list(node.bootstrap)
        else:
            peers = [m.endpoint for m in self.nodes if m is not node]
        argv = [sys.executable, "-m", "hivemesh", *node.command, "--json", "--data-dir",
                str(node.data_dir), "--listen", node.endpoint]  # fmt: skip
        for p in peers:
            argv += ["--bootstrap", p]
        if node.collector:
            argv.append("--collector")
        argv += node.args
        env = dict(self.env)
        env.update(node.env)
        if node.clock_offset_s:
            argv = ["faketime", "-f", f"{node.clock_offset_s:+.3f}s", *argv]
            env["DONT_FAKE_MONOTONIC"] = "1"  # an offset of wall time only
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        log = os.fdopen(os.open(self._log_path(node), flags, 0o600), "ab")
        try:
            node.proc = node.host.popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            log.close()
        node.paused = False
        node.starts += 1
        ready = self._read_ready(node)
        if "error" in ready:
            from hivemesh.error_codes import error_from_wire

            assert node.proc is not None
            node.proc.wait(10)  # it exits after printing why
            if node.proc.stdout is not None:
                node.proc.stdout.close()
            err = error_from_wire(ready["error"])
            node.refusals.append(err.code)
            raise err

    def _log_path(self, node: ChaosNode) -> Path:
        # beside the data dir (a full small disk must not eat the log)
        return self.root / f"{node.label}.log"

    def log_tail(self, node: ChaosNode, chars: int = 1500) -> str:
        """The end of ``node``'s daemon log."""
        try:
            return self._log_path(node).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _read_ready(self, node: ChaosNode) -> dict[str, Any]:
        proc = node.proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        buf = b""
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (proc.poll() is not None and not buf):
                code = proc.poll()
                self.kill(node)  # an exit before the ready line counts as its own
                raise DeadlineExceeded(
                    f"{node.label} did not start (exit {code}):\n{self.log_tail(node)}"
                )
            poller = select.poll()
            poller.register(proc.stdout, select.POLLIN)
            if poller.poll(min(remaining, 0.5) * 1000):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    if proc.poll() is None:
                        time.sleep(0.05)
                    continue
                buf += chunk
        doc: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
        return doc

    def kill(self, node: ChaosNode, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL: ``kill -9``) and reap the process."""
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is not None and proc.stdout is not None and not proc.stdout.closed:
            node.exits.append(proc.returncode)  # it had ended before we came: on its own
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                if node.paused:
                    proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        node.paused = False
        if proc.stdout is not None:
            proc.stdout.close()

    def pause(self, node: ChaosNode) -> None:
        """``SIGSTOP``: the process stays, frozen (sockets open, nothing answers)."""
        if node.running and node.proc is not None:
            node.proc.send_signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, node: ChaosNode) -> None:
        """``SIGCONT``."""
        if node.running and node.proc is not None:
            node.proc.send_signal(signal.SIGCONT)
        node.paused = False

    # -- services -------------------------------------------------------------------

    def add_service(self, label: str, argv: list[str], *, ready_text: str = "") -> ChaosService:
        """A new host ``label`` on the public segment for a helper process
        (not started: :meth:`start_service`)."""
        svc = ChaosService(label, self.lab.add_host(label), argv, ready_text)
        self.services.append(svc)
        return svc

    def _service_log(self, svc: ChaosService) -> Path:
        return self.root / f"{svc.label}.log"

    def start_service(self, svc: ChaosService, timeout_s: float = 30.0) -> None:
        """Start ``svc`` and wait until it is ready (:class:`ChaosService`)."""
        log_path = self._service_log(svc)
        offset = log_path.stat().st_size if log_path.exists() else 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        log = os.fdopen(os.open(log_path, flags, 0o600), "ab")
        try:
            svc.proc = svc.host.popen(
                svc.argv, env=self.env, stdout=log if svc.ready_text else subprocess.PIPE,
                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        finally:
            log.close()
        svc.starts += 1
        deadline = time.monotonic() + timeout_s
        if not svc.ready_text:
            assert svc.proc.stdout is not None
            line = b""
            while not line.endswith(b"\n") and time.monotonic() < deadline:
                if not select.select([svc.proc.stdout], [], [], 0.5)[0]:
                    if svc.proc.poll() is not None:
                        break
                    continue
                chunk = os.read(svc.proc.stdout.fileno(), 1)
                if not chunk:
                    break
                line += chunk
            if line.startswith(b"{") and line.endswith(b"\n"):
                svc.ready = json.loads(line)
                return
        else:
            while time.monotonic() < deadline and svc.proc.poll() is None:
                with contextlib.suppress(OSError), open(log_path, "rb") as f:
                    f.seek(offset)
                    if svc.ready_text.encode() in f.read():
                        return
                time.sleep(0.05)
        tail = self._service_log(svc).read_text(errors="replace")[-1500:]
        self.stop_service(svc)
        raise DeadlineExceeded(f"{svc.label} did not start in {timeout_s:g} s:\n{tail}")

    def stop_service(self, svc: ChaosService, sig: int = signal.SIGTERM) -> None:
        """End ``svc`` with ``sig`` (``SIGKILL``: a crash) and reap it."""
        proc = svc.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

    # -- delay (user space, NFQUEUE) ---------------------------------------------------

    def delay(self, node: ChaosNode, delay_ms: float, jitter_ms: float, seed: int) -> None:
        """Delay (and reorder) what ``node`` receives from its peers
        (:mod:`hivemesh.chaos.delay` inside its namespace, an nftables
        ``NFQUEUE --queue-bypass`` rule in front of it)."""
        self.undelay(node)
        queue = 100 + self.nodes.index(node)
        argv = [sys.executable, "-m", "hivemesh.chaos.delay", "--queue", str(queue),
                "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms),
                "--seed", str(seed)]  # fmt: skip
        proc = node.host.popen(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], 10.0)[0]
        if not ready or not proc.stdout.readline().startswith(b"ready"):
            proc.kill()
            proc.wait(5)
            raise DeadlineExceeded(f"{node.label}: the delay queue did not start")
        self._delays[node.label] = proc
        # iptables' NFQUEUE target (the kernel here has it; nft's own queue
        # expression is missing): in front of the daemon, after netlab's drops
        node.host.run(["iptables", "-A", "INPUT", *self._queue_rule(queue)])

    @staticmethod
    def _queue_rule(queue: int) -> list[str]:
        return ["-s", "198.18.0.0/24", "-j", "NFQUEUE", "--queue-num", str(queue),
                "--queue-bypass"]  # fmt: skip

    def undelay(self, node: ChaosNode) -> None:
        """Remove ``node``'s delay rule and stop its queue program."""
        proc = self._delays.pop(node.label, None)
        if proc is None:
            return
        queue = 100 + self.nodes.index(node)
        with contextlib.suppress(HivemeshError):
            node.host.run(["iptables", "-D", "INPUT", *self._queue_rule(queue)])
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    # -- disk ----------------------------------------------------------------------

    def snapshot_store(self, node: ChaosNode) -> Path:
        """Copy ``node``'s store files (a stopped node: a consistent copy)."""
        dest = self.root / f"{node.label}.store-copy"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for f in node.data_dir.glob("store.db*"):
            shutil.copy2(f, dest / f.name)
        return dest

    def restore_store(self, node: ChaosNode, copy: Path) -> None:
        """Put an older copy of the store back (the key and the feed mark stay)."""
        for f in node.data_dir.glob("store.db*"):
            f.unlink()
        for f in copy.iterdir():
            shutil.copy2(f, node.data_dir / f.name)

    def fill_disk(self, node: ChaosNode) -> int:
        """Fill ``node``'s small disk with a ballast file; the bytes written."""
        return fill_file(node.data_dir / "ballast")

    def free_disk(self, node: ChaosNode) -> None:
        """Remove the ballast."""
        with contextlib.suppress(FileNotFoundError):
            (node.data_dir / "ballast").unlink()

    # -- observations ------------------------------------------------------------------

    def status(self, node: ChaosNode, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """``status`` of a running node, or None if it does not answer in time."""
        if not node.running or node.paused:
            return None
        try:
            st: dict[str, Any] = node.client(timeout_s).status()
        except (HivemeshError, OSError):
            return None
        return st


def fill_file(path: Path) -> int:
    """Write ``path`` until its file system is full (big blocks, then the last
    pages); returns the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written
