"""Node configuration: defaults < ``config.toml`` < environment < flags.

One frozen :class:`Config` record holds every setting of a node daemon. It is
built by :func:`load_config` from four layers, later layers winning:

1. the defaults written on the dataclass fields below;
2. a TOML file (``<data_dir>/config.toml`` unless ``--config`` names one),
   grouped in tables that only serve as documentation::

       [node]
       name = "metrics-collector"
       [network]
       listen = "0.0.0.0:7420"
       bootstrap = ["10.0.0.5:7420"]
       [trust]
       trust_mode = "invite"        # private (default); "open" admits any peer
       [membership]
       probe_interval_ms = 1000     # SWIM: probe one member per interval
       suspicion_mult = 4           # suspect -> down after ~mult * interval
       [telemetry]
       collector = true             # run the metrics-collector on this node
       [telemetry.metrics_sinks.prometheus]   # mirror the collector's store
       port = 9464
       [mcp.mcpServers.web]         # MCP tool servers, desktop-client format
       command = "hivemesh"
       args = ["webtools"]

3. environment variables ``HIVEMESH_<FIELD>`` (``HIVEMESH_LISTEN``,
   ``HIVEMESH_BOOTSTRAP=a:1,b:2``, ``HIVEMESH_PROBE_INTERVAL_MS=200``, ...);
4. explicit overrides (command-line flags), passed as a mapping.

Telemetry sinks (``metrics_sinks``) are written as a TOML table of tables as
above, or anywhere as specs ``NAME[:key=value,key=value...]``: a TOML list
of specs, ``HIVEMESH_METRICS_SINKS="prometheus:port=9464;otlp:endpoint=http://h:4318"``
(specs separated by ``;``), or ``hivemesh up --sink SPEC`` (repeatable).

MCP servers for agents' tools (``mcp_servers``) use the format desktop MCP
clients use (:mod:`hivemesh.tools.spec`): the ``[mcp]`` table above, or
``HIVEMESH_MCP_SERVERS='{"mcpServers": {...}}'``.

Unknown keys, wrong types and out-of-range values raise
:class:`~hivemesh.errors.ConfigError` naming the layer they came from, so a
typo in a file never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemesh.core.dialer import UDP_PREFIX as UDP_PREFIX
from hivemesh.core.dialer import parse_endpoint as parse_endpoint
from hivemesh.errors import ConfigError
from hivemesh.tools.spec import MCPServerSpec, parse_mcp_config

__all__ = [
    "MAX_STUN_SERVERS",
    "UDP_PREFIX",
    "Config",
    "SinkSpecs",
    "bootstrap_targets",
    "load_config",
    "parse_endpoint",
]

#: At most this many ``stun`` servers (each is asked every minute).
MAX_STUN_SERVERS = 8

#: Telemetry sinks as ``((name, ((option, value), ...)), ...)`` (hashable, like Config).
SinkSpecs = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

_ENV_PREFIX = "HIVEMESH_"
_DEFAULT_DATA_DIR = Path("~/.hivemesh").expanduser()


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting of a node daemon. Units are in the names."""

    # [node]
    data_dir: Path = _DEFAULT_DATA_DIR
    name: str | None = None
    log_level: str = "info"
    # [network]
    listen: str = "0.0.0.0:7420"
    advertise: str | None = None
    bootstrap: tuple[str, ...] = ()
    mdns: bool = False
    mdns_interfaces: tuple[str, ...] = ("127.0.0.1",)
    dial_timeout_s: float = 5.0
    #: also listen on UDP (QUIC, same port as ``listen``); advertise it (``udp:host:port``)
    udp: bool = False
    #: relays to keep a reservation at and reach NATed peers through: ``address@host:port``
    relays: tuple[str, ...] = ()
    #: accept the relay role: forward end-to-end encrypted circuits for trusted peers
    relay_role: bool = False
    #: STUN servers (``host:port``) asked for our public UDP address from the
    #: QUIC socket; empty (the default): STUN is never used (docs/nat.md)
    stun: tuple[str, ...] = ()
    #: broker mode: ``nats://host:4222?swarm=NAME`` or ``redis://host:6379/0?swarm=NAME``
    #: carries every frame and the journal's log instead of peer links (docs/broker.md)
    mesh: str | None = None
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    # [membership]
    probe_interval_ms: int = 1000
    probe_timeout_ms: int = 500  # half the probe interval unless set
    suspicion_mult: int = 4
    # [replication]
    sync_interval_ms: int = 1000
    # batches received from peers and our own (durable at once in the store's
    # append log) are group-committed within this many ms, and the head
    # signatures of batches that came straight from their author are verified
    # then, one per run (0: verify and commit every batch before applying the
    # next, and commit our own appends before they are sent or acknowledged).
    # Each commit and verify stalls the node's loop (~0.3-0.6 ms on a busy
    # machine); 100 ms keeps that under 1% of its time
    commit_delay_ms: int = 100
    # [trust] "invite" (private, the default): only peers this node invited or
    #         was invited by, and those its swarms vouch for (core.views.trust);
    #         "open": any authenticated peer unless revoked (a trusted lab LAN)
    trust_mode: str = "invite"
    # whose vouches an invite-mode node follows into its swarms: "web" (every
    # member's, transitively), "direct" (of nodes it vouched for), "none"
    trust_vouches: str = "web"
    # [limits]
    send_queue_frames: int = 4096
    slow_peer_timeout_s: float = 10.0
    control_timeout_s: float = 10.0
    inbox_max: int = 10_000
    # [telemetry] (see hivemesh.telemetry.app)
    telemetry: bool = True
    collector: bool = False
    telemetry_timeout_s: float = 5.0
    telemetry_max_backoff_s: float = 5.0
    telemetry_heartbeat_s: float = 10.0
    metrics_senders: tuple[str, ...] = ()
    health_interval_s: float = 10.0
    #: sinks the collector mirrors its store to (see module docs and telemetry.sinks)
    metrics_sinks: SinkSpecs = ()
    # [leases] quorum voters (addresses); empty: members seen up at first use
    lease_voters: tuple[str, ...] = ()
    # [mcp] tool servers for agents ({"mcpServers": {...}}, see hivemesh.tools.spec)
    mcp_servers: tuple[MCPServerSpec, ...] = ()
    # record the node's Peer inputs and effects for a replay (hivemesh.core.trace):
    # tests and debugging only, memory grows with the run
    trace_peer: bool = False

    @property
    def key_path(self) -> Path:
        """The 0600 identity key file."""
        return self.data_dir / "identity.key"

    @property
    def store_path(self) -> Path:
        """The SQLite journal."""
        return self.data_dir / "store.db"

    @property
    def trust_path(self) -> Path:
        """The trust list (``trust.json``)."""
        return self.data_dir / "trust.json"

    @property
    def control_path(self) -> Path:
        """The 0600 unix control socket."""
        return self.data_dir / "ctl.sock"

    @property
    def config_path(self) -> Path:
        """The default TOML config file."""
        return self.data_dir / "config.toml"

    def sinks(self) -> dict[str, dict[str, str]]:
        """``metrics_sinks`` as the mapping :func:`hivemesh.telemetry.sinks.sinks_from_config`
        takes (option values are strings; the sinks convert them)."""
        return {name: dict(options) for name, options in self.metrics_sinks}

    def listen_endpoint(self) -> tuple[str, int]:
        """``listen`` parsed as ``(host, port)``."""
        return parse_endpoint(self.listen)


_SECTIONS: dict[str, tuple[str, ...]] = {
    "node": ("data_dir", "name", "log_level"),
    "network": (
        "listen",
        "advertise",
        "bootstrap",
        "mdns",
        "mdns_interfaces",
        "dial_timeout_s",
        "udp",
        "relays",
        "relay_role",
        "stun",
        "reconnect_min_s",
        "reconnect_max_s",
        "mesh",
    ),
    "membership": ("probe_interval_ms", "probe_timeout_ms", "suspicion_mult"),
    "replication": ("sync_interval_ms", "commit_delay_ms"),
    "trust": ("trust_mode", "trust_vouches"),
    "limits": ("send_queue_frames", "slow_peer_timeout_s", "control_timeout_s", "inbox_max"),
    "telemetry": (
        "telemetry",
        "collector",
        "telemetry_timeout_s",
        "telemetry_max_backoff_s",
        "telemetry_heartbeat_s",
        "metrics_senders",
        "health_interval_s",
        "metrics_sinks",
    ),
    "leases": ("lease_voters",),
}
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TRUST_MODES = ("open", "invite")
_TRUST_VOUCHES = ("web", "direct", "none")
_LOG_LEVELS = ("debug", "info", "warning", "error")


def bootstrap_targets(entries: tuple[str, ...]) -> list[tuple[str | None, str, int]]:
    """``(address or None, host, port)`` for each bootstrap entry.

    An entry is ``host:port`` (the address is learnt from the handshake) or
    ``ADDRESS@host:port[,host:port...]`` (the handshake must prove ADDRESS).
    """
    out: list[tuple[str | None, str, int]] = []
    for entry in entries:
        if "@" in entry:
            from hivemesh.discovery.bootstrap import parse_peer

            peer = parse_peer(entry)
            for ep in peer.endpoints:
                host, port = parse_endpoint(ep)
                out.append((peer.address, host, port))
        else:
            host, port = parse_endpoint(entry)
            if port == 0:
                raise ConfigError(f"bootstrap endpoint {entry!r} needs a port")
            out.append((None, host, port))
    return out


def _sink_spec(spec: str, origin: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    name, _, rest = spec.strip().partition(":")
    options: dict[str, str] = {}
    for part in rest.split(",") if rest.strip() else ():
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or key.strip() in options:
            raise ConfigError(f"{origin}: sink option {part!r:.60} must be key=value, once")
        options[key.strip()] = value.strip()
    if not name.strip():
        raise ConfigError(f"{origin}: sink spec {spec!r:.60} has no name")
    return name.strip(), tuple(sorted(options.items()))


def _option_text(v: Any, origin: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, int, float)):
        return str(v)
    raise ConfigError(f"{origin}: sink option values must be scalars, got {v!r:.60}")


def _parse_sinks(value: Any, origin: str) -> SinkSpecs:
    """``metrics_sinks`` from a spec string (``;``-separated), a list of specs or a table."""
    out: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    if isinstance(value, str):
        out = [_sink_spec(s, origin) for s in value.split(";") if s.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        out = [_sink_spec(s, origin) for s in value]
    elif isinstance(value, dict):
        for name, options in value.items():
            if not isinstance(options, dict):
                raise ConfigError(f"{origin}: metrics_sinks.{name} must be a table of options")
            opts = tuple(sorted((str(k), _option_text(v, origin)) for k, v in options.items()))
            out.append((str(name), opts))
    else:
        raise ConfigError(f"{origin}: metrics_sinks must be specs or a table: {value!r:.80}")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: a sink is named twice in metrics_sinks")
    return tuple(out)


def _coerce(name: str, value: Any, origin: str) -> Any:
    """Convert ``value`` for field ``name``; strings come from env or flags."""
    f = _FIELDS[name]
    kind = str(f.type)
    if name == "metrics_sinks":
        return _parse_sinks(value, origin)
    if name == "mcp_servers":
        if isinstance(value, tuple) and all(isinstance(v, MCPServerSpec) for v in value):
            return value
        return parse_mcp_config(value, origin)
    try:
        if name == "data_dir":
            return Path(str(value)).expanduser()
        if kind.startswith("tuple"):
            if isinstance(value, str):
                return tuple(s.strip() for s in value.split(",") if s.strip())
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise TypeError("a list of strings")
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise TypeError("a boolean")
        if kind == "int":
            if isinstance(value, bool):
                raise TypeError("an integer")
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise TypeError("a number")
            return float(value)
        if kind.startswith("str"):
            if value is None and "None" in kind:
                return None
            if not isinstance(value, str):
                raise TypeError("a string")
            return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{origin}: {name} must be {exc}: {value!r:.80}") from None
    raise ConfigError(f"{origin}: unsupported field {name}")  # pragma: no cover


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "mcp":
            out["mcp_servers"] = _coerce("mcp_servers", value, f"{path} [mcp]")
        elif isinstance(value, dict):
            allowed = _SECTIONS.get(key)
            if allowed is None:
                raise ConfigError(f"{path}: unknown table [{key}]")
            for k, v in value.items():
                if k not in allowed:
                    raise ConfigError(f"{path}: unknown key {k!r} in [{key}]")
                out[k] = _coerce(k, v, str(path))
        elif key in _FIELDS:
            out[key] = _coerce(key, value, str(path))
        else:
            raise ConfigError(f"{path}: unknown key {key!r}")
    return out


def _validate(cfg: Config) -> None:
    parse_endpoint(cfg.listen)
    if cfg.advertise is not None:
        parse_endpoint(cfg.advertise)
    bootstrap_targets(cfg.bootstrap)
    if len(cfg.stun) > MAX_STUN_SERVERS:
        raise ConfigError(f"stun lists more than {MAX_STUN_SERVERS} servers")
    for server in cfg.stun:
        if parse_endpoint(server)[1] == 0:
            raise ConfigError(f"stun server {server!r} needs a port (3478 is STUN's)")
    if cfg.mesh is not None:
        from hivemesh.mesh.engine import parse_mesh_url  # no I/O, no broker client

        parse_mesh_url(cfg.mesh)
    if cfg.trust_mode not in _TRUST_MODES:
        raise ConfigError(f"trust_mode must be one of {_TRUST_MODES}")
    if cfg.trust_vouches not in _TRUST_VOUCHES:
        raise ConfigError(f"trust_vouches must be one of {_TRUST_VOUCHES}")
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {_LOG_LEVELS}")
    positive = (
        "dial_timeout_s",
        "reconnect_min_s",
        "reconnect_max_s",
        "probe_interval_ms",
        "probe_timeout_ms",
        "suspicion_mult",
        "sync_interval_ms",
        "send_queue_frames",
        "slow_peer_timeout_s",
        "control_timeout_s",
        "inbox_max",
        "telemetry_timeout_s",
        "telemetry_max_backoff_s",
        "telemetry_heartbeat_s",
        "health_interval_s",
    )
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be > 0")
    if not 0 <= cfg.commit_delay_ms <= 1000:
        raise ConfigError("commit_delay_ms must be within 0..1000")
    if cfg.probe_timeout_ms >= cfg.probe_interval_ms:
        raise ConfigError("probe_timeout_ms must be below probe_interval_ms")
    if cfg.metrics_sinks:
        from hivemesh.telemetry.sinks import check_sink_config  # names and options, no I/O

        check_sink_config(cfg.sinks())


def load_config(
    data_dir: str | Path | None = None,
    *,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build a :class:`Config` from defaults, TOML, environment and overrides.

    ``overrides`` holds flag values; ``None`` values mean "flag not given".
    The data dir itself may come from the argument, ``HIVEMESH_DATA_DIR`` or
    the default, and decides where ``config.toml`` is looked up.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    env_values: dict[str, Any] = {}
    for key, raw in sorted(env.items()):
        if not key.startswith(_ENV_PREFIX):
            continue
        name = key[len(_ENV_PREFIX) :].lower()
        if name in _FIELDS:
            env_values[name] = _coerce(name, raw, f"${key}")
    flag_values = {
        k: _coerce(k, v, f"--{k.replace('_', '-')}")
        for k, v in (overrides or {}).items()
        if v is not None
    }
    for k in flag_values:
        if k not in _FIELDS:  # pragma: no cover - programming error
            raise ConfigError(f"unknown override {k}")
    if data_dir is not None:
        base = Path(data_dir).expanduser()
    elif "data_dir" in env_values:
        base = env_values["data_dir"]
    else:
        base = _DEFAULT_DATA_DIR
    path = Path(config_file).expanduser() if config_file else base / "config.toml"
    if path.exists():
        values.update(_from_toml(path))
    elif config_file:
        raise ConfigError(f"config file not found: {path}")
    values.update(env_values)
    values.update(flag_values)
    if "probe_interval_ms" in values and "probe_timeout_ms" not in values:
        values["probe_timeout_ms"] = max(1, values["probe_interval_ms"] // 2)
    values["data_dir"] = base
    if values.get("mesh") is not None:  # broker mode dials no endpoints (docs/broker.md)
        values["bootstrap"] = ()
    cfg = Config(**values)
    _validate(cfg)
    return cfg
