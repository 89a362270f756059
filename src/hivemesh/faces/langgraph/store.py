"""A LangGraph ``BaseStore`` (long-term memory) replicated through the swarm's journal.

Theory of operation
-------------------
Every ``put`` or ``delete`` is one ``lg.item`` event ``{n: namespace, k:
key, v: value | None}`` in the writing node's feed; :class:`ItemsView`
folds them on every replica into a last-writer-wins map per ``(namespace,
key)``, ordered by ``(hlc, author, seq)`` -- the order every replica
computes alike, whatever the arrival order. ``created_at`` is the time of
the first put after the item's last delete, ``updated_at`` the winner's
(both from the events' hybrid clocks).

A write returns once a majority of the swarm's lease voters hold it
(``sync.majority``; ``confirm=False`` skips that wait), so it survives the
writer's crash. Reads answer from the local replica.

Supported: ``get``, ``put`` (value: a dict of msgpack-able data, at most
:data:`MAX_ITEM_BYTES` encoded), ``delete``, ``search`` by namespace prefix
with ``filter`` (exact values and ``$eq``, ``$ne``, ``$gt``, ``$gte``,
``$lt``, ``$lte``), ``limit`` and ``offset`` (newest update first), and
``list_namespaces`` with prefix/suffix conditions (``*`` wildcards) and
``max_depth``. Not claimed: TTLs (``supports_ttl`` is False, a ``ttl`` is
refused by LangGraph) and semantic search (a ``query`` is ignored; items
come back with ``score=None``). Two concurrent writers of one item both
succeed and the later one by that order wins -- use the checkpointer for
state that must not fork.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from hivemesh.commands import SyncMajority
from hivemesh.core.codec import MAX_BODY_BYTES, pack
from hivemesh.core.event import Event
from hivemesh.core.hlc import hlc_ms
from hivemesh.errors import InputTooLarge, InvalidArgument
from hivemesh.faces.langgraph._bridge import node_loop, run_on_loop
from hivemesh.faces.langgraph._views import shared_view
from hivemesh.node import Node

__all__ = ["KIND_ITEM", "MAX_ITEM_BYTES", "ItemsView", "MeshStore"]

T = TypeVar("T")
KIND_ITEM = "lg.item"
#: Largest encoded item event (namespace, key and value).
MAX_ITEM_BYTES = MAX_BODY_BYTES - 1024

Order = tuple[int, bytes, int]


@dataclass(frozen=True, slots=True)
class _Write:
    order: Order  # (hlc, author, seq)
    value: dict[str, Any] | None


class ItemsView:
    """Last-writer-wins items by ``(namespace, key)`` (see module docs)."""

    kinds = frozenset({KIND_ITEM})

    def __init__(self) -> None:
        self._items: dict[tuple[tuple[str, ...], str], list[_Write]] = {}
        #: ``lg.item`` events that failed validation, ignored
        self.rejected = 0

    def apply(self, ev: Event) -> None:
        """Fold one event."""
        b = ev.body
        ok = (
            isinstance(b, dict)
            and isinstance(b.get("n"), list)
            and all(isinstance(p, str) for p in b["n"])
            and isinstance(b.get("k"), str)
            and (b.get("v") is None or isinstance(b.get("v"), dict))
        )
        if not ok:
            self.rejected += 1
            return
        writes = self._items.setdefault((tuple(b["n"]), b["k"]), [])
        writes.append(_Write((ev.hlc, ev.author, ev.seq), b.get("v")))
        writes.sort(key=lambda w: w.order)

    def item(self, namespace: tuple[str, ...], key: str) -> Item | None:
        """The item's winning value with its times, or None if deleted/absent."""
        writes = self._items.get((namespace, key))
        if not writes or writes[-1].value is None:
            return None
        created = writes[-1]
        for w in reversed(writes):
            if w.value is None:
                break
            created = w
        return Item(
            value=dict(writes[-1].value),
            key=key,
            namespace=namespace,
            created_at=_time(created.order[0]),
            updated_at=_time(writes[-1].order[0]),
        )

    def entries(self) -> list[tuple[tuple[str, ...], str]]:
        """Every ``(namespace, key)`` ever written, sorted."""
        return sorted(self._items)


def _time(hlc: int) -> datetime:
    return datetime.fromtimestamp(hlc_ms(hlc) / 1000, tz=UTC)


_OPS = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _matches_filter(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    for field, want in (flt or {}).items():
        have = value.get(field)
        if isinstance(want, dict) and want and all(k in _OPS for k in want):
            try:
                if not all(_OPS[op](have, arg) for op, arg in want.items()):
                    return False
            except TypeError:  # incomparable types never match
                return False
        elif have != want:
            return False
    return True


def _matches_ns(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(path) > len(ns):
        return False
    part = ns[: len(path)] if cond.match_type == "prefix" else ns[len(ns) - len(path) :]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


class MeshStore(BaseStore):
    """LangGraph store over a running :class:`hivemesh.Node` (see module docs).

    Create it inside the node's event loop; sync methods work from other
    threads (as LangGraph's sync ``invoke`` calls them).
    """

    supports_ttl = False

    def __init__(self, node: Node, *, confirm: bool = True, sync_timeout_s: float = 5.0) -> None:
        self.node = node
        self.view = shared_view(node, ItemsView)
        self.confirm = confirm
        self.sync_timeout_s = sync_timeout_s
        self._loop = node_loop("MeshStore")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order (a get sees an earlier put of the same batch)."""
        results: list[Result] = []
        last_seq: int | None = None
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self.view.item(tuple(op.namespace), op.key))
            elif isinstance(op, PutOp):
                last_seq = await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._namespaces(op))
            else:
                raise InvalidArgument(f"unknown store op {type(op).__name__}")
        if last_seq is not None and self.confirm:
            await self.node.call(SyncMajority(own_seq=last_seq, timeout_s=self.sync_timeout_s))
        return results

    async def _put(self, op: PutOp) -> int:
        if op.ttl is not None:
            raise InvalidArgument("MeshStore does not support TTLs")
        if not op.namespace or any(not isinstance(p, str) or not p for p in op.namespace):
            raise InvalidArgument(f"bad namespace {op.namespace!r}")
        body = {
            "n": list(op.namespace),
            "k": op.key,
            "v": None if op.value is None else dict(op.value),
        }
        try:
            size = len(pack(body))
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"store values must be msgpack-able data: {e}") from e
        if size > MAX_ITEM_BYTES:
            raise InputTooLarge(f"store item of {size} bytes > {MAX_ITEM_BYTES}")
        return (await self.node.append(KIND_ITEM, body)).seq

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found = []
        for ns, key in self.view.entries():
            if ns[: len(prefix)] != prefix:
                continue
            item = self.view.item(ns, key)
            if item is not None and _matches_filter(item.value, op.filter):
                found.append(item)
        found.sort(key=lambda i: (i.updated_at, i.namespace, i.key), reverse=True)
        return [
            SearchItem(
                namespace=i.namespace,
                key=i.key,
                value=i.value,
                created_at=i.created_at,
                updated_at=i.updated_at,
                score=None,
            )
            for i in found[op.offset : op.offset + op.limit]
        ]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        seen: set[tuple[str, ...]] = set()
        for ns, key in self.view.entries():
            if self.view.item(ns, key) is None:
                continue
            if op.match_conditions and not all(_matches_ns(c, ns) for c in op.match_conditions):
                continue
            seen.add(ns[: op.max_depth] if op.max_depth is not None else ns)
        return sorted(seen)[op.offset : op.offset + op.limit]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Sync :meth:`abatch` (from a thread other than the node's loop)."""
        return self._run(self.abatch(list(ops)))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on_loop(self._loop, coro, self.sync_timeout_s + 10)
