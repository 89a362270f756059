"""Configuration layering: defaults < TOML < environment < flags, strict errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hivemesh.config import Config, bootstrap_targets, load_config, parse_endpoint
from hivemesh.errors import ConfigError


def test_defaults_without_file_or_env(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, environ={})
    assert cfg.data_dir == tmp_path
    assert cfg.listen == Config().listen and cfg.bootstrap == ()
    assert cfg.control_path == tmp_path / "ctl.sock"


def test_layers_override_in_order(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[network]\nlisten = "127.0.0.1:7001"\nbootstrap = ["10.0.0.1:7420"]\n'
        "[membership]\nprobe_interval_ms = 500\nsuspicion_mult = 5\n"
        '[node]\nname = "from-file"\n'
    )
    env = {"HIVEMESH_PROBE_INTERVAL_MS": "300", "HIVEMESH_BOOTSTRAP": "a:1, b:2"}
    cfg = load_config(tmp_path, environ=env, overrides={"name": "from-flag", "listen": None})
    assert cfg.listen == "127.0.0.1:7001"  # file (flag not given)
    assert cfg.probe_interval_ms == 300  # env beats file
    assert cfg.suspicion_mult == 5  # file
    assert cfg.probe_timeout_ms == 150  # derived: half the probe interval
    assert cfg.bootstrap == ("a:1", "b:2")  # env, comma-separated
    assert cfg.name == "from-flag"  # flag beats file


def test_data_dir_from_environment(tmp_path: Path) -> None:
    cfg = load_config(None, environ={"HIVEMESH_DATA_DIR": str(tmp_path / "x")})
    assert cfg.data_dir == tmp_path / "x"


def test_explicit_config_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path, config_file=tmp_path / "nope.toml", environ={})


def test_nodes_are_private_by_default(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, environ={})
    assert (cfg.trust_mode, cfg.trust_vouches) == ("invite", "web")


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("listen = 5\n", "must be a string"),
        ("[network]\nlistne = 'x:1'\n", "unknown key"),
        ("[netwrk]\nlisten = 'x:1'\n", "unknown table"),
        ("nonsense = 1\n", "unknown key"),
        ("[membership]\nprobe_interval_ms = 'fast'\n", "must be"),
        ("[membership]\nprobe_interval_ms = 100\nprobe_timeout_ms = 200\n", "below"),
        ("[trust]\ntrust_mode = 'whatever'\n", "trust_mode"),
        ("[trust]\ntrust_vouches = 'everyone'\n", "trust_vouches"),
        ("[network]\nlisten = 'no-port'\n", "host:port"),
        ("[network]\nbootstrap = ['x:99999']\n", "port"),
        ("[limits]\nsend_queue_frames = 0\n", "> 0"),
        ("this is = = not toml", "config.toml"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, toml: str, match: str) -> None:
    (tmp_path / "config.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path, environ={})


def test_bad_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$HIVEMESH_SYNC_INTERVAL_MS"):
        load_config(tmp_path, environ={"HIVEMESH_SYNC_INTERVAL_MS": "soon"})
    with pytest.raises(ConfigError, match=r"\$HIVEMESH_MDNS"):
        load_config(tmp_path, environ={"HIVEMESH_MDNS": "maybe"})


def test_bootstrap_entries_with_and_without_address() -> None:
    from hivemesh.core.identity import Identity

    addr = Identity.from_seed(b"\x01" * 32).address
    got = bootstrap_targets(("10.0.0.1:7420", f"{addr}@10.0.0.2:1,10.0.0.3:2"))
    assert got == [(None, "10.0.0.1", 7420), (addr, "10.0.0.2", 1), (addr, "10.0.0.3", 2)]
    for bad in ("nothing", "hmbad@10.0.0.1:1", "10.0.0.1:0"):
        with pytest.raises(ConfigError):
            bootstrap_targets((bad,))


def test_parse_endpoint() -> None:
    assert parse_endpoint("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_endpoint("[::1]:7420") == ("::1", 7420)
    for bad in ("", ":1", "host", "host:x", "host:70000"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)
