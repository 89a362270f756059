"""A lab of network namespaces: hosts, one public segment, NAT routers.

Theory of operation. A :class:`Lab` is a context manager; inside it::

    with Lab() as lab:
        nat_a = lab.add_nat("nat-a")                   # MASQUERADE, port preserving
        nat_b = lab.add_nat("nat-b", symmetric=True)   # --random-fully: a new port per flow
        a = lab.add_host("a", behind=nat_a)
        b = lab.add_host("b", behind=nat_b)
        c = lab.add_host("c")                          # on the public segment
        proc = c.popen(["python", "-m", "http.server", "--bind", c.ip, "8000"])
        a.run(["ping", "-c1", c.ip])

Layout (every box a namespace of its own, named ``hmlab-<pid>-<seq>-<name>``)::

    [a]--lan--[nat-a]--wan--+
                            [br]--br0--+--[c]    public segment 198.18.0.0/24:
    [b]--lan--[nat-b]--wan--+          +--[d]    a Linux bridge in the namespace "br"

* Addresses come from 198.18.0.0/15, the range reserved for network
  benchmarks (RFC 2544), and exist only inside the lab's namespaces: the
  public segment is 198.18.0.0/24 (``br`` is .1), the LAN behind the n-th
  NAT is 198.19.n.0/24 with the router at .1. No route leads out of the lab.
* ``br`` is also the internet's router: the n-th NAT's WAN is a routed
  link 198.18.(100+n).0/24 (``br`` .1, the NAT .2), so a packet between two
  NATs crosses one router. A packet sent from behind a NAT with TTL 2
  opens its own NAT's mapping and dies in ``br`` before the far NAT sees
  it: the priming that hole punching through port-preserving NATs needs
  (with a flat segment the primer reaches the far NAT, whose conntrack
  entry then forces the far side onto another port).
* A NAT router forwards LAN to WAN and masquerades it (nftables ``nat``
  table); from the WAN it forwards only replies of tracked connections, so
  a host behind it cannot be reached unsolicited. ``symmetric=True`` adds
  ``fully-random``: every new flow gets a random port (a symmetric NAT, the
  one hole punching cannot pass).
* A host on the public segment reaches every other public host and every
  router's WAN address; a host behind a NAT reaches the public segment
  through its router (default route).

Faults (partitions, loss) are in :mod:`hivemesh.netlab.faults`.

Cleanup: the lab ends the processes it started and deletes its namespaces
when the ``with`` block ends, on any exception, and at interpreter exit
(:mod:`hivemesh.netlab.cleanup`); ``python -m hivemesh.netlab cleanup``
removes the leftovers of crashed owners.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from hivemesh.netlab._run import run, unavailable_reason
from hivemesh.netlab.cleanup import PREFIX, delete_namespace, on_exit
from hivemesh.netlab.errors import NetlabError, NetlabUnavailable

__all__ = ["PUBLIC_NET", "Host", "Lab", "Nat"]

#: The public segment's network.
PUBLIC_NET = "198.18.0.0/24"

_seq = itertools.count(1)


@dataclass
class Host:
    """One host: a namespace with ``eth0`` at ``ip``.

    ``behind`` is the NAT it sits behind (``None``: on the public segment);
    ``public_ip`` is the address others see it from (its own, or its NAT's).
    """

    lab: Lab
    name: str
    namespace: str
    ip: str
    behind: Nat | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def public_ip(self) -> str:
        """The source address its packets carry on the public segment."""
        return self.behind.wan_ip if self.behind is not None else self.ip

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 10.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the host and wait for it (at most ``timeout_s``)."""
        return run(self.argv(argv), timeout_s=timeout_s, check=check)

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        **kwargs: object,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the host; the lab ends it when it closes.

        ``env`` defaults to this process's environment (``PYTHONPATH`` included).
        Other keyword arguments go to :class:`subprocess.Popen`.
        """
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            self.argv(argv), env=dict(env if env is not None else os.environ), **kwargs
        )
        self.procs.append(proc)
        return proc

    def nft(self, script: str) -> None:
        """Load an nftables ``script`` inside the host."""
        run(self.argv(["nft", "-f", "-"]), stdin=script, timeout_s=10.0)


@dataclass
class Nat(Host):
    """A NAT router: ``ip`` is its WAN address, ``lan_ip`` its LAN side."""

    lan_ip: str = ""
    lan_net: str = ""
    symmetric: bool = False
    hosts: list[Host] = field(default_factory=list)

    @property
    def wan_ip(self) -> str:
        """The router's address on the public segment."""
        return self.ip

    def flush_conntrack(self) -> None:
        """Forget every connection the router tracks: its NAT mappings go with them."""
        self.run(["conntrack", "-F"], check=False)

    def mappings(self) -> str:
        """The router's tracked connections (``conntrack -L``), for diagnosis."""
        return self.run(["conntrack", "-L"], check=False).stdout


class Lab:
    """Network namespaces for one test or campaign; see the module doc."""

    def __init__(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise NetlabUnavailable(reason)
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_seq)}-"
        self.hosts: dict[str, Host] = {}
        self.namespaces: list[str] = []
        self._links = itertools.count(1)
        self._public_ips = itertools.count(2)  # .1 is br
        self._lans = itertools.count(1)
        self._bridge = ""
        self._closed = False

    # -- lifecycle -------------------------------------------------------

    def __enter__(self) -> Lab:
        on_exit(id(self), self.close)
        try:
            self._bridge = self._namespace("br")
            self._ip(self._bridge, "link", "add", "br0", "type", "bridge")
            self._ip(self._bridge, "link", "set", "br0", "up")
            self._ip(self._bridge, "addr", "add", "198.18.0.1/24", "dev", "br0")
            self._forwarding(self._bridge)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """End every process the lab started and delete its namespaces (idempotent)."""
        if self._closed:
            return
        self._closed = True
        on_exit(id(self), None)
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in host.procs:
                try:
                    proc.wait(timeout=3.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=3.0)
        for name in reversed(self.namespaces):
            delete_namespace(name)
        self.namespaces.clear()

    # -- building --------------------------------------------------------

    def _namespace(self, name: str) -> str:
        if self._closed:
            raise NetlabError("the lab is closed")
        ns = self.prefix + name
        run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        self._ip(ns, "link", "set", "lo", "up")
        return ns

    @staticmethod
    def _ip(ns: str, *args: str) -> None:
        run(["ip", "-n", ns, *args])

    def _veth(self, ns: str, ifname: str, peer_ns: str, master: str | None) -> str:
        """A veth pair: ``ifname`` in ``ns``, its peer in ``peer_ns`` (enslaved to
        ``master`` when given); returns the peer's name."""
        peer = f"v{next(self._links)}"
        self._ip(ns, "link", "add", ifname, "type", "veth", "peer", "name", peer, "netns", peer_ns)
        if master is not None:
            self._ip(peer_ns, "link", "set", peer, "master", master)
        self._ip(peer_ns, "link", "set", peer, "up")
        self._ip(ns, "link", "set", ifname, "up")
        return peer

    @staticmethod
    def _forwarding(ns: str) -> None:
        run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])

    def _check_name(self, name: str) -> None:
        if name in self.hosts or name == "br" or not name.replace("-", "").isalnum():
            raise NetlabError(f"host name {name!r} is taken or not [a-z0-9-]")

    def add_host(self, name: str, *, behind: Nat | None = None) -> Host:
        """A host on the public segment, or behind the NAT router ``behind``."""
        self._check_name(name)
        ns = self._namespace(name)
        if behind is None:
            ip = f"198.18.0.{next(self._public_ips)}"
            self._veth(ns, "eth0", self._bridge, "br0")
            self._ip(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            self._ip(ns, "route", "add", "default", "via", "198.18.0.1")
        else:
            ip = behind.lan_ip.rsplit(".", 1)[0] + f".{len(behind.hosts) + 2}"
            self._veth(ns, "eth0", behind.namespace, "lan")
            self._ip(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            self._ip(ns, "route", "add", "default", "via", behind.lan_ip)
        host = Host(self, name, ns, ip, behind)
        if behind is not None:
            behind.hosts.append(host)
        self.hosts[name] = host
        return host

    def add_nat(self, name: str, *, symmetric: bool = False) -> Nat:
        """A NAT router on the public segment with an empty LAN behind it."""
        self._check_name(name)
        ns = self._namespace(name)
        n = next(self._lans)
        wan, lan_ip, lan_net = f"198.18.{100 + n}.2", f"198.19.{n}.1", f"198.19.{n}.0/24"
        peer = self._veth(ns, "wan", self._bridge, None)
        self._ip(self._bridge, "addr", "add", f"198.18.{100 + n}.1/24", "dev", peer)
        self._ip(ns, "addr", "add", f"{wan}/24", "dev", "wan")
        self._ip(ns, "route", "add", "default", "via", f"198.18.{100 + n}.1")
        self._ip(ns, "link", "add", "lan", "type", "bridge")
        self._ip(ns, "link", "set", "lan", "up")
        self._ip(ns, "addr", "add", f"{lan_ip}/24", "dev", "lan")
        self._forwarding(ns)
        nat = Nat(self, name, ns, wan, None, lan_ip=lan_ip, lan_net=lan_net, symmetric=symmetric)
        flags = " fully-random" if symmetric else ""
        nat.nft(
            "table ip hmlab_nat {\n"
            "  chain snat_wan { type nat hook postrouting priority srcnat;"
            f' oifname "wan" masquerade{flags}; }}\n'
            "  chain lanwan { type filter hook forward priority filter; policy drop;\n"
            "    ct state established,related accept\n"
            '    iifname "lan" oifname "wan" accept\n'
            "  }\n"
            "}\n"
        )
        self.hosts[name] = nat
        return nat

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        return self.hosts[name]
