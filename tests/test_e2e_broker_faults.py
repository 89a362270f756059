"""Broker mode under faults, against a nats-server (or redis-server) of the test's own.

Each test starts its own ``nats-server -js`` on a free loopback port with its
own store dir (the shared server on 4222 is never touched), runs real
``hivemesh up --mesh`` processes on it and then: restarts the server
mid-run; cuts one node off the server and lets it back; purges the stream;
runs a stream whose retention keeps only a few entries; publishes a tampered
batch and a batch under another author's subject straight into the stream.
In each, nothing acknowledged is lost (every write a node acknowledged is
on every node at the end) and the views converge (equal version vectors).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.core.event import decode_event, encode_event, event_hash
from hivemesh.core.feed import head_message
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import Identity, public_key_of

pytestmark = pytest.mark.broker

NATS_SERVER = shutil.which("nats-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnNats:
    """A nats-server with JetStream on a free loopback port and its own store."""

    def __init__(self, root: Path, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.dir = root / "nats"
        self.dir.mkdir()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NATS_SERVER is not None
        log = open(self.dir / "nats.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                *(NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)),
                *("-js", "-sd", str(self.dir), *self.extra),
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        wait_until(self._answers, 10, what="nats-server answers")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                return s.recv(4).startswith(b"INFO")
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[OwnNats]:
    if NATS_SERVER is None:
        pytest.fail("nats-server is not installed (scripts/services.sh installs it)")
    server = OwnNats(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class CutProxy:
    """A threaded loopback TCP forwarder that can cut every connection and refuse new ones."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.conns.clear()

    def heal(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.sock.close()


def swarm_url(server_url: str, **opts: Any) -> str:
    q = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"{server_url}?swarm=f{uuid.uuid4().hex[:10]}" + (f"&{q}" if q else "")


def found(node: NodeProc, key: str) -> Any:
    got = node.client.ctx_get("f", key)
    return got["value"] if got.get("found") else None


def vv(node: NodeProc) -> dict[str, int]:
    out: dict[str, int] = node.client.status()["journal"]["version_vector"]
    return out


def converged(nodes: list[NodeProc]) -> bool:
    """Every node holds at least what every other holds, member.* observations aside."""
    vvs = [vv(n) for n in nodes]
    authors = {n.address for n in nodes}
    return all(all(v.get(a, 0) >= w.get(a, 0) for a in authors) for v in vvs for w in vvs)


def all_up(nodes: list[NodeProc]) -> None:
    addrs = {n.address for n in nodes}
    for n in nodes:
        wait_until(
            lambda n=n: (
                {x for x, m in n.client.status()["members"].items() if m["state"] == "up"}
                >= addrs - {n.address}
            ),
            20,
            what=f"{n.label} sees every member up",
        )


def start(swarm: LocalSwarm, *labels: str) -> list[NodeProc]:
    nodes = [swarm.start(label) for label in labels]
    all_up(nodes)
    return nodes


def counter(node: NodeProc, name: str) -> int:
    return int(node.client.status()["counters"].get(name, 0))


def test_nats_restarted_mid_run_loses_nothing(own_nats: OwnNats, tmp_path: Path) -> None:
    with LocalSwarm(tmp_path / "s", env={"HIVEMESH_MESH": swarm_url(own_nats.url)}) as s:
        a, b, c = start(s, "a", "b", "c")
        for i in range(10):
            a.client.ctx_set("f", f"a{i}", i)
        wait_until(lambda: found(c, "a9") == 9, 15, what="replicated before the restart")
        own_nats.stop()  # kill -9 the server mid-run; the nodes go on from their stores
        for i in range(10, 20):
            a.client.ctx_set("f", f"a{i}", i)  # acknowledged by a's own store
            b.client.ctx_set("f", f"b{i}", i)
        assert found(a, "a19") == 19  # a works while NATS is down
        own_nats.start()  # same store dir: the stream survives
        wait_until(
            lambda: all(found(n, "a19") == 19 and found(n, "b19") == 19 for n in (a, b, c)),
            30,
            what="every acknowledged write on every node after the restart",
        )
        wait_until(lambda: converged([a, b, c]), 20, what="views converge")
        assert counter(a, "mesh_disconnected") >= 1 and counter(a, "mesh_reconnected") >= 1


def test_node_cut_off_from_nats_and_back(own_nats: OwnNats, tmp_path: Path) -> None:
    proxy = CutProxy(own_nats.port)
    url = swarm_url(own_nats.url)
    via_proxy = url.replace(f":{own_nats.port}", f":{proxy.port}")
    try:
        with LocalSwarm(tmp_path / "s", env={"HIVEMESH_MESH": url}) as s:
            a, b = start(s, "a", "b")
            c = s.start("c", extra_args=["--mesh", via_proxy])
            all_up([a, b, c])
            proxy.cut()
            for i in range(10):
                a.client.ctx_set("f", f"a{i}", i)
                c.client.ctx_set("f", f"c{i}", i)  # acknowledged while cut off
            wait_until(lambda: found(b, "a9") == 9, 15, what="the others carry on")
            assert found(b, "c9") is None
            proxy.heal()
            wait_until(
                lambda: all(found(n, "a9") == 9 and found(n, "c9") == 9 for n in (a, b, c)),
                30,
                what="the cut-off node's writes out and the others' in",
            )
            wait_until(lambda: converged([a, b, c]), 20, what="views converge")
    finally:
        proxy.close()


def stream_of(url: str) -> str:
    return "HM_" + url.split("swarm=")[1].split("&")[0]


async def _purge(server: str, stream: str) -> None:
    nc = await nats.connect(server, connect_timeout=2)
    try:
        await nc.jetstream().purge_stream(stream)
    finally:
        await nc.close()


def test_purged_stream_and_retention_limit(own_nats: OwnNats, tmp_path: Path) -> None:
    url = swarm_url(own_nats.url, max_msgs=5)  # retention keeps the last 5 entries
    with LocalSwarm(tmp_path / "s", env={"HIVEMESH_MESH": url}) as s:
        a, b = start(s, "a", "b")
        s.kill("b")  # b misses entries that retention will drop
        for i in range(30):
            a.client.ctx_set("f", f"a{i}", i)  # 30 entries: all but 5 dropped
        s.restart("b")
        late = s.start("late")  # starts after retention dropped most of a's feed
        wait_until(
            lambda: all(found(n, "a29") == 29 and found(n, "a0") == 0 for n in (b, late)),
            30,
            what="dropped entries fetched from peers",
        )
        asyncio.run(_purge(own_nats.url, stream_of(url)))
        for i in range(30, 35):
            a.client.ctx_set("f", f"a{i}", i)
        late2 = s.start("late2")  # the stream lost everything before the purge
        wait_until(
            lambda: all(found(n, "a34") == 34 and found(n, "a0") == 0 for n in (b, late, late2)),
            30,
            what="a purged stream is caught up from peers",
        )
        wait_until(lambda: converged([a, b, late, late2]), 20, what="views converge")


async def _inject(server: str, url: str, victim: NodeProc, other: NodeProc) -> None:
    """Publish a forged next batch of ``victim``'s feed under its subject, and a
    genuine batch of it under ``other``'s subject."""
    swarm = url.split("swarm=")[1].split("&")[0]
    stream = f"HM_{swarm}"
    nc = await nats.connect(server, connect_timeout=2)
    try:
        js = nc.jetstream()
        last = await js.get_last_msg(stream, f"hm.{swarm}.feed.{victim.address}")
        _t, (author, raws, _sig, _hops) = decode_frame(last.data)
        prev = decode_event(raws[-1])
        forged = encode_event(
            author, prev.seq + 1, event_hash(raws[-1]), prev.hlc + 1, "ctx.note", {"x": 1}
        )
        mallory = Identity.from_seed(b"m" * 32)  # signs in the victim's name
        sig = mallory.sign(head_message(author, forged.seq, forged.id))
        tampered = encode_frame(FrameType.EVENTS, author, [forged.raw], sig, 0)
        await js.publish(f"hm.{swarm}.feed.{victim.address}", tampered, stream=stream)
        await js.publish(f"hm.{swarm}.feed.{other.address}", last.data, stream=stream)
    finally:
        await nc.close()
    assert public_key_of(victim.address) == author


def test_tampered_and_misrouted_entries_are_rejected_by_every_node(
    own_nats: OwnNats, tmp_path: Path
) -> None:
    url = swarm_url(own_nats.url)
    with LocalSwarm(tmp_path / "s", env={"HIVEMESH_MESH": url}) as s:
        nodes = start(s, "a", "b", "c")
        a, b, _c = nodes
        a.client.ctx_set("f", "before", 1)
        wait_until(lambda: all(found(n, "before") == 1 for n in nodes), 15, what="replicated")
        asyncio.run(_inject(own_nats.url, url, a, b))
        for n in nodes:
            wait_until(
                lambda n=n: (
                    counter(n, "bad_signature") >= 1 and counter(n, "mesh_broker_misrouted") >= 1
                ),
                15,
                what=f"{n.label} rejected and counted both",
            )
        a.client.ctx_set("f", "after", 2)  # a's real next batch is still accepted
        wait_until(lambda: all(found(n, "after") == 2 for n in nodes), 15, what="a goes on")
        wait_until(lambda: converged(nodes), 20, what="views converge")


def test_nats_user_credentials_are_used_and_checked(tmp_path: Path) -> None:
    server = OwnNats(tmp_path, ("--user", "agent", "--pass", "s3cret"))
    server.start()
    try:
        good = swarm_url(f"nats://agent:s3cret@127.0.0.1:{server.port}")
        out = _admitted_then_refused(tmp_path, good, good.replace("s3cret", "wrong"))
        assert "unreachable" in out and "uthoriz" in out, out
    finally:
        server.stop()


class OwnRedis:
    """A redis-server of the test's own on a free loopback port (AOF in its own dir)."""

    def __init__(self, root: Path, extra: tuple[str, ...] = (), *, tls: bool = False) -> None:
        self.port = free_port()
        self.dir = root / "redis"
        self.dir.mkdir()
        self.extra = extra
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server is not installed (scripts/services.sh installs it)"
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--dir", str(self.dir), "--appendonly", "yes",
             "--save", "",
             *(("--port", "0", "--tls-port") if self.tls else ("--port",)), str(self.port),
             *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self._answers, 10, what="redis-server answers")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                if self.tls:
                    return True  # it listens; the test's own connection proves the rest
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def test_redis_restarted_mid_run_loses_nothing(tmp_path: Path) -> None:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0?swarm=f{uuid.uuid4().hex[:10]}"
        with LocalSwarm(tmp_path / "s", env={"HIVEMESH_MESH": url}) as s:
            a, b, c = start(s, "a", "b", "c")
            for i in range(10):
                a.client.ctx_set("f", f"a{i}", i)
            wait_until(lambda: found(c, "a9") == 9, 15, what="replicated before the restart")
            server.stop()  # kill -9 Redis mid-run
            for i in range(10, 20):
                a.client.ctx_set("f", f"a{i}", i)
                b.client.ctx_set("f", f"b{i}", i)
            server.start()
            wait_until(
                lambda: all(found(n, "a19") == 19 and found(n, "b19") == 19 for n in (a, b, c)),
                30,
                what="every acknowledged write on every node after the restart",
            )
            wait_until(lambda: converged([a, b, c]), 20, what="views converge")
            assert counter(a, "mesh_disconnected") >= 1 and counter(a, "mesh_reconnected") >= 1
    finally:
        server.stop()


def _pki(d: Path) -> tuple[Path, Path, Path, Path, Path]:
    """A private CA, a server certificate for 127.0.0.1 and a client
    certificate, both signed by it: (ca, server cert, server key, client
    cert, client key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hivemesh test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))

    def issue(name: str, server: bool) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        cn = "127.0.0.1" if server else "hivemesh test client"
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        paths = (d / f"{name}.pem", d / f"{name}.key")
        paths[0].write_bytes(cert.public_bytes(pem))
        paths[1].write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        return paths

    return (d / "ca.pem", *issue("server", True), *issue("client", False))


def _refused(env: dict[str, str], data_dir: Path, url: str) -> str:
    """``hivemesh up --mesh url`` must fail to start; its output."""
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "up", "--json", "--data-dir", str(data_dir),
         "--mesh", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert out.returncode != 0, out.stdout
    return out.stdout


def _admitted_then_refused(root: Path, url: str, other: str) -> str:
    """Two nodes on ``url`` replicate a write; ``hivemesh up`` on ``other``
    fails to start: its output."""
    with LocalSwarm(root / "s", env={"HIVEMESH_MESH": url}) as s:
        a, b = start(s, "a", "b")
        a.client.ctx_set("f", "k", 1)
        wait_until(lambda: found(b, "k") == 1, 15, what="replicated")
        return _refused(s.env, root / "c", other)


def test_nats_over_tls_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key, _, _ = _pki(tmp_path)
    server = OwnNats(tmp_path, ("--tls", "--tlscert", str(cert), "--tlskey", str(key)))
    server.start()
    try:
        url = swarm_url(f"tls://127.0.0.1:{server.port}", ca=ca)
        untrusted = url.split("&ca=")[0]  # the system CAs do not know ours
        out = _admitted_then_refused(tmp_path, url, untrusted)
        assert "certificate" in out.lower(), out
    finally:
        server.stop()


def test_nats_tls_client_certificate_is_presented_and_required(tmp_path: Path) -> None:
    ca, cert, key, ccert, ckey = _pki(tmp_path)
    server = OwnNats(
        tmp_path,
        ("--tls", "--tlscert", str(cert), "--tlskey", str(key), "--tlsverify",
         "--tlscacert", str(ca)),
    )  # fmt: skip
    server.start()
    try:
        url = swarm_url(f"tls://127.0.0.1:{server.port}", ca=ca, cert=ccert, key=ckey)
        anonymous = url.split("&cert=")[0]  # trusts the server, shows no certificate
        out = _admitted_then_refused(tmp_path, url, anonymous)
        assert "unreachable" in out, out
    finally:
        server.stop()


def test_nats_nkey_user_is_used_and_checked(tmp_path: Path) -> None:
    import nkeys

    def user(name: str) -> tuple[Path, str]:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        path = tmp_path / f"{name}.nk"
        path.write_bytes(seed + b"\n")
        path.chmod(0o600)
        return path, nkeys.from_seed(bytearray(seed)).public_key.decode()

    known, public = user("known")
    stranger, _ = user("stranger")
    conf = tmp_path / "nats.conf"
    conf.write_text(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
    server = OwnNats(tmp_path, ("-c", str(conf)))
    server.start()
    try:
        url = swarm_url(f"nats://127.0.0.1:{server.port}", nkey=known)
        out = _admitted_then_refused(tmp_path, url, url.replace(str(known), str(stranger)))
        assert "unreachable" in out and "uthoriz" in out, out
    finally:
        server.stop()


def test_redis_acl_user_is_used_and_checked(tmp_path: Path) -> None:
    server = OwnRedis(tmp_path, ("--user", "agent", "on", ">s3cret", "~*", "&*", "+@all",
                                 "--user", "default", "off"))  # fmt: skip
    server.start()
    try:
        good = swarm_url(f"redis://agent:s3cret@127.0.0.1:{server.port}")
        out = _admitted_then_refused(tmp_path, good, good.replace("s3cret", "wrong"))
        assert "unreachable" in out and ("WRONGPASS" in out or "invalid" in out.lower()), out
    finally:
        server.stop()


def test_redis_over_tls_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key, _, _ = _pki(tmp_path)
    server = OwnRedis(
        tmp_path,
        ("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
         str(ca), "--tls-auth-clients", "no"),
        tls=True,
    )  # fmt: skip
    server.start()
    try:
        url = swarm_url(f"rediss://127.0.0.1:{server.port}", ca=ca)
        untrusted = url.split("&ca=")[0]  # the system CAs do not know ours
        out = _admitted_then_refused(tmp_path, url, untrusted)
        assert "unreachable" in out and "certificate" in out.lower(), out
    finally:
        server.stop()
