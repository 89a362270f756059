"""``hivemesh init``: create a data dir with an identity and a config file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit, emit_error
from hivemesh.errors import HivemeshError

_CONFIG_TEMPLATE = """\
# hivemesh node configuration. Flags and HIVEMESH_* environment variables
# override these values. Every key is optional.

[node]
# name = "metrics-collector"      # a human name claimed at startup
# log_level = "info"

[network]
# listen = "0.0.0.0:7420"
# advertise = "192.168.1.20:7420"  # the endpoint other nodes should dial
# bootstrap = ["192.168.1.10:7420"]

[membership]
# probe_interval_ms = 1000
# probe_timeout_ms = 500
# suspicion_mult = 4

[trust]
# trust_mode = "invite"            # private: only invited nodes (hivemesh invite/join);
#                                  # "open" admits any authenticated peer (a lab LAN)
# trust_vouches = "web"            # follow vouches of all members of our swarms;
#                                  # "direct": of nodes we vouched for; "none"

# MCP tool servers for `hivemesh agent`, in the desktop MCP client format:
# [mcp.mcpServers.web]
# command = "hivemesh"
# args = ["webtools"]
"""


def register(sub: Any) -> None:
    """Add the ``init`` subcommand."""
    p = sub.add_parser("init", help="create a node identity and data dir")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.stores.keyfile import load_or_create_identity
    from hivemesh.stores.private import made_private, secure_data_dir, write_private

    ddir = data_dir_of(args)
    try:
        existed = (ddir / "node.key").exists()
        loose = secure_data_dir(ddir)
        identity = load_or_create_identity(ddir)
    except HivemeshError as exc:
        return emit_error(args, exc)
    if loose:
        print(f"warning: {made_private(ddir, loose)}", file=sys.stderr)
    cfg = ddir / "config.toml"
    if not cfg.exists():
        write_private(cfg, _CONFIG_TEMPLATE.encode("utf-8"))
    result = {"address": identity.address, "data_dir": str(ddir), "created": not existed}
    emit(
        args,
        result,
        lambda r: (
            f"{'created' if r['created'] else 'existing'} node {r['address']}\n"
            f"data dir: {r['data_dir']}\nnext: hivemesh up --data-dir {r['data_dir']}"
        ),
    )
    return 0
