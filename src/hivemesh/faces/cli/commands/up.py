"""``hivemesh up``: run a node daemon in the foreground.

Stops cleanly on SIGINT or SIGTERM (channels closed, store flushed, control
socket removed); a second signal during the shutdown exits at once. With
``--json`` it prints one line ``{"address", "listen", "control", "own_feed"}``
when the node is ready (``own_feed``: ``writable``, or ``recovering`` /
``diverged`` while it refuses writes, see ``hivemesh feed status``), then
only logs (on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from hivemesh.client.cli import add_common, emit_error
from hivemesh.config import load_config
from hivemesh.errors import HivemeshError


def register(sub: Any) -> None:
    """Add the ``up`` subcommand."""
    p = sub.add_parser("up", help="run a node in the foreground")
    add_common(p)
    p.add_argument("--config", help="TOML config file (default <data-dir>/config.toml)")
    p.add_argument("--listen", help="host:port to accept peers on (port 0 picks one)")
    p.add_argument("--advertise", help="host:port other nodes should dial")
    p.add_argument(
        "--bootstrap",
        action="append",
        help="[address@]host:port of a node to join through (repeatable)",
    )
    p.add_argument(
        "--mesh",
        metavar="URL",
        help="broker mode: nats://host:4222?swarm=NAME or redis://host:6379/0?swarm=NAME "
        "carries the swarm instead of peer links (docs/broker.md)",
    )
    p.add_argument("--name", help="claim this name at startup")
    p.add_argument(
        "--mdns", action="store_true", default=None, help="find peers on the LAN with mDNS"
    )
    p.add_argument(
        "--mdns-interface",
        action="append",
        help="IPv4 address of an interface for mDNS (repeatable; default 127.0.0.1)",
    )
    p.add_argument(
        "--collector",
        action="store_true",
        default=None,
        help="run the telemetry collector here (claims the name metrics-collector)",
    )
    p.add_argument(
        "--sink",
        action="append",
        metavar="NAME[:key=value,...]",
        help="with --collector: mirror metrics to a sink, e.g. prometheus:port=9464 (repeatable)",
    )
    p.add_argument("--trust-mode", choices=["open", "invite"])
    p.add_argument(
        "--trust-vouches",
        choices=["web", "direct", "none"],
        help="whose vouches to follow into this node's swarms (default web)",
    )
    p.add_argument("--probe-interval-ms", type=int)
    p.add_argument("--probe-timeout-ms", type=int)
    p.add_argument("--suspicion-mult", type=int)
    p.add_argument("--sync-interval-ms", type=int)
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    overrides = {
        "listen": args.listen,
        "advertise": args.advertise,
        "bootstrap": tuple(args.bootstrap) if args.bootstrap else None,
        "name": args.name,
        "mesh": args.mesh,
        "mdns": args.mdns,
        "mdns_interfaces": tuple(args.mdns_interface) if args.mdns_interface else None,
        "collector": args.collector,
        "metrics_sinks": tuple(args.sink) if args.sink else None,
        "trust_mode": args.trust_mode,
        "trust_vouches": args.trust_vouches,
        "probe_interval_ms": args.probe_interval_ms,
        "probe_timeout_ms": args.probe_timeout_ms,
        "suspicion_mult": args.suspicion_mult,
        "sync_interval_ms": args.sync_interval_ms,
        "log_level": args.log_level,
    }
    try:
        cfg = load_config(args.data_dir, config_file=args.config, overrides=overrides)
    except HivemeshError as exc:
        return emit_error(args, exc)
    logging.basicConfig(
        level=cfg.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(_serve(cfg, args.json))
    except HivemeshError as exc:
        return emit_error(args, exc)


async def _serve(cfg: Any, as_json: bool) -> int:
    from hivemesh.runtime.daemon import Daemon

    daemon = Daemon(cfg)
    await daemon.start()
    loop = asyncio.get_running_loop()
    signals = [0]

    def on_signal() -> None:
        signals[0] += 1
        if signals[0] == 1:
            daemon.request_stop()
        else:  # a second signal while stopping: leave now (appends are already durable)
            logging.getLogger("hivemesh").warning("second signal: exiting without cleanup")
            os._exit(1)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    gate = daemon.node.feed_gate
    ready = {
        "address": daemon.address,
        "listen": f"{cfg.listen_endpoint()[0]}:{daemon.listen_port}",
        "control": str(cfg.control_path),
        "own_feed": gate.state.value,
    }
    if as_json:
        print(json.dumps(ready, sort_keys=True), flush=True)
    else:
        print(
            f"node {ready['address']} up on {ready['listen']} (Ctrl-C to stop)",
            flush=True,
        )
        if not gate.writable:  # loud: the node takes no writes until its feed is whole
            print(f"WARNING: writes refused until recovered: {gate.reason()}", flush=True)
    await daemon.run_until_stopped()
    return 0
