"""What every command is: a typed request, a typed reply, a wire name, its errors.

Theory of operation
-------------------
A command is a frozen dataclass subclassing :class:`Command`. Its fields are
the request's arguments; its class attributes say

* ``op`` -- the stable wire name (``"ctx.set"``), the ``op`` of a control
  request and the key of :data:`hivemesh.commands.COMMANDS`;
* ``reply`` -- the :class:`Reply` class its answer is decoded into;
* ``errors`` -- the stable error codes (:attr:`hivemesh.errors.HivemeshError.code`)
  it may answer with, beside :data:`COMMON_ERRORS` that any command may;
* ``stream`` -- True for a command answered by a stream of events.

:meth:`Command.from_wire` turns the JSON ``args`` of a request into the
typed request: every field is checked against its annotation (``str``,
``int``, ``float``, ``bool``, ``X | None``, ``tuple[str, ...]``, ``Any`` for
any JSON value), a missing field without a default and an unknown field are
:class:`~hivemesh.errors.InvalidArgument` with the field's name, and then
:meth:`Command.check` applies the command's own ranges. ``timeout_s`` is
accepted by every command: it is the request's deadline (the command reads
it if it declares it as a field). :meth:`Command.to_wire` is the inverse.

Replies are frozen dataclasses too; :meth:`Reply.to_wire` gives the JSON
result and :meth:`Reply.from_wire` reads it back. A reply whose shape is an
open record (``status``, a snapshot) is a :class:`Record`: its one field
``data`` is the JSON itself.

This package imports only the standard library and :mod:`hivemesh.errors`,
so the core may use it.
"""

from __future__ import annotations

import base64
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from hivemesh.errors import InvalidArgument, LocalProtocolError

__all__ = [
    "COMMON_ERRORS",
    "MAX_TIMEOUT_S",
    "Command",
    "Record",
    "Reply",
    "check_timeout",
    "jsonable",
]

#: Codes any command may answer with: a bad request (``invalid_argument``
#: and its kinds), an unknown command, the request's deadline, a daemon busy
#: with other clients, no daemon at all (the client's), a bug (``internal``).
COMMON_ERRORS: tuple[str, ...] = (
    "bad_encoding",
    "daemon_not_running",
    "deadline_exceeded",
    "internal",
    "invalid_argument",
    "peer_busy",
    "too_deep",
    "too_large",
    "unknown_command",
)

#: The longest deadline a request may ask for.
MAX_TIMEOUT_S = 3600.0

_MISSING = dataclasses.MISSING


def jsonable(obj: Any) -> Any:
    """``obj`` with bytes as ``{"$bytes": base64}`` so it fits in JSON."""
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any JSON value"
    if isinstance(tp, type):
        return {"str": "a string", "int": "an integer", "float": "a number"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp).replace("typing.", "")


def _convert(where: str, tp: Any, value: Any) -> Any:
    """``value`` checked against the annotation ``tp`` (see module docs)."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errs = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _convert(where, opt, value)
            except InvalidArgument as exc:
                errs.append(str(exc))
        raise InvalidArgument(errs[0] if len(errs) == 1 else f"{where}: bad value {value!r:.60}")
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(f"{where} must be a list of {_type_name(item)}s")
        return tuple(_convert(f"{where}[{i}]", item, v) for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise InvalidArgument(f"{where} must be an object")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise InvalidArgument(f"{where} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{where} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"{where} must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise InvalidArgument(f"{where} must be a string")
        return value
    raise LocalProtocolError(f"{where}: unsupported field type {tp!r}")  # a bug in a command


def _hints(cls: type) -> dict[str, Any]:
    cached: dict[str, Any] | None = cls.__dict__.get("_hints_cache")
    if cached is None:
        cached = typing.get_type_hints(cls)
        type.__setattr__(cls, "_hints_cache", cached)
    return cached


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """The typed answer of a command (a frozen dataclass; see module docs)."""

    def to_wire(self) -> Any:
        """The JSON result of a control response."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_wire(cls, result: Any) -> Self:
        """The reply read back from a JSON result."""
        if not isinstance(result, dict):
            raise LocalProtocolError(f"{cls.__name__}: expected an object, got {result!r:.80}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in result:
                values[f.name] = result[f.name]
            elif f.default is _MISSING:
                raise LocalProtocolError(f"{cls.__name__}: the reply lacks {f.name!r}")
        return cls(**values)


@dataclasses.dataclass(frozen=True, slots=True)
class Record(Reply):
    """A reply whose shape is an open record: ``data`` is the JSON result."""

    data: Any

    def to_wire(self) -> Any:
        """``data`` itself."""
        return jsonable(self.data)

    @classmethod
    def from_wire(cls, result: Any) -> Self:
        """Wrap the result."""
        return cls(result)


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A typed request (see module docs). Subclasses are frozen dataclasses."""

    op: ClassVar[str] = ""
    reply: ClassVar[type[Reply]] = Record
    errors: ClassVar[tuple[str, ...]] = ()
    stream: ClassVar[bool] = False

    def check(self) -> None:
        """Raise :class:`~hivemesh.errors.InvalidArgument` for values out of
        range (the types are already checked)."""

    @classmethod
    def from_wire(cls, args: Any) -> Self:
        """The typed request from a request's JSON ``args`` (see module docs)."""
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise InvalidArgument(f"{cls.op}: args must be an object")
        hints = _hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in args if k not in fields and k != "timeout_s")
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            raise InvalidArgument(
                f"{cls.op}: unknown field {str(unknown[0])!r:.60} (fields: {known})"
            )
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name in args:
                values[name] = _convert(f"{cls.op}: {name}", hints[name], args[name])
            elif f.default is _MISSING and f.default_factory is _MISSING:
                raise InvalidArgument(f"{cls.op}: missing field {name!r}")
        if "timeout_s" in args and "timeout_s" not in fields:
            check_timeout(cls.op, _convert(f"{cls.op}: timeout_s", float, args["timeout_s"]))
        req = cls(**values)
        req.check()
        return req

    def to_wire(self) -> dict[str, Any]:
        """The request's JSON ``args`` (fields left at None are left out)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def deadline_s(self) -> float | None:
        """The request's own deadline, if it has one (its ``timeout_s``)."""
        t = getattr(self, "timeout_s", None)
        return float(t) if isinstance(t, (int, float)) else None


def check_timeout(command: str, timeout_s: float, field: str = "timeout_s") -> None:
    """Raise :class:`InvalidArgument` unless ``0 < timeout_s <= 3600``."""
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InvalidArgument(f"{command}: {field} must be a number in (0, 3600]")
