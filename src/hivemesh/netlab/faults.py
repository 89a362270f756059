"""Faults in a lab: partitions, one-way cuts, loss, heal.

Every fault is a rule on the *receiving* host: an nftables table
``hmlab_fault`` in its namespace drops what arrives from the hosts it is cut
from (matched on the source address the packet carries when it arrives:
the sender's own address on the same segment, its NAT's address from
behind a NAT) and, with :meth:`Faults.loss`, a random share of everything.
The table is rewritten whole in one nftables transaction at each change, so
a fault starts and ends atomically for that host.

* :meth:`Faults.drop` -- one way: packets from ``src`` no longer reach ``dst``
  (asymmetric: ``dst`` still reaches ``src``);
* :meth:`Faults.cut` -- both ways;
* :meth:`Faults.isolate` -- one host from every other;
* :meth:`Faults.partition` -- groups that cannot reach each other; a host in
  no group still reaches all (a bridge node between two halves);
* :meth:`Faults.loss` -- drop ``percent`` of what a host receives;
* :meth:`Faults.heal` -- remove every fault.

Hosts behind one NAT share its address: cutting one of them from a host
outside cuts its LAN neighbours too (say so in a test that does it).
"""

from __future__ import annotations

from collections.abc import Iterable

from hivemesh.netlab.lab import Host, Lab

__all__ = ["Faults"]


def _source_ip(src: Host, dst: Host) -> str:
    """The source address a packet from ``src`` carries when it reaches ``dst``."""
    if src.behind is not None and src.behind is dst.behind:
        return src.ip
    return src.public_ip


class Faults:
    """The faults applied to one lab's hosts."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._drops: dict[str, set[str]] = {}  # dst name -> src names
        self._loss: dict[str, int] = {}

    def _render(self, dst: Host) -> None:
        sources = sorted(
            {_source_ip(self.lab.hosts[s], dst) for s in self._drops.get(dst.name, ())}
        )
        rules = []
        if sources:
            rules.append(f"ip saddr {{ {', '.join(sources)} }} drop")
        percent = self._loss.get(dst.name, 0)
        if percent == 100:
            rules.append("drop")
        elif percent:
            rules.append(f"numgen random mod 100 < {percent} drop")
        body = "".join(f"    {r}\n" for r in rules)
        dst.nft(
            "table ip hmlab_fault\n"
            "delete table ip hmlab_fault\n"
            "table ip hmlab_fault {\n"
            "  chain faults_in { type filter hook input priority filter - 10; policy accept;\n"
            f"{body}  }}\n"
            "}\n"
        )

    def drop(self, src: Host, dst: Host) -> None:
        """From now on nothing ``src`` sends reaches ``dst`` (one way)."""
        self._drops.setdefault(dst.name, set()).add(src.name)
        self._render(dst)

    def cut(self, a: Host, b: Host) -> None:
        """``a`` and ``b`` no longer reach each other."""
        self.drop(a, b)
        self.drop(b, a)

    def isolate(self, host: Host) -> None:
        """``host`` reaches no other host and none reaches it."""
        for other in self.lab.hosts.values():
            if other is not host:
                self.cut(host, other)

    def partition(self, *groups: Iterable[Host]) -> None:
        """No host of one group reaches a host of another; hosts in no group reach all."""
        sets = [list(g) for g in groups]
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                for a in left:
                    for b in right:
                        self.cut(a, b)

    def loss(self, host: Host, percent: int) -> None:
        """Drop ``percent`` (0..100) of the packets ``host`` receives, at random."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be within 0..100")
        self._loss[host.name] = percent
        self._render(host)

    def heal(self) -> None:
        """Remove every fault from every host."""
        touched = set(self._drops) | set(self._loss)
        self._drops.clear()
        self._loss.clear()
        for name in sorted(touched):
            self._render(self.lab.hosts[name])
