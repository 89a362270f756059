"""Benchmarks behind ``hivemesh bench NAME``.

Each benchmark is a module here exposing::

    DESCRIPTION: str
    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> BenchResult: ...

A result always carries our figure, a baseline measured *in the same run*,
and their ratio, so a noisy machine still gives a fair comparison.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["BenchResult", "Metric", "available", "load"]


@dataclass
class Metric:
    """One compared figure: ours, the baseline's, and the goal it is held to."""

    name: str
    ours: float
    baseline: float | None
    unit: str
    baseline_name: str = ""
    higher_is_better: bool = True
    goal: str = ""
    goal_met: bool | None = None

    @property
    def ratio(self) -> float | None:
        """ours / baseline (None without a baseline)."""
        if self.baseline in (None, 0):
            return None
        return self.ours / self.baseline


@dataclass
class BenchResult:
    """What a benchmark prints: metrics plus free-form details."""

    name: str
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict including each metric's ratio."""
        out: dict[str, Any] = {"bench": self.name, "metrics": [], "details": self.details}
        for m in self.metrics:
            d = asdict(m)
            d["ratio"] = m.ratio
            out["metrics"].append(d)
        return out

    def render(self) -> str:
        """A human-readable table."""
        lines = [f"bench {self.name}"]
        for m in self.metrics:
            base = "-" if m.baseline is None else f"{m.baseline:,.2f}"
            ratio = "-" if m.ratio is None else f"{m.ratio:.2f}x"
            goal = ""
            if m.goal:
                mark = {True: "met", False: "MISSED", None: "?"}[m.goal_met]
                goal = f"  goal {m.goal}: {mark}"
            lines.append(
                f"  {m.name:<34} ours {m.ours:>14,.2f} {m.unit:<8} "
                f"{m.baseline_name or 'baseline'} {base:>14} ratio {ratio}{goal}"
            )
        for k, v in self.details.items():
            lines.append(f"  {k}: {v}")
        return "\n".join(lines)


#: Modules here that are not benchmarks (``suite`` runs them all: ``bench all``).
NOT_BENCHMARKS = frozenset({"suite"})


def available() -> list[str]:
    """Names of all benchmarks."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(__path__)
        if not m.name.startswith("_") and m.name not in NOT_BENCHMARKS
    )


def load(name: str) -> ModuleType:
    """Import benchmark module ``name``."""
    if name not in available():
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")
