"""hivemesh.core stays sans-IO and deterministic; layers import downward only."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "hivemesh"

FORBIDDEN_MODULES = {
    "asyncio", "socket", "threading", "selectors", "subprocess", "secrets", "uuid",
    "random", "time", "datetime", "os", "multiprocessing", "ssl", "sqlite3",
}  # fmt: skip
FORBIDDEN_CALLS = {"time.time", "time.monotonic", "os.urandom", "uuid.uuid4", "random.random"}
# `random` may be imported for the *type* random.Random (injected), never called globally.
ALLOWED_IMPORTS = {"random"}

# Which top-level hivemesh packages each layer may import.
LAYERS = {
    # the typed commands are plain checked data below the core: the Peer
    # answers the same classes the CLI, control socket and faces send
    "commands": {"commands", "errors", "_lazy"},
    "core": {"core", "errors", "commands"},
    # the simulator drives the lease application's public API (its leases workload)
    # and checks histories with the linearizability checker (which imports nothing)
    "sim": {"core", "commands", "errors", "sim", "stores", "bench", "leases", "verify"},
}


def _modules(pkg: str) -> list[pathlib.Path]:
    return sorted((SRC / pkg).rglob("*.py"))


def test_core_has_no_io_or_ambient_time() -> None:
    bad = []
    for path in _modules("core"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module.split(".")[0]]
            for name in names:
                if name in FORBIDDEN_MODULES and name not in ALLOWED_IMPORTS:
                    bad.append(f"{path.name}: import {name}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                dotted = f"{node.value.id}.{node.attr}"
                if dotted in FORBIDDEN_CALLS:
                    bad.append(f"{path.name}:{node.lineno}: {dotted}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "random"
                and node.func.attr != "Random"
            ):
                bad.append(f"{path.name}:{node.lineno}: global random.{node.func.attr}()")
    assert bad == []


def test_layers_import_downward() -> None:
    bad = []
    for layer, allowed in LAYERS.items():
        for path in _modules(layer):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    parts = node.module.split(".")
                    if parts[0] == "hivemesh" and len(parts) > 1 and parts[1] not in allowed:
                        bad.append(f"{layer}/{path.name} imports {node.module}")
    assert bad == []
