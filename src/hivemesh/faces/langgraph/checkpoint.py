"""A LangGraph checkpointer whose threads live in the swarm's journal and cannot fork.

Theory of operation
-------------------
:class:`MeshCheckpointSaver` stores checkpoints, pending writes and thread
deletions as events of its node's feed (:mod:`hivemesh.faces.langgraph.chain`
folds them into each thread's checkpoint tree on every replica). A graph's
state is then on every node of the swarm, and a graph can resume on another
machine from the last checkpoint after its host crashed.

**The rule that keeps a thread's chain from forking.** Two processes
writing the same thread must not both succeed from the same head. Every
write (``put``, ``put_writes``, ``delete_thread``) goes through four steps:

1. *Lease.* The writer holds the thread's lease on the swarm's quorum
   (``lg/<sha256(thread)>``, :mod:`hivemesh.core.lease_quorum`): exclusive
   while unexpired, with a fencing token strictly greater than any earlier
   grant. If another writer holds it, the write fails with
   :class:`~hivemesh.faces.langgraph.errors.CheckpointConflict` (after
   waiting ``lease_wait_s`` for it to be released or expire).
2. *Catch up, then check the head.* When the lease was newly granted, a
   majority barrier (``sync.majority`` with ``pull``,
   :mod:`hivemesh.core.barrier`): this node now holds every event a
   majority of the voters held. Then (on every ``put``), if the thread's
   head (per ``ns``) was written by another writer and is not the parent of
   this checkpoint, the write is stale: ``CheckpointConflict``.
3. *Append* the event, carrying the fencing token.
4. *Confirm*: wait until a majority of the voters hold it (``sync.majority``
   with ``own_seq``), then renew the lease on the quorum -- the fencing
   token is checked where the decision is made. Only then does the write
   return. A failed renewal is ``CheckpointConflict``: a newer writer took
   the thread.

Why no two successful writers fork: a successful write was held by a
majority before its lease was confirmed live, so before any newer grant; the
newer writer's barrier (a majority read after its grant) intersects that
majority, so it sees the write before it writes anything, and step 2 makes
it extend the head or fail. A paused old writer that appends after the
newer grant fails its step 4; its event ranks below anything of the newer
token (the view orders checkpoints by ``(fencing token, checkpoint id)`` on
every replica), and if the newer writer sees it before writing, step 2
makes it extend it: either way the chain stays one line. The rule needs
only the quorum (a majority of lease voters up) and the journal; no clock
agreement.

Reads: ``get_tuple`` without a ``checkpoint_id`` (the head, as a graph asks
at the start of a run) runs the catch-up barrier first unless this saver
holds the thread's lease; ``list`` and reads by id answer from the local
replica.

Limits: at most one writer per thread at a time (by design); writes pay a
quorum round trip and a replication wait (milliseconds on a LAN); a write
that failed in step 4 has an unknown outcome, like a timeout: it may still
be in the tree (visible to ``list`` and by id), below anything the newer
writer writes, or be the state the newer writer continues from if it saw
it -- never a second branch that both writers were told succeeded; a
majority of the lease voters must be up to write (and to read the head
without holding the thread); the extended capabilities (``copy_thread``,
``prune``, ``delete_for_runs``) are not claimed.

Sync methods (``put``, ``get_tuple``, ...) run the async ones on the node's
event loop from another thread (as LangGraph's sync ``invoke`` does); from
inside that loop, use the async methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from hivemesh.commands import LeaseAcquire, LeaseRelease, LeaseRenew, LeaseShow, SyncMajority
from hivemesh.commands.coordination import LeaseShowReply
from hivemesh.core.codec import pack
from hivemesh.errors import DeadlineExceeded, HivemeshError, InputTooLarge, LocalProtocolError
from hivemesh.faces.langgraph._bridge import node_loop, run_on_loop
from hivemesh.faces.langgraph._views import shared_view
from hivemesh.faces.langgraph.chain import (
    KIND_CHECKPOINT,
    KIND_DELETE,
    KIND_PART,
    KIND_WRITES,
    MAX_PAYLOAD_BYTES,
    PART_BYTES,
    ChainView,
    Record,
)
from hivemesh.faces.langgraph.errors import CheckpointConflict
from hivemesh.leases import DRIFT_MS, DRIFT_RATIO
from hivemesh.leases.errors import LeaseContended
from hivemesh.node import Node

__all__ = ["MeshCheckpointSaver"]

T = TypeVar("T")
_CACHE = 256  # decoded payloads kept (LRU)
_RACE_S = 1.0  # how long to retry an acquire that lost a race with no holder


@dataclass(slots=True)
class _Held:
    token: int
    expires: float  # time.monotonic() until which we believe the lease is ours


def lease_resource(thread_id: str) -> str:
    """The quorum resource of a thread's lease."""
    return "lg/" + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def _conf(config: RunnableConfig) -> tuple[str, str, str | None]:
    c = config.get("configurable") or {}
    thread = c.get("thread_id")
    if not isinstance(thread, str) or not thread:
        raise LocalProtocolError("config['configurable']['thread_id'] must be a non-empty str")
    ns = c.get("checkpoint_ns", "") or ""
    return thread, str(ns), get_checkpoint_id(config)


class MeshCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpointer over a running :class:`hivemesh.Node` (see module docs).

    Create it inside the node's event loop::

        async with hivemesh.Node("./agent-a", bootstrap=[...]) as node:
            saver = MeshCheckpointSaver(node)
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})
            await saver.aclose()   # releases the threads' leases

    ``lease_ttl_ms``: how long a silent writer keeps a thread (a crashed
    writer's thread is free after it); ``lease_wait_s``: how long a write
    waits for another writer's lease before :class:`CheckpointConflict`
    (0: fail at once); ``sync_timeout_s``: deadline of each majority barrier.
    """

    def __init__(
        self,
        node: Node,
        *,
        lease_ttl_ms: int = 10_000,
        lease_wait_s: float = 0.0,
        sync_timeout_s: float = 5.0,
        serde: Any = None,
    ) -> None:
        super().__init__(serde=serde)
        self.node = node
        self.view = shared_view(node, ChainView)  # one per node, whatever the savers
        #: this saver's writer id (one per saver instance)
        self.holder = f"{node.address}/{secrets.token_hex(6)}"
        self.lease_ttl_ms = lease_ttl_ms
        self.lease_wait_s = lease_wait_s
        self.sync_timeout_s = sync_timeout_s
        self._loop = node_loop("MeshCheckpointSaver")
        self._held: dict[str, _Held] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._cache: OrderedDict[tuple[bytes, int], dict[str, Any]] = OrderedDict()
        #: conflicts raised, by cause
        self.conflicts: dict[str, int] = {}

    # -- the lease and the barriers ------------------------------------------------

    def _conflict(self, cause: str, message: str) -> CheckpointConflict:
        self.conflicts[cause] = self.conflicts.get(cause, 0) + 1
        return CheckpointConflict(message)

    async def _acquire(self, thread: str) -> _Held:
        """Take the thread's lease. Held by another writer: wait up to
        ``lease_wait_s``, then :class:`CheckpointConflict`. Lost a race with
        nobody holding it (two acquirers at once can both fail): retry with
        jitter for up to a second more."""
        resource = lease_resource(thread)
        start = time.monotonic()
        backoff = 0.02
        while True:
            invoked = time.monotonic()
            token: int | None = None
            try:
                reply = await self.node.call(
                    LeaseAcquire(resource=resource, holder=self.holder, ttl_ms=self.lease_ttl_ms)
                )
                token = reply.token  # type: ignore[attr-defined]
            except LeaseContended:
                token = None
            if token is not None:
                return _Held(token, self._expiry(invoked))
            shown = await self.node.call(LeaseShow(resource=resource))
            who = shown.holder if isinstance(shown, LeaseShowReply) and shown.held else None
            waited = time.monotonic() - start
            if waited >= self.lease_wait_s and (who is not None or waited >= _RACE_S):
                raise self._conflict(
                    "held",
                    f"thread {thread!r} is being written by another writer ({who or 'unknown'}); "
                    "a second writer would fork its checkpoint chain",
                )
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 0.25)

    def _expiry(self, invoked: float) -> float:
        return invoked + (self.lease_ttl_ms * (1.0 - DRIFT_RATIO) - DRIFT_MS) / 1000.0

    async def _fence(self, thread: str) -> tuple[int, bool]:
        """The token to write ``thread`` under, and whether it was newly granted
        (then this node has caught up with a majority)."""
        held = self._held.get(thread)
        if held is not None and held.expires - time.monotonic() > 0.05:
            return held.token, False
        self._held.pop(thread, None)
        held = await self._acquire(thread)
        await self.node.call(SyncMajority(pull=True, timeout_s=self.sync_timeout_s))
        self._held[thread] = held
        return held.token, True

    async def _confirm(self, thread: str, token: int, seq: int) -> None:
        """A majority holds our event, then the quorum confirms our lease."""
        try:
            await self.node.call(SyncMajority(own_seq=seq, timeout_s=self.sync_timeout_s))
            invoked = time.monotonic()
            reply = await self.node.call(
                LeaseRenew(
                    resource=lease_resource(thread),
                    holder=self.holder,
                    token=token,
                    ttl_ms=self.lease_ttl_ms,
                )
            )
        except HivemeshError:
            self._held.pop(thread, None)
            raise
        if not reply.ok:  # type: ignore[attr-defined]
            self._held.pop(thread, None)
            raise self._conflict(
                "lease_lost",
                f"the lease on thread {thread!r} (token {token}) was lost before the write "
                "was confirmed: a newer writer has the thread",
            )
        self._held[thread] = _Held(token, self._expiry(invoked))

    def _check_head(self, thread: str, ns: str, parent: str | None) -> None:
        """Refuse a checkpoint that does not extend a head another writer wrote
        (step 2 of the module docs; this node has caught up with a majority)."""
        head = self.view.latest(thread, ns)
        if head is not None and head.holder != self.holder and head.checkpoint_id != parent:
            raise self._conflict(
                "stale",
                f"thread {thread!r} moved on: its head {head.checkpoint_id} was written by "
                f"another writer, and this checkpoint extends {parent or 'nothing'}",
            )

    def _lock(self, thread: str) -> asyncio.Lock:
        return self._locks.setdefault(thread, asyncio.Lock())

    async def _append(self, kind: str, index: dict[str, Any], payload: dict[str, Any]) -> int:
        """Append ``index`` with ``payload`` inline or in parts; returns the event's seq."""
        data = pack(payload)
        if len(data) > MAX_PAYLOAD_BYTES:
            raise InputTooLarge(f"checkpoint payload of {len(data)} bytes > {MAX_PAYLOAD_BYTES}")
        if len(data) <= PART_BYTES:
            return (await self.node.append(kind, {**index, "x": data})).seq
        seqs = []
        for i in range(0, len(data), PART_BYTES):
            seqs.append((await self.node.append(KIND_PART, {"x": data[i : i + PART_BYTES]})).seq)
        return (await self.node.append(kind, {**index, "parts": seqs})).seq

    async def arelease(self, thread_id: str) -> None:
        """Let go of ``thread_id`` (another writer may take it at once)."""
        held = self._held.pop(thread_id, None)
        if held is not None:
            await self.node.call(
                LeaseRelease(
                    resource=lease_resource(thread_id), holder=self.holder, token=held.token
                )
            )

    async def aclose(self) -> None:
        """Release every thread this saver holds (best effort: a lease that is
        already gone is not an error)."""
        for thread in sorted(self._held):
            with contextlib.suppress(HivemeshError):  # expired or taken: nothing to release
                await self.arelease(thread)

    # -- reading -------------------------------------------------------------------

    def _payload(self, rec: Record) -> dict[str, Any]:
        key = (rec.author, rec.seq)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        out = self.view.payload(rec)
        if out is None:
            raise DeadlineExceeded(f"parts of checkpoint {rec.checkpoint_id} not yet replicated")
        self._cache[key] = out
        if len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return out

    def _channel_values(self, rec: Record, versions: ChannelVersions) -> dict[str, Any]:
        wanted = {(ch, str(v)): ch for ch, v in versions.items()}
        values: dict[str, Any] = {}
        candidates = [rec] + [r for r in self.view.checkpoints(rec.thread, rec.ns) if r is not rec]
        for r in candidates:
            if not wanted:
                break
            have = {(b[0], b[1]) for b in r.body.get("bv", []) if isinstance(b, list)}
            if not have & wanted.keys():
                continue
            for ch, ver, typ, data in self._payload(r)["b"]:
                if (ch, ver) in wanted:
                    del wanted[(ch, ver)]
                    if typ != "empty":
                        values[ch] = self.serde.loads_typed((typ, data))
        return values

    def _tuple(self, rec: Record) -> CheckpointTuple:
        p = self._payload(rec)
        checkpoint: Checkpoint = self.serde.loads_typed(tuple(p["c"]))
        checkpoint["channel_values"] = self._channel_values(rec, checkpoint["channel_versions"])
        metadata: CheckpointMetadata = self.serde.loads_typed(tuple(p["m"]))
        kept: dict[tuple[str, int], tuple[str, str, str, Any]] = {}
        for w in self.view.writes(rec):
            for task, idx, ch, typ, data, path in self._payload(w)["w"]:
                if idx >= 0 and (task, idx) in kept:
                    continue  # a regular write is kept once; special ones are replaced
                kept[(task, idx)] = (path, task, ch, self.serde.loads_typed((typ, data)))
        order = sorted(kept, key=lambda k: (kept[k][0], k[0], k[1]))
        conf = {"thread_id": rec.thread, "checkpoint_ns": rec.ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": rec.checkpoint_id}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=(
                {"configurable": {**conf, "checkpoint_id": rec.parent_id}}
                if rec.parent_id
                else None
            ),
            pending_writes=[(kept[k][1], kept[k][2], kept[k][3]) for k in order],
        )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's head (see module docs)."""
        thread, ns, cid = _conf(config)
        if cid is not None:
            rec = self.view.get(thread, ns, cid)
        else:
            held = self._held.get(thread)
            if held is None or held.expires <= time.monotonic():
                await self.node.call(SyncMajority(pull=True, timeout_s=self.sync_timeout_s))
            rec = self.view.latest(thread, ns)
        return None if rec is None else self._tuple(rec)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, from the local replica (see module docs)."""
        for tup in self._list(config, filter=filter, before=before, limit=limit):
            yield tup

    def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        if config is not None:
            thread, _ns, cid = _conf(config)
            threads = [thread]
            c = config.get("configurable") or {}
            ns: str | None = str(c["checkpoint_ns"]) if "checkpoint_ns" in c else None
        else:
            threads, ns, cid = list(self.view.threads()), None, None
        cut: tuple[int, str] | None = None
        if before is not None:
            bt, bns, bid = _conf(before)
            brec = self.view.get(bt, bns, bid) if bid else None
            if brec is not None:
                cut = (brec.token, brec.checkpoint_id)
        n = 0
        for thread in threads:
            for rec in self.view.checkpoints(thread, ns):
                if cid is not None and rec.checkpoint_id != cid:
                    continue
                if cut is not None and (rec.token, rec.checkpoint_id) >= cut:
                    continue
                if filter:
                    md = self.serde.loads_typed(tuple(self._payload(rec)["m"]))
                    if any(md.get(k) != v for k, v in filter.items()):
                        continue
                if limit is not None and n >= limit:
                    return
                n += 1
                yield self._tuple(rec)

    # -- writing -------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint (see module docs)."""
        thread, ns, parent = _conf(config)
        async with self._lock(thread):
            token, _fresh = await self._fence(thread)
            self._check_head(thread, ns, parent)
            c: dict[str, Any] = dict(checkpoint)
            values: dict[str, Any] = c.pop("channel_values", None) or {}
            blobs = []
            for ch, ver in sorted(new_versions.items(), key=lambda kv: str(kv[0])):
                typ, data = self.serde.dumps_typed(values[ch]) if ch in values else ("empty", b"")
                blobs.append([ch, str(ver), typ, data])
            payload = {
                "c": list(self.serde.dumps_typed(c)),
                "m": list(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
                "b": blobs,
            }
            index = {
                "t": thread,
                "ns": ns,
                "id": checkpoint["id"],
                "p": parent,
                "k": token,
                "h": self.holder,
                "bv": [[b[0], b[1]] for b in blobs],
            }
            seq = await self._append(KIND_CHECKPOINT, index, payload)
            await self._confirm(thread, token, seq)
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store pending writes of ``task_id`` for ``config``'s checkpoint."""
        thread, ns, cid = _conf(config)
        if cid is None:
            raise LocalProtocolError("put_writes needs config['configurable']['checkpoint_id']")
        rows = []
        for i, (ch, value) in enumerate(writes):
            typ, data = self.serde.dumps_typed(value)
            rows.append([task_id, WRITES_IDX_MAP.get(ch, i), ch, typ, data, task_path])
        async with self._lock(thread):
            token, _fresh = await self._fence(thread)
            index = {"t": thread, "ns": ns, "id": cid, "p": None, "k": token, "h": self.holder}
            seq = await self._append(KIND_WRITES, index, {"w": rows})
            await self._confirm(thread, token, seq)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id`` (on every replica)."""
        async with self._lock(thread_id):
            token, _fresh = await self._fence(thread_id)
            ev = await self.node.append(KIND_DELETE, {"t": thread_id, "k": token})
            await self._confirm(thread_id, token, ev.seq)

    # -- the sync face (from other threads) ------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on_loop(self._loop, coro, self.sync_timeout_s * 3 + self.lease_wait_s + 10)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync :meth:`aget_tuple` (from a thread other than the node's loop)."""
        return self._run(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync :meth:`alist` (from a thread other than the node's loop)."""

        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        return iter(self._run(collect()))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync :meth:`aput` (from a thread other than the node's loop)."""
        return self._run(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync :meth:`aput_writes` (from a thread other than the node's loop)."""
        self._run(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Sync :meth:`adelete_thread` (from a thread other than the node's loop)."""
        self._run(self.adelete_thread(thread_id))
