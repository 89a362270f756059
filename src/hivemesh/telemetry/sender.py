"""Ship spooled records to the collector, transport-agnostic.

Theory of operation
-------------------
The :class:`Sender` loops: take the oldest waiting batch from the
:class:`~.spool.Spool`, hand its bytes to ``deliver`` (an async callable the
node supplies: it sends one acknowledged direct message to the node named
``metrics-collector`` with a deadline and returns the collector's ack dict),
and on ``{"ok": True, "acked_through": n}`` delete the records up to ``n``.

Batches are columnar (``"v": 2``, :mod:`.columnar`: ~20 bytes a record, so
up to :data:`~.schema.MAX_BATCH_RECORDS` records in one direct message)
unless ``columnar=False`` or a spooled record does not fit the typed form,
in which case that batch goes as v1 (a map per record). One batch is in
flight at a time, in seq order. So the collector sees each
sender's records in order, and a hole below a stored seq is a true loss.

Any failure (the deliver callable raises, times out, or the collector answers
``ok: False`` -- e.g. ``busy`` under backpressure, or ``untrusted_author``
until the sender is admitted) keeps the records in the spool and retries after an
exponential backoff with full jitter (``min_backoff_s`` doubling up to
``max_backoff_s``). Nothing is ever dropped here; the spool's bound is the
only place a record can be refused, and that shows up as a gap. The last
failure is kept with its code (:attr:`SenderStats.last_error_code`: the
error's ``code``, or the collector's refusal reason), e.g. ``no_handler``
when the node named ``metrics-collector`` runs no collector.

Stopping is prompt: :meth:`Sender.run` abandons a delivery in flight when
``stop`` is set (its records stay spooled; if the collector stored them
anyway, the resend is de-duplicated), and :meth:`Sender.flush` never runs
past its timeout. :meth:`Sender.wait_stored` waits until a seq is acked.

The loop wakes when records are appended (:meth:`Sender.notify`) or every
``idle_poll_s``; it lingers ``linger_s`` before sending a small batch so
records travel in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hivemesh.errors import DeadlineExceeded, HivemeshError, InvalidArgument
from hivemesh.telemetry.errors import TelemetryRefused
from hivemesh.telemetry.spool import Spool

__all__ = ["Deliver", "Sender", "SenderStats"]

#: Sends one batch and returns the collector's ack (raises on failure).
Deliver = Callable[[bytes], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True, slots=True)
class SenderStats:
    """Counters of a sender."""

    batches_sent: int
    records_acked: int
    failures: int
    last_error: str
    backlog: int
    #: Code of the last failure (``no_handler``, ``deadline_exceeded``, ``untrusted_author``...).
    last_error_code: str = ""


class Sender:
    """Drains a :class:`Spool` through a ``deliver`` callable, retrying forever."""

    def __init__(
        self,
        spool: Spool,
        deliver: Deliver,
        *,
        batch_max: int = 1000,
        batch_max_bytes: int = 1_000_000,
        columnar: bool = True,
        linger_s: float = 0.05,
        idle_poll_s: float = 1.0,
        deliver_timeout_s: float = 10.0,
        min_backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        if batch_max < 1 or min_backoff_s <= 0 or max_backoff_s < min_backoff_s:
            raise InvalidArgument("bad sender settings")
        self.spool = spool
        self._deliver = deliver
        self.batch_max = batch_max
        self.batch_max_bytes = batch_max_bytes
        self.columnar = columnar
        self.linger_s = linger_s
        self.idle_poll_s = idle_poll_s
        self.deliver_timeout_s = deliver_timeout_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._batches = 0
        self._acked = 0
        self._failures = 0
        self._last_error = ""
        self._last_code = ""
        self._stored: list[tuple[int, asyncio.Future[None]]] = []

    def notify(self) -> None:
        """Tell the loop that records were appended (call from the event loop thread)."""
        self._wake.set()

    async def send_once(self) -> int:
        """Deliver the oldest waiting batch once; return records acked (0 if none waiting).

        Raises whatever ``deliver`` raised, or :class:`DeadlineExceeded`.
        """
        batch = self.spool.take_batch(self.batch_max, self.batch_max_bytes, columnar=self.columnar)
        if batch is None:
            return 0
        try:
            ack = await asyncio.wait_for(self._deliver(batch.payload), self.deliver_timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"collector did not ack in {self.deliver_timeout_s}s") from None
        if not isinstance(ack, Mapping) or ack.get("ok") is not True:
            err = str(ack.get("error")) if isinstance(ack, Mapping) else repr(ack)[:40]
            detail = str(ack.get("detail", ""))[:200] if isinstance(ack, Mapping) else ""
            raise TelemetryRefused(f"collector refused the batch: {err}: {detail}", reason=err)
        through = ack.get("acked_through")
        if type(through) is not int or through < batch.first_seq:
            raise TelemetryRefused(f"bad ack {dict(ack)!r:.200}", reason="bad_ack")
        through = min(through, batch.last_seq)
        n = self.spool.ack(through)
        self._batches += 1
        self._acked += n
        self._resolve_stored(through)
        return n

    def _fail(self, exc: BaseException) -> None:
        self._failures += 1
        self._last_error = f"{type(exc).__name__}: {exc}"[:300]
        reason = getattr(exc, "reason", "")
        code = exc.code if isinstance(exc, HivemeshError) else type(exc).__name__
        self._last_code = reason or code

    def _resolve_stored(self, through: int) -> None:
        keep = []
        for seq, fut in self._stored:
            if seq <= through:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._stored = keep

    async def wait_stored(self, seq: int, timeout_s: float) -> bool:
        """Wait until the collector acknowledged (stored) every record up to
        ``seq``; False if ``timeout_s`` passed first."""
        if self.spool.statistics().acked_seq >= seq:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stored.append((seq, fut))
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            self._stored = [(q, f) for q, f in self._stored if f is not fut]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Send until ``stop`` is set (or forever), backing off on failures."""
        stop = stop or asyncio.Event()
        failures_in_row = 0
        while not stop.is_set():
            try:
                if self.spool.backlog < self.batch_max and self.linger_s > 0:
                    await self._sleep_or_stop(stop, self.linger_s, wake=False)
                self._wake.clear()  # a notify from here on wakes the idle sleep below
                sent = await self._send_or_stop(stop)
                failures_in_row = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any delivery failure: keep the records, retry later
                self._fail(exc)
                failures_in_row += 1
                cap = min(self.max_backoff_s, self.min_backoff_s * 2 ** min(failures_in_row, 20))
                delay = self._rng.uniform(self.min_backoff_s, cap)
                await self._sleep_or_stop(stop, delay, wake=False)  # new records: no hurry
                continue
            if sent == 0:
                await self._sleep_or_stop(stop, self.idle_poll_s)

    async def flush(self, timeout_s: float) -> bool:
        """Send until the spool is empty or ``timeout_s`` passes; True if empty."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        delay = self.min_backoff_s
        while self.spool.backlog and loop.time() < end:
            try:
                async with asyncio.timeout_at(end):
                    await self.send_once()
                delay = self.min_backoff_s
            except Exception as exc:  # TimeoutError at the end, or a delivery failure
                self._fail(exc)
                await asyncio.sleep(min(delay, max(0.0, end - loop.time())))
                delay = min(self.max_backoff_s, delay * 2)
        return self.spool.backlog == 0

    async def _send_or_stop(self, stop: asyncio.Event) -> int:
        """:meth:`send_once`, abandoned (0) when ``stop`` is set meanwhile."""
        send = asyncio.ensure_future(self.send_once())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((send, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not send.done():
                send.cancel()
                await asyncio.wait((send,))
        return 0 if send.cancelled() else send.result()

    async def _sleep_or_stop(self, stop: asyncio.Event, seconds: float, wake: bool = True) -> None:
        waiters = [asyncio.ensure_future(stop.wait())]
        if wake:
            waiters.append(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w

    def statistics(self) -> SenderStats:
        """A frozen snapshot of the sender's counters."""
        return SenderStats(
            batches_sent=self._batches,
            records_acked=self._acked,
            failures=self._failures,
            last_error=self._last_error,
            backlog=self.spool.backlog,
            last_error_code=self._last_code,
        )
