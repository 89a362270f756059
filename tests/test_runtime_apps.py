"""Applications plug into the daemon through hivemesh.runtime.apps only."""

from __future__ import annotations

import pathlib

from hivemesh import commands as c
from hivemesh.runtime.apps import APPS, App, load
from hivemesh.runtime.handlers import HANDLERS
from hivemesh.telemetry.app import TelemetryApp
from hivemesh.telemetry.node import COLLECTOR_NAME

RUNTIME = pathlib.Path(__file__).resolve().parents[1] / "src" / "hivemesh" / "runtime"


def test_telemetry_is_an_app_named_in_the_list() -> None:
    assert load("hivemesh.telemetry.app:TelemetryApp") is TelemetryApp
    assert [load(spec) for spec in APPS] == [TelemetryApp]
    cls: type[App] = TelemetryApp  # the shape the daemon calls (checked by mypy)
    assert cls.name == "telemetry" and cls.addressees == frozenset({COLLECTOR_NAME})


def test_the_daemon_routes_the_apps_commands_without_knowing_them() -> None:
    app = TelemetryApp.__new__(TelemetryApp)  # commands() reads no state
    owned = set(app.commands())
    assert owned == {c.MetricsQuery, c.MetricsRecord, c.MetricsSend}
    assert {HANDLERS[t].__name__ for t in owned} == {"_by_app"}


def test_no_runtime_module_names_the_telemetry_application() -> None:
    for path in sorted(RUNTIME.glob("*.py")):
        text = path.read_text("utf-8")
        assert "hivemesh.telemetry" not in text.replace("hivemesh.telemetry.app:", ""), path.name
