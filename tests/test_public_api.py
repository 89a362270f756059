"""The curated public surface: a name appearing or disappearing fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hivemesh

EXPECTED = [
    "Client",
    "Config",
    "EventRecord",
    "HivemeshError",
    "Node",
    "__version__",
    "load_config",
]


def test_all_is_exactly_the_curated_list() -> None:
    assert hivemesh.__all__ == EXPECTED
    assert hivemesh.__all__ == sorted(hivemesh.__all__)


def test_every_exported_name_resolves_to_a_documented_object() -> None:
    for name in hivemesh.__all__:
        obj = getattr(hivemesh, name)
        if name != "__version__":
            assert obj.__doc__, f"{name} has no docstring"
            assert obj.__module__.startswith("hivemesh."), name


def test_unknown_attribute_raises_attribute_error() -> None:
    try:
        hivemesh.NoSuchThing  # noqa: B018
    except AttributeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_import_hivemesh_does_not_load_the_runtime() -> None:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    code = "import sys, hivemesh; print('hivemesh.runtime.daemon' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_a_node_does_not_load_the_collector_or_model_stacks() -> None:
    """Importing the node (and the plan control ops it registers) leaves the
    collector's DuckDB/Arrow, the model providers' HTTP stack and the MCP and
    HTML-parsing stacks of the tools unloaded."""
    code = (
        "import sys, hivemesh, hivemesh.node, hivemesh.roles.meshops;"
        "print(sorted(m for m in ('duckdb', 'pyarrow', 'numpy', 'httpx', 'jsonschema',"
        " 'mcp', 'lxml', 'starlette', 'uvicorn')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_lazy_exports_resolve_and_unknown_names_raise() -> None:
    import hivemesh.roles as roles
    import hivemesh.telemetry as telemetry

    for pkg in (roles, telemetry):
        for name in pkg.__all__:
            assert getattr(pkg, name) is not None
        try:
            pkg.no_such_name  # noqa: B018
        except AttributeError:
            continue
        raise AssertionError(f"{pkg.__name__}.no_such_name resolved")
