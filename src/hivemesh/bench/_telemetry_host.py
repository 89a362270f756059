"""Several full node daemons in one OS process (``hivemesh bench telemetry --per-process``).

``python -m hivemesh.bench._telemetry_host --listen 127.0.0.1:0 --bootstrap EP DIR...``
starts one :class:`~hivemesh.runtime.daemon.Daemon` per data dir on one
asyncio loop. Each is a whole node, exactly as ``hivemesh up`` runs it: its
own identity key, journal, spool, listening socket, control socket and Noise
channels; they only share the interpreter (so 50 sender nodes on a 2-core
machine are not 50 interpreters fighting over the cores). Prints one JSON
line per node when it is ready (``{"data_dir", "address", "listen"}``), then
runs until SIGTERM/SIGINT, when every node stops cleanly.

Configuration comes from each data dir and the environment (``HIVEMESH_*``),
as for ``hivemesh up``. A benchmark harness, not a deployment mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

__all__ = ["main"]


async def _serve(dirs: list[str], listen: str, bootstrap: list[str]) -> int:
    from hivemesh.config import load_config
    from hivemesh.runtime.daemon import Daemon

    daemons: list[Any] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for d in dirs:
            overrides = {"listen": listen, "bootstrap": tuple(bootstrap) or None}
            cfg = load_config(d, overrides=overrides)
            daemon = Daemon(cfg)
            await daemon.start()
            daemons.append(daemon)
            ready = {
                "data_dir": d,
                "address": daemon.address,
                "listen": f"{cfg.listen_endpoint()[0]}:{daemon.listen_port}",
            }
            print(json.dumps(ready, sort_keys=True), flush=True)
        await stop.wait()
    finally:
        for daemon in reversed(daemons):
            await daemon.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the host (see module docs)."""
    p = argparse.ArgumentParser(prog="python -m hivemesh.bench._telemetry_host")
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("dirs", nargs="+")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(_serve(args.dirs, args.listen, args.bootstrap))


if __name__ == "__main__":
    sys.exit(main())
