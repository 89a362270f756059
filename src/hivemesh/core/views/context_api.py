"""The typed API over one loro context document: ``ctx["k"] = v``,
``ctx.list(name)``, ``ctx.counter(name)``, ``ctx.text(name)``,
``ctx.gset(name)``, ``ctx.orset(name)``.

Writes need a :class:`~hivemesh.core.views.context.ContextView` built with the
local author; they land in the local loro doc and reach the journal through
``ContextView.pending_update``. Every read first materialises the doc's state
(imports are applied to a detached doc lazily; see ``ContextView``). Values are
JSON-like (plus bytes), at most :data:`MAX_VALUE_BYTES` each.

Sets
----
Two set types hold strings (at most :data:`MAX_ELEMENT_BYTES` of UTF-8 each),
each kept in a loro map root named ``gset:<name>`` or ``orset:<name>`` (user
root names cannot contain ``:``, so these never collide with other roots):

* :class:`GSetHandle`, a **grow-only set**: one map entry per element
  (``element -> True``). Concurrent adds of one element write the same value,
  so the map's last-writer-wins rule never matters. There is no removal.
* :class:`ORSetHandle`, an **add-wins observed-remove set**. Every add writes a
  fresh entry ``tag -> element`` whose *tag* is the loro id of that very
  operation (``"<peer hex>.<counter hex>"``), unique swarm-wide because each
  author writes under its own peer id and never reuses a counter. An element
  is a member while at least one of its entries is present. A remove deletes
  the entries of that element that its writer has *observed*, and only those;
  an add made concurrently (not yet seen by the remover) wrote a tag the
  remover never saw, so it survives: **an add concurrent with a remove of the
  same element wins**. An add also deletes the element's observed entries (its
  fresh entry supersedes them), so an element carries at most one entry per
  concurrent adder, not one per add ever made.

Both merge as loro maps do (commutative, associative, idempotent), so their
value depends only on the set of accepted updates. Entries of an unexpected
shape (another author writing the root by hand) are ignored by every replica
alike. As for every context type, the guarantees are those of writes made
through this API: a trusted author can still write anything into its own feed,
including a deletion in a grow-only set's map.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loro import LoroDoc

from hivemesh.core.codec import pack
from hivemesh.errors import InvalidArgument, InvalidEncoding

if TYPE_CHECKING:
    from hivemesh.core.views.context import ContextView

__all__ = [
    "CONTEXT_PATTERN",
    "GSET_PREFIX",
    "MAX_ELEMENT_BYTES",
    "MAX_VALUE_BYTES",
    "ORSET_PREFIX",
    "Context",
    "CounterHandle",
    "GSetHandle",
    "ListHandle",
    "ORSetHandle",
    "TextHandle",
    "gset_members",
    "orset_members",
]

#: Context names and root container names.
CONTEXT_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
#: Largest single value accepted by a local write (msgpack-encoded size).
MAX_VALUE_BYTES = 64 * 1024
#: Largest set element (UTF-8 bytes).
MAX_ELEMENT_BYTES = 4096
#: Root-name prefixes of the set types (``gset:<name>``, ``orset:<name>``).
GSET_PREFIX, ORSET_PREFIX = "gset:", "orset:"

_KV_ROOT = "kv"
_MAX_DEPTH = 32
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


def _check_text(s: str, what: str) -> str:
    """``s``, if it is valid Unicode text (no lone surrogates, which no
    replica could decode): else :class:`InvalidEncoding` naming ``what``."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidEncoding(f"{what} is not valid UTF-8 text: {exc.reason}") from None
    return s


def _check_value(value: Any, depth: int = 0) -> None:
    """Raise :class:`InvalidArgument` unless ``value`` is JSON-like (plus bytes)."""
    if depth > _MAX_DEPTH:
        raise InvalidArgument("value nested too deeply")
    if isinstance(value, str):
        _check_text(value, "a string value")
        return
    if value is None or isinstance(value, (bool, bytes)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidArgument("integers must fit in int64")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument("floats must be finite")
    elif isinstance(value, list):
        for v in value:
            _check_value(v, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidArgument("dict keys must be strings")
            _check_text(k, "a dict key")
            _check_value(v, depth + 1)
    else:
        raise InvalidArgument(f"unsupported value type {type(value).__name__}")


def _checked(value: Any) -> Any:
    _check_value(value)
    if len(pack(value)) > MAX_VALUE_BYTES:
        raise InvalidArgument(f"value over {MAX_VALUE_BYTES} bytes: store it as a blob")
    return value


def _check_root(name: str) -> str:
    if not isinstance(name, str) or not CONTEXT_PATTERN.match(name):
        raise InvalidArgument(f"bad name {name!r:.80}: must match {CONTEXT_PATTERN.pattern}")
    return name


def _plain(v: Any) -> Any:
    """A loro ``ValueOrContainer`` (or ``None``) as plain Python data."""
    if v is None:
        return None
    if v.is_value:
        return v.value
    return v.container.get_deep_value()


def _deep(container: Any) -> Any:
    """``container.get_deep_value()`` as plain (untyped) Python data."""
    return container.get_deep_value()


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else x


class ListHandle:
    """An append-friendly list (chat history, tool outputs)."""

    __slots__ = ("_ctx", "_list")

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self._list = ctx._doc.get_list(name)

    def append(self, value: Any) -> None:
        """Append ``value`` at the end."""
        self._ctx._live()
        self._ctx._writable()
        self._list.push(_checked(value))

    def insert(self, index: int, value: Any) -> None:
        """Insert ``value`` before position ``index``."""
        self._ctx._live()
        self._ctx._writable()
        if not 0 <= index <= len(self):
            raise InvalidArgument(f"index {index} out of range")
        self._list.insert(index, _checked(value))

    def delete(self, index: int, count: int = 1) -> None:
        """Delete ``count`` items starting at ``index``."""
        self._ctx._live()
        self._ctx._writable()
        if not (index >= 0 and count >= 0 and index + count <= len(self)):
            raise InvalidArgument(f"range {index}+{count} out of bounds")
        self._list.delete(index, count)

    def __len__(self) -> int:
        self._ctx._live()
        return len(self._list)

    def __getitem__(self, index: int) -> Any:
        self._ctx._live()
        return self.to_list()[index]

    def __iter__(self) -> Iterator[Any]:
        self._ctx._live()
        return iter(self.to_list())

    def to_list(self) -> list[Any]:
        """The items as a plain list."""
        self._ctx._live()
        return list(_deep(self._list))


class CounterHandle:
    """A counter: concurrent additions all count (never LWW)."""

    __slots__ = ("_counter", "_ctx")

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self._counter = ctx._doc.get_counter(name)

    def add(self, n: int | float = 1) -> None:
        """Add ``n`` (may be negative)."""
        self._ctx._live()
        self._ctx._writable()
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
            raise InvalidArgument("counter increments must be finite numbers")
        self._counter.increment(n)

    @property
    def value(self) -> int | float:
        """The sum of all additions (an int when integral)."""
        self._ctx._live()
        return _number(self._counter.value)


class TextHandle:
    """Collaborative plain text (character positions are Unicode code points)."""

    __slots__ = ("_ctx", "_text")

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self._text = ctx._doc.get_text(name)

    def insert(self, pos: int, s: str) -> None:
        """Insert ``s`` at code point ``pos``."""
        self._ctx._live()
        self._ctx._writable()
        if not isinstance(s, str) or not 0 <= pos <= len(self):
            raise InvalidArgument("bad text insert")
        _checked(s)
        self._text.insert(pos, s)

    def append(self, s: str) -> None:
        """Append ``s``."""
        self.insert(len(self), s)

    def delete(self, pos: int, count: int) -> None:
        """Delete ``count`` code points at ``pos``."""
        self._ctx._live()
        self._ctx._writable()
        if not (pos >= 0 and count >= 0 and pos + count <= len(self)):
            raise InvalidArgument("bad text range")
        self._text.delete(pos, count)

    def __len__(self) -> int:
        self._ctx._live()
        return int(self._text.len_unicode)

    def __str__(self) -> str:
        self._ctx._live()
        return str(self._text.to_string())


def _check_element(element: str) -> str:
    if not isinstance(element, str):
        raise InvalidArgument(f"set elements must be strings, not {type(element).__name__}")
    if len(_check_text(element, "a set element").encode("utf-8")) > MAX_ELEMENT_BYTES:
        raise InvalidArgument(f"set element over {MAX_ELEMENT_BYTES} bytes")
    return element


def gset_members(entries: dict[str, Any]) -> list[str]:
    """The members of a grow-only set given its map's plain value, sorted."""
    return sorted(k for k, v in entries.items() if v is True)


def orset_members(entries: dict[str, Any]) -> list[str]:
    """The members of an add-wins set given its map's plain value (tag -> element), sorted."""
    return sorted({v for v in entries.values() if type(v) is str})


class _SetHandle:
    """What both set types share: a map root and sorted reads."""

    __slots__ = ("_ctx", "_map")
    _prefix = ""

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self._map = ctx._doc.get_map(self._prefix + name)

    def _entries(self) -> dict[str, Any]:
        self._ctx._live()
        entries: dict[str, Any] = _deep(self._map)
        return entries

    def _write(self, element: str) -> str:
        self._ctx._live()
        self._ctx._writable()
        return _check_element(element)

    def members(self) -> list[str]:
        """The members, sorted."""
        raise NotImplementedError

    def __contains__(self, element: object) -> bool:
        return isinstance(element, str) and element in self.members()

    def __len__(self) -> int:
        return len(self.members())

    def __iter__(self) -> Iterator[str]:
        return iter(self.members())


class GSetHandle(_SetHandle):
    """A grow-only set of strings ("shops done"): add, never remove."""

    __slots__ = ()
    _prefix = GSET_PREFIX

    def add(self, element: str) -> None:
        """Add ``element`` (a no-op when it is already a member)."""
        if self._map.get(self._write(element)) is None:
            self._map.insert(element, True)

    def members(self) -> list[str]:
        """The members, sorted."""
        return gset_members(self._entries())


class ORSetHandle(_SetHandle):
    """An add-wins observed-remove set of strings (chat participants).

    See the module docs: a remove takes away only the adds its writer has
    seen, so an add concurrent with a remove of the same element wins.
    """

    __slots__ = ()
    _prefix = ORSET_PREFIX

    def _tags(self, element: str) -> list[str]:
        entries = self._entries()
        return sorted(tag for tag, v in entries.items() if v == element and type(v) is str)

    def add(self, element: str) -> None:
        """Add ``element`` under a fresh tag, superseding the adds seen so far."""
        old = self._tags(self._write(element))
        doc = self._ctx._doc
        last = doc.oplog_vv.get_last(doc.peer_id)
        counter = 0 if last is None else last + 1  # the id of the insert below
        self._map.insert(f"{doc.peer_id:x}.{counter:x}", element)
        for tag in old:
            self._map.delete(tag)

    def discard(self, element: str) -> None:
        """Remove ``element`` if present: delete every add of it seen so far."""
        for tag in self._tags(self._write(element)):
            self._map.delete(tag)

    def remove(self, element: str) -> None:
        """Like :meth:`discard`, but raise ``KeyError`` when ``element`` is absent."""
        if element not in self:
            raise KeyError(element)
        self.discard(element)

    def members(self) -> list[str]:
        """The members, sorted."""
        return orset_members(self._entries())


class Context:
    """Typed access to one context: a key/value map plus named lists, counters,
    texts, grow-only sets and add-wins sets.

    Reads always work; writes need a view built with the local author and go
    to the journal on the next :meth:`ContextView.pending_update`.
    """

    __slots__ = ("_doc", "_kv", "_view", "name")

    def __init__(self, view: ContextView, name: str, doc: LoroDoc) -> None:
        self._view = view
        self.name = name
        self._doc = doc
        self._kv = doc.get_map(_KV_ROOT)

    def _live(self) -> None:
        """Bring the doc's state up to date before reading or writing."""
        self._view._live(self.name, self._doc)

    def _writable(self) -> None:
        if self._view.author is None:
            raise InvalidArgument("this context view is read-only (no local author)")
        self._view._check_write(self.name, self._doc)

    def __setitem__(self, key: str, value: Any) -> None:
        self._live()
        self._writable()
        if not isinstance(key, str):
            raise InvalidArgument("keys must be strings")
        self._kv.insert(_check_text(key, "a key"), _checked(value))

    def __getitem__(self, key: str) -> Any:
        self._live()
        v = self._kv.get(key)
        if v is None:
            raise KeyError(key)
        return _plain(v)

    def __delitem__(self, key: str) -> None:
        self._live()
        self._writable()
        if self._kv.get(_check_text(key, "a key")) is None:
            raise KeyError(key)
        self._kv.delete(key)

    def __contains__(self, key: object) -> bool:
        self._live()
        return isinstance(key, str) and self._kv.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """``ctx[key]`` or ``default``."""
        self._live()
        v = self._kv.get(key)
        return default if v is None else _plain(v)

    def keys(self) -> list[str]:
        """The keys of the map, sorted."""
        self._live()
        return sorted(self._kv.keys())

    def to_dict(self) -> dict[str, Any]:
        """The key/value map as a plain dict (keys sorted)."""
        self._live()
        value = _deep(self._kv)
        return {k: value[k] for k in sorted(value)}

    def list(self, name: str) -> ListHandle:
        """The list called ``name``."""
        return ListHandle(self, _check_root(name))

    def counter(self, name: str) -> CounterHandle:
        """The counter called ``name``."""
        return CounterHandle(self, _check_root(name))

    def text(self, name: str) -> TextHandle:
        """The text called ``name``."""
        return TextHandle(self, _check_root(name))

    def gset(self, name: str) -> GSetHandle:
        """The grow-only set called ``name``."""
        return GSetHandle(self, _check_root(name))

    def orset(self, name: str) -> ORSetHandle:
        """The add-wins observed-remove set called ``name``."""
        return ORSetHandle(self, _check_root(name))
