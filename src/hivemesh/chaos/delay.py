"""Delay and reorder the packets a host receives, in user space (NFQUEUE).

This kernel has no netem, so a chaos run delays packets the way the issue
suggests: an iptables ``NFQUEUE`` rule in the host's namespace sends what arrives from
the lab's segment to an NFQUEUE, and this program, started *inside* that
namespace, holds each packet for ``delay_ms`` plus a random share of
``jitter_ms`` before accepting it (so packets also overtake each other).
One thread, one ``select`` loop: packets in, due packets out. Bounded: past
``max_held`` packets held, a new packet is accepted at once (counted).
The rule carries ``bypass``: if this program dies, packets flow undelayed.

Run as ``python -m hivemesh.chaos.delay --queue N --delay-ms D --jitter-ms J
--seed S`` (the cluster does it, :meth:`hivemesh.chaos.hosts.ChaosCluster.delay`);
it exits on SIGTERM or after ``--max-s``, accepting everything it still holds.
Needs the ``netfilterqueue`` package (and root).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import select
import signal
import socket
import sys
import time
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the delay loop (module docs); 0 on a clean stop."""
    p = argparse.ArgumentParser(prog="python -m hivemesh.chaos.delay")
    p.add_argument("--queue", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=50.0)
    p.add_argument("--jitter-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-held", type=int, default=5000)
    p.add_argument("--max-s", type=float, default=600.0)
    args = p.parse_args(argv)

    from netfilterqueue import NetfilterQueue

    rnd = random.Random(f"{args.seed}/delay/{args.queue}")
    held: list[tuple[float, int, Any]] = []
    order = itertools.count()
    stats = {"delayed": 0, "overflow": 0}
    stop = [False]

    def on_packet(pkt: Any) -> None:
        if len(held) >= args.max_held:
            stats["overflow"] += 1
            pkt.accept()
            return
        due = time.monotonic() + (args.delay_ms + rnd.uniform(0, args.jitter_ms)) / 1000
        heapq.heappush(held, (due, next(order), pkt))
        stats["delayed"] += 1

    def on_term(*_: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    nfq = NetfilterQueue()
    nfq.bind(args.queue, on_packet, max_len=args.max_held * 2)
    sock = socket.fromfd(nfq.get_fd(), socket.AF_UNIX, socket.SOCK_STREAM)
    end = time.monotonic() + args.max_s
    print("ready", flush=True)
    try:
        while not stop[0] and time.monotonic() < end:
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
            wait = max(0.0, min(0.2, held[0][0] - now)) if held else 0.2
            readable, _, _ = select.select([sock], [], [], wait)
            if readable:
                nfq.run(block=False)
    finally:
        while held:
            heapq.heappop(held)[2].accept()
        nfq.unbind()
        sock.close()
    print(f"delayed {stats['delayed']} overflow {stats['overflow']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
