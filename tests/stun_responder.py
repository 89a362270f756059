"""A minimal RFC 5389 Binding responder for the netlab tests
(``python tests/stun_responder.py --port 3478``), written apart from
hivemesh's own STUN code so the two check each other.

It answers every Binding request with a Binding success carrying
XOR-MAPPED-ADDRESS (the request's source address) and a SOFTWARE
attribute, prints ``{"saw": "ip:port"}`` per request and
``{"ready": true, "port": N}`` once bound (``--port 0`` picks one). With
``--noise`` it first sends, to the same source, a datagram with the magic
cookie but broken framing and an answer to another transaction (the client
must count both and keep waiting). It ends at
``--deadline`` seconds or when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time

COOKIE = 0x2112A442


def answer(txid: bytes, host: str, port: int) -> bytes:
    """A Binding success (0x0101) for ``txid`` mapping to ``host:port`` (IPv4)."""
    ip = struct.unpack("!I", socket.inet_aton(host))[0]
    xma = struct.pack("!HHBBHI", 0x0020, 8, 0, 1, port ^ (COOKIE >> 16), ip ^ COOKIE)
    software = struct.pack("!HH", 0x8022, 4) + b"test"
    body = software + xma
    return struct.pack("!HHI", 0x0101, len(body), COOKIE) + txid + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=3478)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--noise", action="store_true")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.host, args.port))
    print(json.dumps({"ready": True, "port": sock.getsockname()[1]}), flush=True)
    end = time.monotonic() + args.deadline
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([sock, sys.stdin], [], [], left)
        if sys.stdin in ready and not sys.stdin.readline():
            break
        if sock not in ready:
            continue
        data, (host, port) = sock.recvfrom(2048)
        if len(data) < 20 or data[:2] != b"\x00\x01" or data[4:8] != struct.pack("!I", COOKIE):
            continue  # not a Binding request
        txid = data[8:20]
        if args.noise:
            sock.sendto(struct.pack("!HHI", 0x0101, 3, COOKIE) + txid + b"abc", (host, port))
            sock.sendto(answer(bytes(12), "192.0.2.66", 6666), (host, port))
        sock.sendto(answer(txid, host, port), (host, port))
        print(json.dumps({"saw": f"{host}:{port}"}), flush=True)
    sock.close()


if __name__ == "__main__":
    main()
