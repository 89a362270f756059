"""The driver's shape (ARCHITECTURE.md, "One node, one machine"; STYLE.md 7, 9):
one daemon class without mixins, no attribute probing, and no task or loop
whose failure is swallowed by ``suppress(BaseException)``. A source check
(:mod:`ast`, no code runs) that fails when one comes back."""

from __future__ import annotations

import ast
import pathlib

from hivemesh.runtime.daemon import Daemon

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "hivemesh"


def _calls(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """``(line, callee, dotted names of the arguments)`` of every call in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            out.append((node.lineno, callee, [ast.unparse(a) for a in node.args]))
    return out


def test_the_daemon_is_one_class_without_mixins() -> None:
    assert Daemon.__bases__ == (object,)


def test_the_driver_does_not_probe_attributes() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted((SRC / "runtime").glob("*.py"))
        for line, callee, _args in _calls(path)
        if callee == "hasattr"
    ]
    assert found == []


def test_no_failure_is_swallowed_whole() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        for line, callee, args in _calls(path)
        if callee.endswith("suppress") and "BaseException" in args
    ]
    assert found == []


def test_the_check_finds_what_it_looks_for(tmp_path: pathlib.Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import contextlib\nwith contextlib.suppress(BaseException):\n    hasattr(1, 'x')\n"
    )
    callees = {callee for _line, callee, _args in _calls(planted)}
    assert {"contextlib.suppress", "hasattr"} <= callees
