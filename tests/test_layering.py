"""Imports point down only (ARCHITECTURE.md, "One node, one machine").

A checker walks every module's import statements with :mod:`ast` (no code
runs): top-level, inside functions and under ``TYPE_CHECKING`` alike, with
relative imports resolved. The rules:

* ``hivemesh.core`` imports nothing of hivemesh above it: only itself,
  ``hivemesh.errors`` and ``hivemesh.commands`` (the stdlib and third-party
  libraries are fine);
* the edges (``hivemesh.transports``, ``hivemesh.stores``) import only the
  core, the error taxonomy, the commands and themselves;
* ``hivemesh.runtime`` imports no private module (``_name``) and no private
  name of an application (leases, telemetry, roles, llm, audit, tools,
  webtools): applications plug in through their documented public surface;
  and nothing of the faces, the benchmarks or the simulator, which sit on it.

The same checker runs on a small synthetic tree with one planted violation
of each rule, so a checker that stopped finding them would fail here too.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

#: Layer (top-level package under hivemesh) -> hivemesh packages it may import.
ONLY = {
    "core": {"core", "errors", "commands"},
    "transports": {"core", "errors", "commands", "transports"},
    "stores": {"core", "errors", "commands", "stores"},
}
#: Applications: the runtime uses their public surface only.
APPS = {"leases", "telemetry", "roles", "llm", "audit", "tools", "webtools"}
#: Layers that must not reach into an application's private parts.
NO_PRIVATE = {"runtime"}
#: Layer -> hivemesh packages it must not import at all (they sit above it).
NEVER = {"runtime": {"faces", "bench", "sim"}}


@dataclass(frozen=True)
class Imported:
    """One name an import statement brings in: ``module`` (absolute, dotted)
    and, for ``from m import x``, the name ``x``."""

    module: str
    name: str | None
    lineno: int


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    """``root/hivemesh/a/b.py`` -> ``hivemesh.a.b`` (packages drop ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: pathlib.Path, path: pathlib.Path) -> Iterator[Imported]:
    """Every import in ``path``, relative ones made absolute."""
    here = module_name(root, path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Imported(alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield Imported(module, alias.name, node.lineno)


def violations(root: pathlib.Path) -> list[str]:
    """The forbidden imports under ``root/hivemesh`` (module docs), one line each."""
    bad: list[str] = []
    for path in sorted((root / "hivemesh").rglob("*.py")):
        here = module_name(root, path).split(".")
        layer = here[1] if len(here) > 1 else ""
        for imp in imports_of(root, path):
            target = imp.module.split(".")
            if target[0] != "hivemesh":
                continue  # stdlib or third party
            # ``from hivemesh import x`` / ``from hivemesh.a import b`` may name a module.
            full = target + ([imp.name] if imp.name and len(target) < 3 else [])
            top = full[1] if len(full) > 1 else ""
            where = f"{path.relative_to(root)}:{imp.lineno}"
            shown = imp.module + (f" ({imp.name})" if imp.name else "")
            if layer in ONLY and top and top not in ONLY[layer]:
                bad.append(f"{where}: {layer} imports hivemesh.{top}: {shown}")
            if top in NEVER.get(layer, ()):
                bad.append(f"{where}: {layer} imports hivemesh.{top}: {shown}")
            if layer in NO_PRIVATE and top in APPS:
                private = [p for p in target[2:] if p.startswith("_")]
                if imp.name and imp.name.startswith("_"):
                    private.append(imp.name)
                if private:
                    bad.append(f"{where}: {layer} imports private {private[0]}: {shown}")
    return bad


def test_the_tree_keeps_its_layers() -> None:
    assert violations(SRC) == []


def _write(root: pathlib.Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_checker_finds_planted_violations(tmp_path: pathlib.Path) -> None:
    for pkg in ("", "core/", "runtime/", "leases/", "telemetry/", "stores/", "faces/"):
        _write(tmp_path, f"hivemesh/{pkg}__init__.py")
    _write(tmp_path, "hivemesh/errors.py")
    _write(tmp_path, "hivemesh/leases/_api.py", "def _check(): ...\n")
    _write(tmp_path, "hivemesh/telemetry/node.py", "def _hidden(): ...\ndef shown(): ...\n")
    # Allowed: stdlib, third party, own layer, errors, an application's public surface.
    _write(
        tmp_path,
        "hivemesh/core/ok.py",
        "import json\nimport loro\nfrom hivemesh.errors import E\nfrom . import codec\n",
    )
    _write(
        tmp_path,
        "hivemesh/runtime/ok.py",
        "from hivemesh.leases import LeaseClient\nfrom hivemesh.telemetry.node import shown\n",
    )
    assert violations(tmp_path) == []

    _write(tmp_path, "hivemesh/core/up.py", "def f():\n    from hivemesh.runtime import daemon\n")
    _write(tmp_path, "hivemesh/core/rel.py", "from ..faces import cli\n")
    _write(tmp_path, "hivemesh/core/pkg.py", "from hivemesh import trust\n")
    _write(tmp_path, "hivemesh/stores/up.py", "import hivemesh.runtime.daemon\n")
    _write(tmp_path, "hivemesh/runtime/mod.py", "from hivemesh.leases._api import LeaseInfo\n")
    _write(tmp_path, "hivemesh/runtime/name.py", "from hivemesh.telemetry.node import _hidden\n")
    _write(tmp_path, "hivemesh/runtime/sub.py", "from hivemesh.leases import _api\n")
    _write(tmp_path, "hivemesh/runtime/up.py", "from hivemesh.faces.cli import main\n")
    found = violations(tmp_path)
    assert [line.split(":")[0] for line in found] == [
        "hivemesh/core/pkg.py",
        "hivemesh/core/rel.py",
        "hivemesh/core/up.py",
        "hivemesh/runtime/mod.py",
        "hivemesh/runtime/name.py",
        "hivemesh/runtime/sub.py",
        "hivemesh/runtime/up.py",
        "hivemesh/stores/up.py",
    ], found
    assert "core imports hivemesh.runtime" in found[2]
    assert "imports private _hidden" in found[4]
