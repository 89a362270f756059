"""A background worker that pushes committed tables to an external system.

Theory of operation
-------------------
The collector hands every committed flush (an Arrow table) to each sink's
:meth:`PushSink.submit`, which must never block the collector: tables go into
a bounded queue (full -> the table is dropped and ``dropped_tables`` counted;
the DuckDB store still has the rows). One daemon thread per sink takes tables
in order and calls :meth:`PushSink.push` with a deadline; transient failures
are retried with exponential backoff up to ``max_attempts``, then counted in
``failed_tables``. Sinks are best-effort mirrors; the store is the record.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["PushSink", "SinkStats", "http_post"]


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
    ) -> None:
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._q: queue.Queue[pa.Table | None] = queue.Queue(maxsize=queue_max)
        self._pushed = self._rows = self._failed = self._dropped = self._retries = 0
        self._last_error = ""
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"hm-sink-{self.name}", daemon=True)
        self._thread.start()

    def push(self, table: pa.Table) -> None:
        """Send one table to the external system; raise on any failure."""
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
            delay = self.backoff_s
            for attempt in range(self.max_attempts):
                try:
                    self.push(table)
                except Exception as exc:  # any failure of the remote: retry, then count
                    self._last_error = f"{type(exc).__name__}: {exc}"[:200]
                    if attempt + 1 < self.max_attempts:
                        self._retries += 1
                        time.sleep(delay)
                        delay *= 2
                        continue
                    self._failed += 1
                else:
                    self._pushed += 1
                    self._rows += table.num_rows
                break
            with self._lock:
                self._busy -= 1

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
        """Finish queued work (up to ``timeout_s``) and stop the thread."""
        self.wait_idle(timeout_s)
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def statistics(self) -> SinkStats:
        """A frozen snapshot of the counters."""
        return SinkStats(self._pushed, self._rows, self._failed, self._dropped, self._retries,
                         self._last_error)  # fmt: skip
