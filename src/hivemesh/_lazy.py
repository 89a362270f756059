"""Lazy package exports: a package lists what it exports and where it lives;
each name is imported on first use. Importing a light submodule (the metrics
recorder, the plan control ops) then does not load the heavy ones beside it
(DuckDB and Arrow for the collector, HTTP clients for model providers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` resolving ``name`` from the
    module ``where[name]`` (and caching it in the package namespace)."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
