"""Error classes by their stable ``code``: how a client turns an answer back
into the exception the daemon raised.

The map is built from an explicit list of the modules that define errors
(:data:`ERROR_MODULES`): the taxonomy in :mod:`hivemesh.errors`, then each
application's own ``errors`` module. Nothing registers itself on import.
The taxonomy is read first; the application modules are imported only when
a code is not found there (a CLI command that gets ``unknown_peer`` never
loads the LLM providers). Codes are unique across all of them (checked when
the map is built, and by a test).

::

    raise error_from_wire({"code": "unknown_peer", "message": "..."})
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from hivemesh import errors
from hivemesh.errors import HivemeshError, LocalProtocolError

__all__ = ["ERROR_MODULES", "all_codes", "error_class", "error_from_wire"]

#: Every module that defines error classes, the taxonomy first.
ERROR_MODULES: tuple[str, ...] = (
    "hivemesh.errors",
    "hivemesh.audit.errors",
    "hivemesh.faces.dashboard.errors",
    "hivemesh.faces.langgraph.errors",
    "hivemesh.leases.errors",
    "hivemesh.llm.errors",
    "hivemesh.netlab.errors",
    "hivemesh.telemetry.errors",
    "hivemesh.tools.errors",
    "hivemesh.webtools.errors",
)

_maps: dict[bool, dict[str, type[HivemeshError]]] = {}


def _classes_of(module: Any) -> list[type[HivemeshError]]:
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, HivemeshError)
        and obj.__module__ == module.__name__
    ]


def _build(modules: tuple[str, ...]) -> dict[str, type[HivemeshError]]:
    out: dict[str, type[HivemeshError]] = {}
    for name in modules:
        module = errors if name == "hivemesh.errors" else importlib.import_module(name)
        for cls in _classes_of(module):
            other = out.setdefault(cls.code, cls)
            if other is not cls:
                raise LocalProtocolError(
                    f"error code {cls.code!r} is used by both {other.__qualname__} and "
                    f"{cls.__module__}.{cls.__qualname__}"
                )
    return out


def _map(everything: bool) -> dict[str, type[HivemeshError]]:
    found = _maps.get(everything)
    if found is None:
        found = _maps[everything] = _build(ERROR_MODULES if everything else ERROR_MODULES[:1])
    return found


def all_codes() -> Mapping[str, type[HivemeshError]]:
    """Every code and its class (imports every module of :data:`ERROR_MODULES`)."""
    return dict(_map(True))


def error_class(code: object) -> type[HivemeshError]:
    """The class whose ``code`` is ``code`` (:class:`HivemeshError` if none)."""
    if not isinstance(code, str):
        return HivemeshError
    cls = _map(False).get(code) or _map(True).get(code)
    return cls or HivemeshError


def error_from_wire(err: Mapping[str, Any]) -> HivemeshError:
    """The exception an error answer (``{"code", "message", ...}``) stands for.

    An unknown code gives a plain :class:`HivemeshError` that keeps the
    code it came with, so it is still reported by its code.
    """
    code = err.get("code")
    message = str(err.get("message", ""))
    cls = error_class(code)
    try:
        exc = cls(message)
    except TypeError:  # a class with a richer constructor: keep its category
        exc = next(b for b in cls.__mro__ if _plain_init(b))(message)
    if type(exc) is HivemeshError and isinstance(code, str) and code:
        exc.code = code  # the instance keeps the daemon's code
    return exc


def _plain_init(cls: type) -> bool:
    return issubclass(cls, HivemeshError) and "__init__" not in vars(cls)
