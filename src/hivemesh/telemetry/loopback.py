"""A thin TCP transport for telemetry, for tests and single-host setups.

Theory of operation
-------------------
The real delivery path is a mesh direct message to ``metrics-collector``;
this module stands in for it where the mesh is not wanted (the fault tests,
the benchmark, a quick local setup). It is deliberately dumb: one request,
one response, both length-prefixed msgpack frames over TCP::

    request  = {"sender": "<address>", "payload": <batch bytes>}
    response = <the collector's ack dict>

The sender address is *self-declared* here: there is no authentication, so
this transport must only listen on loopback, and a ``trusted`` predicate
decides which declared senders the collector admits. Every read has a
deadline; a frame over the limit closes the connection.

``python -m hivemesh.telemetry.loopback collector|sender ...`` runs either
end as its own process (used by the fault tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hivemesh.core.codec import pack, unpack
from hivemesh.errors import (
    ConnectionClosed,
    DeadlineExceeded,
    DecodeError,
    FrameTooLarge,
    HivemeshError,
    RemoteProtocolError,
)
from hivemesh.telemetry.collector import Collector
from hivemesh.telemetry.schema import MAX_BATCH_BYTES

__all__ = ["TcpDeliver", "serve_collector"]

_LEN = struct.Struct(">I")
_MAX_FRAME = MAX_BATCH_BYTES + 4096


async def _read_frame(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    try:
        head = await asyncio.wait_for(reader.readexactly(4), timeout_s)
        (n,) = _LEN.unpack(head)
        if n > _MAX_FRAME:
            raise FrameTooLarge(f"frame of {n} bytes exceeds {_MAX_FRAME}")
        return await asyncio.wait_for(reader.readexactly(n), timeout_s)
    except asyncio.IncompleteReadError:
        raise ConnectionClosed("peer closed the connection") from None
    except TimeoutError:
        raise DeadlineExceeded(f"no frame within {timeout_s}s") from None


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


async def serve_collector(
    collector: Collector,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    trusted: Callable[[str], bool] = lambda _s: True,
    idle_timeout_s: float = 60.0,
) -> asyncio.Server:
    """Listen for batches and answer each with the collector's ack."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await _read_frame(reader, idle_timeout_s)
                try:
                    req = unpack(body, limit=_MAX_FRAME)
                    if not isinstance(req, dict) or set(req) != {"sender", "payload"}:
                        raise DecodeError("bad request envelope")
                    sender, payload = req["sender"], req["payload"]
                    if not isinstance(sender, str) or not isinstance(payload, bytes):
                        raise DecodeError("bad request field types")
                except HivemeshError as exc:
                    collector.counters[exc.code] += 1
                    ack: dict[str, Any] = {"ok": False, "error": exc.code}
                else:
                    ack = await collector.ingest(sender, payload, trusted(sender))
                writer.write(_frame(pack(ack)))
                await writer.drain()
        except RemoteProtocolError as exc:  # a bad frame: count it, drop the connection
            collector.counters[exc.code] += 1
        except (HivemeshError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # server shutting down; this is the connection task's outermost frame
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)


class TcpDeliver:
    """A ``deliver`` callable for :class:`~.sender.Sender` over the loopback transport."""

    def __init__(self, host: str, port: int, sender: str, *, timeout_s: float = 5.0) -> None:
        self.host, self.port, self.sender, self.timeout_s = host, port, sender, timeout_s
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def __call__(self, payload: bytes) -> Mapping[str, Any]:
        """Send one batch and return the ack; raises a TransportError on failure."""
        try:
            if self._conn is None:
                self._conn = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.timeout_s
                )
            reader, writer = self._conn
            writer.write(_frame(pack({"sender": self.sender, "payload": payload})))
            await asyncio.wait_for(writer.drain(), self.timeout_s)
            ack = unpack(await _read_frame(reader, self.timeout_s))
        except TimeoutError:
            self.close()
            raise DeadlineExceeded(f"collector did not answer in {self.timeout_s}s") from None
        except (OSError, HivemeshError) as exc:
            self.close()
            if isinstance(exc, HivemeshError):
                raise
            raise ConnectionClosed(f"{type(exc).__name__}: {exc}") from None
        if not isinstance(ack, dict):
            self.close()
            raise DecodeError("ack is not a map")
        return ack

    def close(self) -> None:
        """Drop the connection (the next call reconnects)."""
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None


# -- processes for the fault tests ------------------------------------------------


async def _run_collector(args: argparse.Namespace) -> int:
    from hivemesh.telemetry.store import MetricsStore

    store = MetricsStore(args.store)
    collector = Collector(store)
    trusted_set = set(args.trust.split(",")) if args.trust else None
    server = await serve_collector(
        collector,
        args.host,
        args.port,
        trusted=(lambda s: True) if trusted_set is None else trusted_set.__contains__,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = server.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    await stop.wait()
    server.close()
    await collector.drain()
    collector.close()
    store.close()
    print(f"STATS {collector.flushes} {collector.flushed_rows}", flush=True)
    return 0


async def _run_drain(args: argparse.Namespace) -> int:
    """Drain every ``*.spool`` in ``--dir`` concurrently (benchmark senders)."""
    import time
    from pathlib import Path

    from hivemesh.telemetry.sender import Sender
    from hivemesh.telemetry.spool import Spool

    spools = [Spool(p) for p in sorted(Path(args.dir).glob("*.spool"))]
    delivers = [TcpDeliver(args.host, args.port, sp.path.stem, timeout_s=30) for sp in spools]
    senders = [Sender(sp, d, batch_max=args.batch) for sp, d in zip(spools, delivers, strict=True)]
    print(f"READY {sum(sp.backlog for sp in spools)}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # "GO"
    t0 = time.perf_counter()
    ok = await asyncio.gather(*(s.flush(args.timeout) for s in senders))
    dt = time.perf_counter() - t0
    for d in delivers:
        d.close()
    for sp in spools:
        sp.close()
    print(f"DONE {dt:.6f} {int(all(ok))}", flush=True)
    return 0


async def _run_sender(args: argparse.Namespace) -> int:
    from hivemesh.telemetry.sender import Sender
    from hivemesh.telemetry.spool import Spool

    spool = Spool(args.spool)
    deliver = TcpDeliver(args.host, args.port, args.name, timeout_s=args.timeout)
    sender = Sender(spool, deliver, batch_max=args.batch, linger_s=0.01, max_backoff_s=0.5)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(sender.run(stop))
    print(f"READY {os.getpid()} {spool.last_seq}", flush=True)
    # Record until `total` records have been numbered; the seq doubles as the value, so the
    # test can check every stored row against what was recorded.
    while spool.last_seq < args.total and not stop.is_set():
        n = min(args.per_tick, args.total - spool.last_seq)
        first = spool.last_seq + 1
        spool.append_many(
            {"name": "test.counter", "kind": "counter", "value": float(first + i)} for i in range(n)
        )
        sender.notify()
        await asyncio.sleep(args.tick)
    while spool.backlog and not stop.is_set():
        await asyncio.sleep(0.02)
    stop.set()
    await task
    spool.close()
    print(f"DONE {spool.last_seq}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hivemesh.telemetry.loopback collector|sender``."""
    p = argparse.ArgumentParser(prog="hivemesh.telemetry.loopback")
    sub = p.add_subparsers(dest="role", required=True)
    c = sub.add_parser("collector")
    c.add_argument("--store", required=True)
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, default=0)
    c.add_argument("--trust", default="", help="comma-separated sender names (default: all)")
    s = sub.add_parser("sender")
    s.add_argument("--spool", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--total", type=int, default=1000)
    s.add_argument("--per-tick", type=int, default=20)
    s.add_argument("--tick", type=float, default=0.01)
    s.add_argument("--batch", type=int, default=200)
    s.add_argument("--timeout", type=float, default=1.0)
    d = sub.add_parser("drain")
    d.add_argument("--dir", required=True)
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--batch", type=int, default=1000)
    d.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    runner = {"collector": _run_collector, "sender": _run_sender, "drain": _run_drain}[args.role]
    return asyncio.run(runner(args))


if __name__ == "__main__":
    sys.exit(main())
