"""Observer: never writes; rebuilds and shows the tree from the journal alone.

An observer is just a :class:`~hivemesh.core.plan.PlanView` fed by the
journal (a late joiner replays it and sees the complete tree) plus
renderers over the plain-data snapshot, so ``hivemesh plan show --json``
output can be rendered the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh.core.plan import PlanView
from hivemesh.roles.base import Action

if TYPE_CHECKING:  # rich loads where a tree is drawn, not with every role
    from rich.tree import Tree

__all__ = ["Observer", "render_rich", "render_text"]

_STYLE = {
    "done": "green",
    "failed": "red",
    "cancelled": "red",
    "claimed": "yellow",
    "synthesis": "yellow",
    "split": "cyan",
    "ready": "white",
    "blocked": "dim",
    "open": "magenta",
}


def _label(n: dict[str, Any], width: int) -> str:
    bits = [f"[{n['status']}]", n["title"][:width]]
    if n["kind"] == "undecided" and n["proposals"]:
        bits.append(f"({len(n['proposals'])} proposals)")
    if n["duplicates"]:
        bits.append(f"dup={n['duplicates']}")
    if n["attempts"]:
        bits.append(f"attempts={n['attempts']}")
    if n["result"] and n["kind"] == "leaf":
        bits.append("-> " + n["result"]["text"].replace("\n", " ")[:width])
    return " ".join(bits)


def render_text(node: dict[str, Any], *, width: int = 60) -> str:
    """An indented plain-text tree of one snapshot node."""
    lines: list[str] = []

    def walk(n: dict[str, Any], depth: int) -> None:
        lines.append("  " * depth + _label(n, width))
        for c in n["children"]:
            walk(c, depth + 1)

    walk(node, 0)
    return "\n".join(lines)


def render_rich(node: dict[str, Any], *, width: int = 60) -> Tree:
    """A :class:`rich.tree.Tree` of one snapshot node, coloured by status."""
    from rich.tree import Tree

    def add(parent: Tree | None, n: dict[str, Any]) -> Tree:
        style = _STYLE.get(n["status"], "white")
        label = _label(n, width).replace("[", "\\[")
        t = Tree(f"[{style}]{label}[/]") if parent is None else parent.add(f"[{style}]{label}[/]")
        for c in n["children"]:
            add(t, c)
        return t

    return add(None, node)


class Observer:
    """A read-only role: ``poll`` never returns actions."""

    name = "observer"

    def __init__(self, me: bytes) -> None:
        self.me = me

    def poll(self, view: PlanView, now_ms: int) -> list[Action]:
        """Observers never write."""
        return []

    def show(self, view: PlanView, root: str, *, width: int = 60) -> Tree | None:
        """The rich tree of ``root`` as this observer's view has it."""
        snap = view.tree(root)
        return None if snap is None else render_rich(snap, width=width)
