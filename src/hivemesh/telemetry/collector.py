"""The ``metrics-collector`` role: validate, de-duplicate, store, acknowledge.

Theory of operation
-------------------
:meth:`Collector.ingest` takes one batch from one sender (the mesh passes the
authenticated sender address and whether the node's trust policy admits it)
and returns the ack dict that travels back to the sender::

    {"ok": True, "acked_through": 1500, "accepted": 998, "duplicates": 2,
     "rejected": 0}

or ``{"ok": False, "error": "<code>", "detail": "..."}`` when the whole batch
is refused (untrusted sender, malformed or oversize bytes, bad envelope).
When records were rejected, ``errors`` lists the first few
(``{"index", "error", "detail"}``), so a sender learns why.

A batch that arrives already decoded (a hand-sent message, not our
senders' bytes) may be a flat record or a list of them: :mod:`.flat` maps
those onto the schema first, and its reason for refusing one is the answer.

Steps, all on the event-loop thread except the database write:

1. **Validate** strictly (:mod:`.schema`). A columnar (v2) batch from our
   senders is checked with vectorised kernels and one check per distinct
   combination of names and attributes, and becomes Arrow columns without
   Python work per record (:mod:`.columnar`); if any of its records breaks a
   rule, its records are rebuilt and judged one by one like a v1 batch's.
   A bad record is dropped and
   counted by error code; the rest of its batch goes on. Its seq still counts
   as accounted for, so a rejection is never mistaken for a gap.
2. **De-duplicate** by ``(sender, seq)`` with a :class:`~.seqtrack.SeqTracker`
   per sender, or by ``id`` for hand-sent records that carry no seq.
3. **Buffer** each batch's rows as an Arrow record batch. Many concurrent
   ingests share one flush (group commit): a flush runs when
   ``flush_max_rows`` rows wait or after ``flush_interval_s`` (and at once
   after the previous flush if more waits), in a single writer thread, as one
   Arrow insert plus the sender states and counters, in one DuckDB
   transaction.
4. **Acknowledge** only after that flush commits, so an acked record is
   durable. If the write fails every waiter gets ``ok: False``, the trackers
   are reloaded from the store, and the senders simply resend. A batch that
   cannot even be staged (converted to Arrow) fails alone, leaving its seqs
   unmarked, so its resend is not mistaken for a duplicate.

Bounded: with ``max_staged_rows`` rows waiting for the store, new batches
are answered ``{"ok": False, "error": "busy"}`` (counted); senders keep them
and retry with backoff.

Gaps: :meth:`Collector.gaps` lists, per sender, holes below its highest
stored seq (true losses) and :meth:`Collector.senders` the pending ranges.
Sinks (Prometheus, InfluxDB, ClickHouse, OTLP) receive each committed flush.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import pyarrow as pa  # type: ignore[import-untyped]

from hivemesh.errors import HivemeshError, StoreError, UntrustedAuthor
from hivemesh.telemetry.columnar import ColumnarBatch, decode_columnar, rebuild_records
from hivemesh.telemetry.fastdecode import decode_rows_fast
from hivemesh.telemetry.flat import batch_of
from hivemesh.telemetry.schema import MAX_BATCH_BYTES, decode_batch, validate_record
from hivemesh.telemetry.seqtrack import SeqTracker
from hivemesh.telemetry.store import MetricsStore

__all__ = ["Collector", "SenderReport", "Sink"]

_T = TypeVar("_T")

_MAX_SENDER_CHARS = 128
#: Rejected records whose reasons an ack lists.
_MAX_ACK_ERRORS = 10


def _warm_up() -> None:
    """Decode one tiny columnar batch, so that what the first real batch would load
    (numpy, the parts of Arrow it touches, which import pandas: ~0.4 s of CPU) is
    loaded when the collector starts, not while the first senders wait."""
    import msgspec

    from hivemesh.telemetry.columnar import encode_columnar

    rec = {"seq": 1, "kind": "counter", "name": "hivemesh.warm_up", "value": 1.0}
    data = encode_columnar([msgspec.msgpack.encode(rec)])
    if data is not None:
        decode_columnar(data, "warm-up", 0)


class Sink(Protocol):
    """Receives every committed flush (must not block: queue and return)."""

    def submit(self, table: pa.Table) -> None:
        """Take one committed Arrow table of rows."""


@dataclass(frozen=True, slots=True)
class SenderReport:
    """What the collector knows about one sender."""

    sender: str
    stored: int
    max_seq: int
    gaps: list[tuple[int, int]]
    pending: tuple[int, int] | None
    backlog: int
    last_seen_ms: int


@dataclass
class _SenderState:
    tracker: SeqTracker
    backlog: int = 0
    last_seen_ms: int = 0


@dataclass
class _Generation:
    """Rows staged for the next flush, and who waits for it."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0
    ids: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


_Snapshot = tuple[_Generation, list[tuple[str, dict[str, Any], int, int]], dict[str, int]]


class Collector:
    """Validates, de-duplicates and stores metric batches; see the module docstring."""

    def __init__(
        self,
        store: MetricsStore,
        *,
        flush_max_rows: int = 10_000,
        flush_interval_s: float = 0.005,
        max_staged_rows: int = 500_000,
        sinks: Sequence[Sink] = (),
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.flush_max_rows = flush_max_rows
        self.flush_interval_s = flush_interval_s
        #: Staged (not yet flushed) rows above which new batches are refused with ``busy``.
        self.max_staged_rows = max_staged_rows
        self.sinks = list(sinks)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.counters: Counter[str] = Counter(store.load_counters())
        self._senders: dict[str, _SenderState] = {}
        self._load_senders()
        self._gen = _Generation()
        self._flush_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hm-collector")
        self._flushing = False
        #: Flushes written and rows they held (for benchmarks and status).
        self.flushes = 0
        self.flushed_rows = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._timer: asyncio.TimerHandle | None = None
        _warm_up()

    def _load_senders(self) -> None:
        self._senders = {
            s: _SenderState(SeqTracker.from_state(state), backlog, seen)
            for s, state, backlog, seen in self.store.load_senders()
        }

    # -- ingest ----------------------------------------------------------------

    async def ingest(self, sender_address: str, payload: Any, trusted: bool) -> dict[str, Any]:
        """Validate and store one batch; return the ack once it is durable."""
        ack, gen = self._stage_safe(sender_address, payload, trusted)
        if gen is None:
            return ack
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gen.waiters.append(fut)
        self._schedule_flush()
        try:
            await fut
        except StoreError as exc:
            return {"ok": False, "error": exc.code, "detail": str(exc)[:200]}
        return ack

    def ingest_now(self, sender_address: str, payload: Any, trusted: bool) -> dict[str, Any]:
        """Synchronous :meth:`ingest` (flushes at once); do not mix with a running loop."""
        ack, gen = self._stage_safe(sender_address, payload, trusted)
        if gen is not None:
            try:
                self._flush_generation(self._swap())
            except Exception as exc:
                self._load_senders()
                err = exc if isinstance(exc, StoreError) else StoreError(f"flush failed: {exc}")
                return {"ok": False, "error": err.code, "detail": str(err)[:200]}
        return ack

    def _stage_safe(
        self, sender: str, payload: Any, trusted: bool
    ) -> tuple[dict[str, Any], _Generation | None]:
        try:
            return self._stage(sender, payload, trusted)
        except Exception as exc:  # a bug of ours: count it, refuse the batch, keep running
            self.counters["internal_error"] += 1
            return {"ok": False, "error": "internal_error", "detail": repr(exc)[:200]}, None

    def _refuse(self, exc: HivemeshError) -> dict[str, Any]:
        self.counters[exc.code] += 1
        self.counters["batches_refused"] += 1
        return {"ok": False, "error": exc.code, "detail": str(exc)[:200]}

    def _stage(
        self, sender: str, payload: Any, trusted: bool
    ) -> tuple[dict[str, Any], _Generation | None]:
        if not trusted:
            return self._refuse(UntrustedAuthor(f"sender {str(sender)[:64]} is not trusted")), None
        if self._gen.rows >= self.max_staged_rows:
            # Backpressure: the store is behind. The sender keeps the batch and retries.
            self.counters["busy"] += 1
            return {"ok": False, "error": "busy", "detail": "collector is flushing a backlog"}, None
        if type(sender) is not str or not 0 < len(sender) <= _MAX_SENDER_CHARS:
            return self._refuse(UntrustedAuthor("bad sender address")), None
        now = self._clock_ms()
        fast: tuple[list[list[Any]], int | None, int | None] | None = None
        valid: list[tuple[Any, ...]] = []
        columns: list[list[Any]] | None = None
        v2: ColumnarBatch | None = None
        raws: list[Any] | None = None
        if isinstance(payload, (bytes, bytearray, memoryview)):
            data = bytes(payload)
            if len(data) <= MAX_BATCH_BYTES and data[:1] != b"{":
                try:
                    v2 = decode_columnar(data, sender, now)
                except HivemeshError as exc:
                    return self._refuse(exc), None
            if v2 is None:
                fast = decode_rows_fast(data, sender, now)
            elif v2.batch is None:  # some record breaks a rule: judge them one by one
                raws = rebuild_records(v2)
        counters = self.counters
        rejected = 0
        rejected_seqs: list[int] = []
        errors: list[dict[str, Any]] = []
        if v2 is not None:
            hi, backlog = v2.hi, v2.backlog
        elif fast is not None:
            columns, hi, backlog = fast
        else:
            try:
                by_hand = not isinstance(payload, (bytes, bytearray, memoryview))
                batch = decode_batch(batch_of(payload) if by_hand else payload)
            except HivemeshError as exc:
                return self._refuse(exc), None
            hi, backlog = batch.hi, batch.backlog
            raws = batch.records
        if raws is not None:
            for i, raw in enumerate(raws):
                try:
                    vrow = validate_record(raw)
                except HivemeshError as exc:
                    counters[exc.code] += 1
                    rejected += 1
                    if len(errors) < _MAX_ACK_ERRORS:
                        errors.append({"index": i, "error": exc.code, "detail": str(exc)[:200]})
                    rseq = raw.get("seq") if type(raw) is dict else None
                    if type(rseq) is int and rseq > 0:
                        rejected_seqs.append(rseq)
                    continue
                ts = vrow[2] if vrow[2] is not None else now
                valid.append((sender, vrow[0], vrow[1], ts, now, *vrow[3:]))
        st = self._senders.get(sender)
        if st is None:
            st = self._senders[sender] = _SenderState(SeqTracker())
        tracker = st.tracker
        gen = self._gen
        top = accepted = dups = 0
        if v2 is not None and v2.batch is not None:
            saved = tracker.to_state()
            try:
                top, accepted, dups = self._stage_columnar(gen, tracker, v2)
            except Exception:  # nothing staged: a resend must not look like a duplicate
                st.tracker = tracker = SeqTracker.from_state(saved)
                raise
        elif columns is not None:
            seqs = columns[1]
            n = len(seqs)
            s0 = seqs[0] if n else None
            if s0 is not None and s0 > tracker.max_seq and seqs == list(range(s0, s0 + n)):
                # The common case, our own sender: new, consecutive seqs. No per-row work.
                # Arrow first: if conversion failed, nothing would be marked stored.
                gen.batches.append(MetricsStore.batch_from_columns(columns))
                gen.rows += n
                tracker.add_range(s0, s0 + n - 1)
                top, accepted = s0 + n - 1, n
            else:
                valid = list(zip(*columns, strict=True))
        if valid or rejected_seqs:
            saved = tracker.to_state()
            try:
                top, accepted, dups = self._stage_rows(gen, tracker, valid, rejected_seqs)
            except Exception:
                # Nothing of this batch is staged: un-mark its seqs so a resend is not
                # mistaken for a duplicate (which would lose it silently).
                st.tracker = tracker = SeqTracker.from_state(saved)
                raise
        if hi is not None:
            tracker.announce(hi)
        tracker.announce(top)
        if backlog is not None:
            st.backlog = backlog
        st.last_seen_ms = now
        gen.dirty.add(sender)
        counters["accepted"] += accepted
        counters["duplicates"] += dups
        counters["rejected"] += rejected
        counters["batches"] += 1
        ack: dict[str, Any] = {
            "ok": True,
            "acked_through": top,
            "accepted": accepted,
            "duplicates": dups,
            "rejected": rejected,
        }
        if errors:
            ack["errors"] = errors
        return ack, gen

    @staticmethod
    def _stage_columnar(
        gen: _Generation, tracker: SeqTracker, cb: ColumnarBatch
    ) -> tuple[int, int, int]:
        """Stage a valid v2 batch; return (top seq, accepted, dups)."""
        assert cb.batch is not None
        n = cb.n
        if n == 0:
            return 0, 0, 0
        if cb.run and cb.first_seq > tracker.max_seq:
            # The common case, our own sender: new, consecutive seqs. No per-row work.
            tracker.add_range(cb.first_seq, cb.first_seq + n - 1)
            gen.batches.append(cb.batch)
            gen.rows += n
            return cb.first_seq + n - 1, n, 0
        seqs = cb.seqs()
        keep = [tracker.add(q) for q in seqs]
        accepted = keep.count(True)
        if accepted:
            rb = cb.batch if accepted == n else cb.batch.filter(pa.array(keep))
            gen.batches.append(rb)
            gen.rows += accepted
        return max(seqs), accepted, n - accepted

    def _stage_rows(
        self,
        gen: _Generation,
        tracker: SeqTracker,
        valid: list[tuple[Any, ...]],
        rejected_seqs: list[int],
    ) -> tuple[int, int, int]:
        """De-duplicate rows one by one and stage them; return (top seq, accepted, dups)."""
        top = 0
        for rs in rejected_seqs:  # accounted for: a rejection is not a gap
            tracker.add(rs)
            top = max(top, rs)
        rows: list[tuple[Any, ...]] = []
        accepted = dups = 0
        no_seq_ids: list[str] = []
        add = tracker.add
        for row in valid:
            seq = row[1]
            if seq is not None:
                if seq > top:
                    top = seq
                if not add(seq):
                    dups += 1
                    continue
            else:
                rid = row[2]
                if rid is None:  # hand-sent, no seq, no id: give it one
                    row = (row[0], None, uuid.uuid4().hex, *row[3:])
                elif rid in gen.ids or rid in no_seq_ids:
                    dups += 1
                    continue
                else:
                    no_seq_ids.append(rid)
            rows.append(row)
            accepted += 1
        if no_seq_ids:
            rows, accepted, dups = self._drop_stored_ids(gen, rows, no_seq_ids, accepted, dups)
        if rows:
            # Arrow conversion happens here, per batch, on the loop thread, so it overlaps
            # with the writer thread's DuckDB insert (which runs without the GIL).
            gen.batches.append(MetricsStore.batch_from_rows(rows))
            gen.rows += len(rows)
        gen.ids.update(no_seq_ids)
        return top, accepted, dups

    def _drop_stored_ids(
        self,
        gen: _Generation,
        rows: list[tuple[Any, ...]],
        ids: list[str],
        accepted: int,
        dups: int,
    ) -> tuple[list[tuple[Any, ...]], int, int]:
        """Remove rows whose (seq-less) id is already in the store."""
        with self._flush_lock:  # one DuckDB connection: never used by two threads at once
            stored = self.store.existing_ids(ids)
        if not stored:
            return rows, accepted, dups
        kept = [r for r in rows if r[1] is not None or r[2] not in stored]
        removed = len(rows) - len(kept)
        ids[:] = [i for i in ids if i not in stored]
        return kept, accepted - removed, dups + removed

    # -- flushing --------------------------------------------------------------

    def _swap(self) -> _Snapshot:
        gen = self._gen
        self._gen = _Generation()
        senders = [
            (s, self._senders[s].tracker.to_state(), self._senders[s].backlog,
             self._senders[s].last_seen_ms)
            for s in sorted(gen.dirty)
        ]  # fmt: skip
        return gen, senders, dict(self.counters)

    def _flush_generation(self, snap: _Snapshot) -> None:
        """Write one snapshot (runs in the collector's single writer thread)."""
        gen, senders, counters = snap
        table = None
        if gen.rows:
            table = MetricsStore.table_from_batches(gen.batches)
        with self._flush_lock:
            self.store.write(table, senders, counters)
            self.flushes += 1
            self.flushed_rows += gen.rows
        if table is not None and self.sinks:
            table = MetricsStore.plain(table)  # sinks take plain string columns
            for sink in self.sinks:
                sink.submit(table)

    def _schedule_flush(self) -> None:
        self._idle.clear()
        if self._flushing:
            return  # when the running flush ends, everything staged meanwhile goes next
        if self._gen.rows >= self.flush_max_rows:
            self._start_flush()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.flush_interval_s, self._start_flush)

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing:
            return
        if not self._gen.waiters:
            self._idle.set()
            return
        snap = self._swap()
        self._flushing = True
        fut = asyncio.get_running_loop().run_in_executor(
            self._executor, self._flush_generation, snap
        )
        fut.add_done_callback(partial(self._flush_done, snap[0].waiters))

    def _flush_done(self, waiters: list[asyncio.Future[None]], fut: asyncio.Future[None]) -> None:
        self._flushing = False
        exc = fut.exception() if not fut.cancelled() else StoreError("flush cancelled")
        if exc is not None:
            if not isinstance(exc, StoreError):
                exc = StoreError(f"flush failed: {type(exc).__name__}: {exc}")
            # The trackers ran ahead of the store: drop what is staged too, reload what is
            # durable, and let every sender resend.
            staged = self._gen
            self._gen = _Generation()
            waiters = waiters + staged.waiters
            self._load_senders()
        for w in waiters:
            if not w.done():
                if exc is None:
                    w.set_result(None)
                else:
                    w.set_exception(exc)
        self._start_flush()  # group commit: whatever was staged meanwhile goes now

    async def drain(self) -> None:
        """Wait until every staged batch is flushed."""
        if self._gen.waiters and not self._flushing:
            self._start_flush()
        await self._idle.wait()

    async def call_store(self, fn: Callable[[MetricsStore], _T]) -> _T:
        """Run ``fn(store)`` on the collector's writer thread (DuckDB is single-writer)."""

        def run() -> _T:
            with self._flush_lock:
                return fn(self.store)

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    def close(self) -> None:
        """Stop the writer thread (after :meth:`drain`)."""
        self._executor.shutdown(wait=True)

    # -- reports ---------------------------------------------------------------

    def senders(self) -> list[SenderReport]:
        """Per-sender stored count, gaps (true losses), pending range and backlog."""
        out = []
        for s in sorted(self._senders):
            st = self._senders[s]
            t = st.tracker
            out.append(
                SenderReport(
                    sender=s,
                    stored=t.stored_count(),
                    max_seq=t.max_seq,
                    gaps=t.gaps(),
                    pending=t.pending(),
                    backlog=st.backlog,
                    last_seen_ms=st.last_seen_ms,
                )
            )
        return out

    def gaps(self) -> dict[str, list[tuple[int, int]]]:
        """``sender -> missing ranges`` for every sender with a true loss."""
        return {r.sender: r.gaps for r in self.senders() if r.gaps}

    def statistics(self) -> dict[str, int]:
        """A copy of the counters (accepted, duplicates, rejected, and per error code)."""
        return dict(sorted(self.counters.items()))
