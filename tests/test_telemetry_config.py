"""Telemetry sinks in the node config (``metrics_sinks``): TOML, environment, flags,
errors, and a collector daemon that serves the Prometheus sink it was configured with."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import hivemesh
from hivemesh.config import load_config
from hivemesh.errors import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_sinks_from_a_toml_table_env_and_flags(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        "[telemetry]\ncollector = true\n"
        "[telemetry.metrics_sinks.prometheus]\nhost = '127.0.0.1'\nport = 9464\n"
        "[telemetry.metrics_sinks.influxdb]\nurl = 'http://127.0.0.1:8086'\n"
    )
    cfg = load_config(tmp_path, environ={})
    assert cfg.sinks() == {
        "prometheus": {"host": "127.0.0.1", "port": "9464"},
        "influxdb": {"url": "http://127.0.0.1:8086"},
    }
    # the environment replaces the file's value, flags replace both
    env = {"HIVEMESH_METRICS_SINKS": "otlp:endpoint=http://127.0.0.1:4318,interval_s=5; "}
    cfg = load_config(tmp_path, environ=env)
    assert cfg.sinks() == {"otlp": {"endpoint": "http://127.0.0.1:4318", "interval_s": "5"}}
    flags = {"metrics_sinks": ("prometheus", "clickhouse:url=http://h:8123?x=1,table=t")}
    cfg = load_config(tmp_path, environ=env, overrides=flags)
    assert cfg.sinks() == {
        "prometheus": {},
        "clickhouse": {"url": "http://h:8123?x=1", "table": "t"},
    }
    # a TOML list of specs works too; no sinks by default
    (tmp_path / "config.toml").write_text("[telemetry]\nmetrics_sinks = ['prometheus:port=1']\n")
    assert load_config(tmp_path, environ={}).sinks() == {"prometheus": {"port": "1"}}
    assert load_config(tmp_path / "none", environ={}).metrics_sinks == ()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("kafka:url=x", "unknown telemetry sink"),
        ("prometheus:prot=9464", "unknown options"),
        ("influxdb:database=x", "missing options"),
        ("prometheus:port=http", "must be a number"),
        ("prometheus:port=70000", "out of range"),
        ("prometheus:port", "key=value"),
        (":port=1", "no name"),
        ("prometheus;prometheus:port=2", "named twice"),
    ],
)
def test_bad_sink_specs_are_config_errors(tmp_path: Path, spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path, environ={"HIVEMESH_METRICS_SINKS": spec})


def test_bad_sink_table_in_toml(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[telemetry.metrics_sinks]\nprometheus = 3\n")
    with pytest.raises(ConfigError, match="table of options"):
        load_config(tmp_path, environ={})
    (tmp_path / "config.toml").write_text("[telemetry.metrics_sinks.otlp]\nendpoint = [1]\n")
    with pytest.raises(ConfigError, match="scalars"):
        load_config(tmp_path, environ={})


def test_collector_daemon_serves_its_configured_prometheus_sink(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.toml").write_text(
        f"[telemetry.metrics_sinks.prometheus]\nhost = '127.0.0.1'\nport = {port}\n"
    )

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body: bytes = r.read()
        return body.decode()

    async def scenario() -> None:
        async with hivemesh.Node(tmp_path / "c", collector=True, name="planner") as node:
            assert node.status()["telemetry"]["collector"]["sinks"] == ["PrometheusSink"]
            node.metrics.gauge("queue.depth", 7)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            text = ""
            while 'name="queue.depth"' not in text:
                assert loop.time() < deadline, f"gauge never exposed:\n{text[-800:]}"
                await asyncio.sleep(0.05)
                text = await asyncio.to_thread(scrape)
            line = next(ln for ln in text.splitlines() if 'name="queue.depth"' in ln)
            assert line.startswith("hivemesh_gauge{") and line.rstrip().endswith(" 7.0")
        with pytest.raises(OSError):  # closed with the node
            await asyncio.to_thread(scrape)

    asyncio.run(scenario())


def test_up_rejects_a_bad_sink_flag(tmp_path: Path) -> None:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "hivemesh", "up", "--data-dir", str(tmp_path), "--listen",
         "127.0.0.1:0", "--collector", "--sink", "kafka:url=x"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "unknown telemetry sink 'kafka'" in proc.stdout + proc.stderr
