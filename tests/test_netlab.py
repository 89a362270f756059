"""The network lab itself (hivemesh.netlab): topology, NATs, faults, cleanup.

Needs root and Linux network namespaces; where they cannot be made every
test here skips with the reason (shown by ``-ra``). Run alone with
``pytest -m netns``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import netlabtest
from hivemesh.netlab import (
    Faults,
    Host,
    Lab,
    NetlabError,
    NetlabUnavailable,
    cleanup_stale,
    lab_namespaces,
)
from hivemesh.netlab.probe import tcp_listen, tcp_reaches, udp_echo, udp_punch, udp_reaches
from netlabtest import require_netlab

pytestmark = pytest.mark.netns
lab = netlabtest.lab  # the fixture

PORT = 7000


def _publics(lab: Lab, *names: str) -> list[Host]:
    hosts = [lab.add_host(n) for n in names]
    for h in hosts:
        tcp_listen(h, PORT)
    return hosts


def _reach(src: Host, dst: Host) -> bool:
    return tcp_reaches(src, dst.ip, PORT, timeout_s=0.5)


def test_public_hosts_reach_each_other_and_nat_hides_its_lan(lab: Lab) -> None:
    nat_a, nat_b = lab.add_nat("nat-a"), lab.add_nat("nat-b")
    a, b = lab.add_host("a", behind=nat_a), lab.add_host("b", behind=nat_b)
    (c,) = _publics(lab, "c")
    tcp_listen(b, PORT)
    udp_echo(c, PORT + 1)
    assert tcp_reaches(a, c.ip, PORT) and udp_reaches(a, c.ip, PORT + 1)
    assert a.public_ip == nat_a.wan_ip and c.public_ip == c.ip
    # nothing reaches a host behind a NAT unsolicited: not its LAN address, not its NAT's
    assert not tcp_reaches(c, b.ip, PORT, timeout_s=0.5)
    assert not tcp_reaches(a, nat_b.wan_ip, PORT, timeout_s=0.5)
    assert not tcp_reaches(a, b.ip, PORT, timeout_s=0.5)
    # the NAT tracked a's connection to c, rewritten to its WAN address
    assert nat_a.wan_ip in nat_a.mappings()


def test_hole_punching_needs_priming_and_never_passes_a_symmetric_nat(lab: Lab) -> None:
    """Port-preserving NATs: punched with TTL-2 primers; symmetric: never."""
    nat_a, nat_b = lab.add_nat("nat-a"), lab.add_nat("nat-b")
    sym_a, sym_b = lab.add_nat("sym-a", symmetric=True), lab.add_nat("sym-b", symmetric=True)
    a, b = lab.add_host("a", behind=nat_a), lab.add_host("b", behind=nat_b)
    sa, sb = lab.add_host("sa", behind=sym_a), lab.add_host("sb", behind=sym_b)

    def punch(x: Host, y: Host, port: int) -> bool:
        assert x.behind is not None and y.behind is not None
        px = udp_punch(x, port, y.behind.wan_ip, port + 1, timeout_s=2.0)
        py = udp_punch(y, port + 1, x.behind.wan_ip, port, timeout_s=2.0)
        return px.wait(timeout=15) == 0 and py.wait(timeout=15) == 0

    assert punch(a, b, 5000)
    assert not punch(sa, sb, 5100)


def test_conntrack_flush_forgets_the_mapping(lab: Lab) -> None:
    nat_a, nat_b = lab.add_nat("nat-a"), lab.add_nat("nat-b")
    a, b = lab.add_host("a", behind=nat_a), lab.add_host("b", behind=nat_b)
    pa = udp_punch(a, 5000, nat_b.wan_ip, 5001, timeout_s=2.0)
    pb = udp_punch(b, 5001, nat_a.wan_ip, 5000, timeout_s=2.0)
    assert pa.wait(timeout=15) == 0 and pb.wait(timeout=15) == 0
    assert "dport=5001" in nat_b.mappings()
    nat_b.flush_conntrack()
    assert "dport=5001" not in nat_b.mappings()


def test_cut_drop_partition_loss_and_heal(lab: Lab) -> None:
    a, b, c, d = _publics(lab, "a", "b", "c", "d")
    faults = Faults(lab)

    faults.isolate(a)
    assert not _reach(a, b) and not _reach(b, a) and _reach(b, c)
    faults.heal()
    assert _reach(a, b) and _reach(b, a)

    # minority / majority
    faults.partition([a], [b, c, d])
    assert not _reach(a, d) and _reach(b, d) and _reach(c, d)
    faults.heal()

    # a bridge node: c is in no group and reaches both halves
    faults.partition([a, b], [d])
    assert not _reach(a, d) and _reach(a, c) and _reach(c, d) and _reach(a, b)
    faults.heal()

    # one way: a's packets no longer reach d; d still reaches b
    faults.drop(a, d)
    assert not _reach(a, d) and _reach(d, b) and _reach(b, d)
    faults.heal()

    faults.loss(b, 100)
    assert not _reach(a, b)
    faults.loss(b, 0)
    assert _reach(a, b) and _reach(a, d)
    with pytest.raises(ValueError):
        faults.loss(b, 101)


def test_a_lab_removes_its_namespaces_and_processes_even_on_error() -> None:
    require_netlab()
    with pytest.raises(RuntimeError, match="boom"), Lab() as lab:
        h = lab.add_host("h")
        proc = h.popen([sys.executable, "-c", "import time; time.sleep(60)"])
        names = list(lab.namespaces)
        assert set(names) <= set(lab_namespaces())
        raise RuntimeError("boom")
    assert proc.poll() is not None
    assert not set(names) & set(lab_namespaces())
    with pytest.raises(NetlabError):
        lab.add_host("late")


def test_atexit_and_stale_cleanup(tmp_path: object) -> None:
    require_netlab()
    env = dict(os.environ)
    # exits with the lab open: the exit hook removes it
    script = (
        "from hivemesh.netlab import Lab; lab = Lab().__enter__(); lab.add_host('x');"
        " print(lab.prefix)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    prefix = out.stdout.strip()
    assert prefix and not [n for n in lab_namespaces() if n.startswith(prefix)]
    # killed outright: its namespaces stay until cleanup_stale, which spares live owners
    script = (
        "import time; from hivemesh.netlab import Lab; lab = Lab().__enter__(); lab.add_host('x');"
        " print(lab.prefix, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    with Lab() as mine:
        mine.add_host("keep")
        proc.kill()
        proc.wait(timeout=10)
        assert [n for n in lab_namespaces() if n.startswith(prefix)]
        gone = cleanup_stale()
        assert gone and all(n.startswith(prefix) for n in gone)
        assert set(mine.namespaces) <= set(lab_namespaces())
    assert not [n for n in lab_namespaces() if n.startswith(prefix)]


def test_without_root_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """As an unprivileged user the lab refuses with a reason a skip can print."""
    from hivemesh.netlab import _run

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_run, "_reason", [])
    with pytest.raises(NetlabUnavailable, match="need root"):
        Lab()
