"""Parent side of ``bench fanout``: worker processes that are always reaped.

Each worker runs in its own process group (``start_new_session``), speaks
JSON lines on stdin/stdout (see :mod:`hivemesh.bench._fanout_wire`) and
writes its stderr to a log file whose tail is quoted when it fails. A
:class:`Fleet` is an async context manager: on exit, however the run ended,
every worker is asked to stop, given a short grace, then its whole process
group is killed. Every request has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from types import TracebackType
from typing import Any

from hivemesh.errors import BenchWorkerFailed as WorkerFailed
from hivemesh.errors import DeadlineExceeded

__all__ = ["Fleet", "Worker"]

_LINE_LIMIT = 64 * 1024 * 1024


class Worker:
    """One worker process (create with :meth:`Fleet.spawn`)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.hello: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    def _log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def _read_reply(self, what: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(
                f"worker {self.name}: no answer to {what} in {timeout_s}s"
            ) from None
        if not line:
            raise WorkerFailed(f"worker {self.name} exited during {what}:\n{self._log_tail()}")
        try:
            msg: dict[str, Any] = json.loads(line)
        except ValueError:
            raise WorkerFailed(f"worker {self.name} wrote non-JSON: {line[:200]!r}") from None
        if not msg.get("ok"):
            raise WorkerFailed(f"worker {self.name}: {what} failed: {msg.get('error')}")
        return msg

    async def call(self, op: str, timeout_s: float, **args: Any) -> dict[str, Any]:
        """Send one request and wait (at most ``timeout_s``) for its reply."""
        assert self.proc.stdin is not None
        async with self._lock:
            try:
                self.proc.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise WorkerFailed(f"worker {self.name} is gone:\n{self._log_tail()}") from None
            return await self._read_reply(op, timeout_s)

    async def stop(self, grace_s: float = 3.0) -> None:
        """Ask the worker to exit; kill its process group if it does not."""
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.write(b'{"op":"stop"}\n')
                await self.proc.stdin.drain()
                self.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace_s)
        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), grace_s)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (idempotent)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class Fleet:
    """The workers of one system under test; all reaped on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.workers: list[Worker] = []

    async def spawn(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 30.0,
    ) -> Worker:
        """Start ``argv`` and wait for its hello line."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
                limit=_LINE_LIMIT,
            )
        worker = Worker(name, proc, log_path)
        self.workers.append(worker)
        worker.hello = await worker._read_reply("start", ready_timeout_s)
        return worker

    async def gather(self, op: str, timeout_s: float, **args: Any) -> list[dict[str, Any]]:
        """``call`` every worker concurrently; replies in worker order."""
        return list(await asyncio.gather(*(w.call(op, timeout_s, **args) for w in self.workers)))

    async def close(self) -> None:
        """Stop every worker (killing stragglers)."""
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)
        for w in self.workers:
            w.kill()

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
