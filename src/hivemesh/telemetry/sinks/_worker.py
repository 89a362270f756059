"""A background worker that pushes committed tables to an external system.

Theory of operation
-------------------
The collector hands every committed flush (an Arrow table) to each sink's
:meth:`PushSink.submit`, which must never block the collector: tables go into
a bounded queue (full -> the table is dropped and ``dropped_tables`` counted;
the DuckDB store still has the rows). One daemon thread per sink takes tables
in order and calls :meth:`PushSink.push` with a deadline.

A table is kept until it is written. A transient failure (the system is
down or unreachable, answers 5xx, 404 or 429, or the target database or
table does not exist yet and could not be created) is retried with
exponential backoff (``backoff_s`` doubling up to ``max_backoff_s``) for as
long as it takes: later tables wait behind it in the bounded queue, and
only when that queue is full are new tables dropped (``dropped_tables``).
A permanent refusal (:class:`~hivemesh.telemetry.errors.SinkRefused`: the system
rejects the body itself, e.g. 400) is retried ``max_attempts`` times, then
counted in ``failed_tables``. :meth:`PushSink.close` waits up to its
timeout for the queue to empty; what is still queued then is counted as
dropped. The DuckDB store keeps every row either way: sinks are mirrors.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.telemetry.errors import SinkRefused, SinkUnavailable

__all__ = ["PushSink", "SinkStats", "check_status", "http_post"]


@dataclass(frozen=True, slots=True)
class SinkStats:
    """Counters of one push sink."""

    pushed_tables: int
    pushed_rows: int
    failed_tables: int
    dropped_tables: int
    retries: int
    last_error: str


def http_post(url: str, body: bytes, content_type: str, timeout_s: float) -> tuple[int, bytes]:
    """POST ``body``; return ``(status, response body)`` (HTTP errors included)."""
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, ValueError) as exc:  # refused, reset, timed out, bad URL
        raise SinkUnavailable(f"POST {url.split('?')[0]}: {type(exc).__name__}: {exc}") from None


def check_status(system: str, status: int, ok: int, body: bytes) -> None:
    """Raise unless ``status == ok``: :class:`SinkRefused` for a permanent
    4xx (the body itself is refused), else :class:`SinkUnavailable`."""
    if status == ok:
        return
    text = body[:300].decode("utf-8", "replace").strip()
    if 400 <= status < 500 and status not in (404, 408, 425, 429):
        raise SinkRefused(f"{system} refused the write ({status}): {text}")
    raise SinkUnavailable(f"{system} answered {status}: {text}")


class PushSink:
    """Base class: subclasses implement :meth:`push` (raise on failure)."""

    name = "sink"

    def __init__(
        self,
        *,
        queue_max: int = 64,
        timeout_s: float = 5.0,
        max_attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max(max_backoff_s, backoff_s)
        self._closing = threading.Event()
        self._q: queue.Queue[pa.Table | None] = queue.Queue(maxsize=queue_max)
        self._pushed = self._rows = self._failed = self._dropped = self._retries = 0
        self._last_error = ""
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"hm-sink-{self.name}", daemon=True)
        self._thread.start()

    def push(self, table: pa.Table) -> None:
        """Send one table to the external system; raise on any failure
        (:class:`SinkRefused` when retrying cannot help)."""
        raise NotImplementedError

    def submit(self, table: pa.Table) -> None:
        """Queue a committed table (never blocks; full queue drops and counts)."""
        try:
            with self._lock:
                self._busy += 1
            self._q.put_nowait(table)
        except queue.Full:
            with self._lock:
                self._busy -= 1
                self._dropped += 1

    def _loop(self) -> None:
        while True:
            table = self._q.get()
            if table is None:
                return
            if self._write(table):
                self._pushed += 1
                self._rows += table.num_rows
            with self._lock:
                self._busy -= 1

    def _write(self, table: pa.Table) -> bool:
        """Push ``table`` until written (True); False once refused for good or closing."""
        delay = self.backoff_s
        refusals = 0
        while True:
            try:
                self.push(table)
                return True
            except Exception as exc:  # any failure of the remote: keep the table, retry
                self._last_error = f"{type(exc).__name__}: {exc}"[:300]
                if isinstance(exc, SinkRefused):
                    refusals += 1
                    if refusals >= self.max_attempts:
                        self._failed += 1
                        return False
            if self._closing.wait(delay):
                self._dropped += 1  # closing with the system still failing: counted
                return False
            self._retries += 1
            delay = min(delay * 2, self.max_backoff_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every submitted table was pushed or given up (True), or timeout."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if self._busy == 0:
                    return True
            time.sleep(0.01)
        return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Finish queued work (up to ``timeout_s``) and stop the thread; tables
        still unwritten then are counted as dropped."""
        self.wait_idle(timeout_s)
        self._closing.set()
        while True:  # the worker stops retrying; what it never took is dropped
            try:
                if self._q.get_nowait() is not None:
                    with self._lock:
                        self._busy -= 1
                        self._dropped += 1
            except queue.Empty:
                break
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:  # a submit raced in: the thread stops at _closing anyway
            return
        self._thread.join(timeout_s)

    def statistics(self) -> SinkStats:
        """A frozen snapshot of the counters."""
        return SinkStats(self._pushed, self._rows, self._failed, self._dropped, self._retries,
                         self._last_error)  # fmt: skip
