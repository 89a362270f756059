"""MCP server configuration in the format desktop MCP clients use.

The same document works as a JSON file (``hivemesh agent --mcp FILE``), as the
``[mcp]`` table of a node's ``config.toml``, or inline JSON::

    {"mcpServers": {
        "web":    {"command": "hivemesh", "args": ["webtools"], "env": {"X": "1"}},
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "..."}}
    }}

    [mcp.mcpServers.web]          # the same in TOML
    command = "hivemesh"
    args = ["webtools"]

A server has either ``command`` (stdio: ``args``, ``env``, ``cwd``) or ``url``
(streamable HTTP: ``headers``); ``type`` may say which (``stdio``, ``http``,
``streamable-http``) and must agree. hivemesh also reads ``disabled`` (skip
it), ``allow`` (only these tools) and ``timeout_s`` (deadline of connecting
and of each call). Any other key is a :class:`~hivemesh.errors.ConfigError`
naming it, so a typo never silently changes what runs. Parsing does no I/O
and imports nothing heavy.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemesh.errors import ConfigError

__all__ = ["MCPServerSpec", "load_mcp_config", "merge_specs", "parse_mcp_config"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_KEYS = frozenset(
    {"command", "args", "env", "cwd", "url", "headers", "type", "disabled", "allow", "timeout_s"}
)
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}


@dataclass(frozen=True, slots=True)
class MCPServerSpec:
    """One configured MCP server (hashable, like :class:`hivemesh.Config`)."""

    name: str
    transport: str  # "stdio" or "http"
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    allow: tuple[str, ...] | None = None
    timeout_s: float = 30.0
    disabled: bool = False


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what} must be a list of strings")
    return tuple(value)


def _mapping(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{what} must be a table of strings")
    return tuple(sorted(value.items()))


def _server(name: str, entry: Any, origin: str) -> MCPServerSpec:
    where = f"{origin}: mcpServers.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: server names are 1-64 of A-Z a-z 0-9 _ -")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
    has_cmd, has_url = "command" in entry, "url" in entry
    if has_cmd == has_url:
        raise ConfigError(f"{where}: give exactly one of command (stdio) or url (HTTP)")
    transport = "stdio" if has_cmd else "http"
    if "type" in entry and _TYPES.get(entry["type"]) != transport:
        raise ConfigError(f"{where}: type {entry['type']!r} does not match its {transport} keys")
    timeout = entry.get("timeout_s", 30.0)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= 3600
    ):
        raise ConfigError(f"{where}: timeout_s must be a number in (0, 3600]")
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ConfigError(f"{where}: disabled must be true or false")
    allow = _strings(entry["allow"], f"{where}.allow") if "allow" in entry else None
    if has_cmd:
        command = entry["command"]
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"{where}: command must be a non-empty string")
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ConfigError(f"{where}: cwd must be a string")
        if "headers" in entry:
            raise ConfigError(f"{where}: headers are for url servers")
        return MCPServerSpec(
            name,
            "stdio",
            command=command,
            args=_strings(entry.get("args", []), f"{where}.args"),
            env=_mapping(entry.get("env", {}), f"{where}.env"),
            cwd=cwd,
            allow=allow,
            timeout_s=float(timeout),
            disabled=disabled,
        )
    url = entry["url"]
    if not isinstance(url, str) or not re.match(r"https?://[^\s/]+", url):
        raise ConfigError(f"{where}: url must be an http(s) URL")
    for key in ("args", "env", "cwd"):
        if key in entry:
            raise ConfigError(f"{where}: {key} is for command servers")
    return MCPServerSpec(
        name,
        "http",
        url=url,
        headers=_mapping(entry.get("headers", {}), f"{where}.headers"),
        allow=allow,
        timeout_s=float(timeout),
        disabled=disabled,
    )


def parse_mcp_config(doc: Any, origin: str = "mcp config") -> tuple[MCPServerSpec, ...]:
    """The servers of a desktop-format document (``{"mcpServers": {...}}``),
    sorted by name; JSON text is accepted too."""
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except ValueError as exc:
            raise ConfigError(f"{origin}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - {"mcpServers"}:
        raise ConfigError(f'{origin}: expected {{"mcpServers": {{...}}}}')
    servers = doc.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConfigError(f"{origin}: mcpServers must be a table")
    return tuple(_server(name, servers[name], origin) for name in sorted(servers))


def load_mcp_config(path: str | Path) -> tuple[MCPServerSpec, ...]:
    """The servers in a JSON file (desktop format) or a TOML file (its ``[mcp]``
    table, or the document itself)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read MCP config {p}: {exc}") from None
    if p.suffix == ".toml":
        try:
            doc: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: {exc}") from None
        doc = doc.get("mcp", doc)
    else:
        doc = text
    return parse_mcp_config(doc, str(p))


def merge_specs(*layers: tuple[MCPServerSpec, ...]) -> tuple[MCPServerSpec, ...]:
    """Later layers replace earlier servers of the same name; disabled ones drop out."""
    merged: dict[str, MCPServerSpec] = {}
    for layer in layers:
        for spec in layer:
            merged[spec.name] = spec
    return tuple(s for _, s in sorted(merged.items()) if not s.disabled)
