"""Reachability probes between lab hosts (the lab has no ``ping``): small
Python programs run inside the hosts over TCP and UDP, each with a deadline.

* :func:`tcp_listen` / :func:`udp_echo` start a server in a host (ended with the lab);
* :func:`tcp_reaches` / :func:`udp_reaches` say whether a host reaches one.
"""

from __future__ import annotations

import subprocess
import sys
import time

from hivemesh.netlab.lab import Host

__all__ = ["tcp_listen", "tcp_reaches", "udp_echo", "udp_punch", "udp_reaches"]

_TCP_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"ok"); c.close()
"""
_TCP_CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    c.settimeout(float(sys.argv[3])); sys.exit(0 if c.recv(2) == b"ok" else 1)
except OSError:
    sys.exit(1)
"""
_UDP_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2]))); print("ready", flush=True)
while True:
    data, addr = s.recvfrom(2048); s.sendto(data, addr)
"""
_UDP_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(float(sys.argv[3]) / 3)
for _ in range(3):
    s.sendto(b"probe", (sys.argv[1], int(sys.argv[2])))
    try:
        if s.recv(64) == b"probe": sys.exit(0)
    except OSError:
        pass
sys.exit(1)
"""

_UDP_PUNCH = """
import socket, sys, time
port, ip, peer_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prime_ttl, timeout = int(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port)); s.settimeout(0.05)
if prime_ttl:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, prime_ttl)
    for _ in range(3): s.sendto(b"prime", (ip, peer_port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 64)
    time.sleep(0.3)
deadline, heard, peer = time.monotonic() + timeout, 0, (ip, peer_port)
while time.monotonic() < deadline:
    s.sendto(b"ack" if heard else b"syn", peer)
    try:
        data, addr = s.recvfrom(64)
    except OSError:
        continue
    if addr[0] == ip and data in (b"syn", b"ack"):
        heard, peer = heard + 1, addr
        if data == b"ack" and heard > 1: s.sendto(b"ack", peer); sys.exit(0)
sys.exit(1)
"""


def _serve(host: Host, script: str, port: int, timeout_s: float) -> subprocess.Popen[bytes]:
    proc = host.popen(
        [sys.executable, "-c", script, "0.0.0.0", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = proc.stdout.readline()  # the server prints "ready" once bound
    if line.strip() != b"ready" or time.monotonic() > deadline:
        proc.kill()
        raise RuntimeError(f"probe server on {host.name}:{port} did not start")
    return proc


def tcp_listen(host: Host, port: int, *, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """A TCP server on ``host`` that answers ``ok`` to every connection."""
    return _serve(host, _TCP_SERVER, port, timeout_s)


def udp_echo(host: Host, port: int, *, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """A UDP server on ``host`` that echoes every datagram."""
    return _serve(host, _UDP_SERVER, port, timeout_s)


def tcp_reaches(src: Host, ip: str, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether ``src`` opens a TCP connection to ``ip:port`` and gets ``ok`` in time."""
    argv = [sys.executable, "-c", _TCP_CLIENT, ip, str(port), str(timeout_s)]
    return src.run(argv, timeout_s=timeout_s + 10.0, check=False).returncode == 0


def udp_reaches(src: Host, ip: str, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether a datagram from ``src`` to ``ip:port`` is echoed back in time."""
    argv = [sys.executable, "-c", _UDP_CLIENT, ip, str(port), str(timeout_s)]
    return src.run(argv, timeout_s=timeout_s + 10.0, check=False).returncode == 0


def udp_punch(
    src: Host,
    port: int,
    ip: str,
    peer_port: int,
    *,
    prime_ttl: int = 2,
    timeout_s: float = 3.0,
) -> subprocess.Popen[bytes]:
    """Start a UDP hole punch from ``src:port`` towards ``ip:peer_port`` (the
    peer's public endpoint): ``prime_ttl`` > 0 first sends three packets with
    that TTL to open ``src``'s own NAT mapping and waits 0.3 s, then both
    sides send until each heard the other (answering the port a packet came
    from: the peer's NAT may have mapped it to another). Exit status 0:
    punched; 1: not within ``timeout_s``. Start the two sides' punches
    together and wait for both."""
    argv = [sys.executable, "-c", _UDP_PUNCH, str(port), ip, str(peer_port)]
    argv += [str(prime_ttl), str(timeout_s)]
    return src.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
