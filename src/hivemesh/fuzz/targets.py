"""The decoders that face the network or the user, as fuzz targets.

Each :class:`Target` has a name, a seed corpus of *valid* inputs (real
frames captured from two Peers talking, a real Noise handshake, real invite
tokens, requests every face sends...) and ``feed(data)``, which pushes one
input through the very code path the daemon or the CLI runs on it. The
contract is the one of :mod:`hivemesh.errors`: an input either goes through
or raises a :class:`~hivemesh.errors.HivemeshError`; anything else (a bare
``KeyError``, ``TypeError``, ``RecursionError``...) is an *untyped* failure,
a bug. Targets whose decoder never raises (the Peer counts bad frames and
drops them) report through their own counters instead.

State that costs to build (a Peer, a handshake, an MCP server) is built once
per target and reused; a target must stay usable whatever it was fed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shlex
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemesh.errors import DecodeError, HivemeshError

__all__ = ["Target", "Untyped", "all_targets", "target_names"]


class Untyped(Exception):
    """A target saw an input end in something other than a typed error."""


@dataclass
class Target:
    """One decoder: ``feed(data)`` returns, or raises a HivemeshError (typed)
    or anything else (untyped)."""

    name: str
    what: str
    corpus: list[bytes]
    feed: Callable[[bytes], None]
    #: share of a budget (relative weight; slow targets get less)
    weight: float = 1.0
    #: how large a generated input may grow
    max_size: int = 4096
    stats: dict[str, int] = field(default_factory=dict)


def _rng_bytes(seed: str) -> Callable[[int], bytes]:
    rnd = random.Random(seed)
    return rnd.randbytes


# -- frames, envelopes, feed batches, relay frames: one Peer with a link --------


def _peer_target() -> Target:
    from hivemesh.commands.messages import Send as SendDirect
    from hivemesh.commands.node import Append
    from hivemesh.core.effects import Send
    from hivemesh.core.identity import Identity
    from hivemesh.core.peer import Peer
    from hivemesh.core.store import MemoryStore

    ids = [Identity.from_seed(bytes([70 + i]) * 32) for i in range(3)]
    now = 1_000_000

    def boot(i: int) -> Peer:
        p = Peer(ids[i], MemoryStore(), random.Random(i), now_ms=now)
        p.rehydrate([], now)
        p.start([f"10.0.0.{i}:7000"], now)
        p.inbox_room(1000, now)
        return p

    a, b = boot(0), boot(1)
    corpus: list[bytes] = []
    peers = {a.address: a, b.address: b}
    for x, y in ((a, b), (b, a)):
        x.link_up(y.address, b"boot", now)
    for i in range(6):
        a.command(Append("app.note", {"i": i, "text": "x" * i}), now)
    a.command(SendDirect(b.address, {"hello": [1, 2, 3]}, timeout_s=5.0), now)
    b.command(Append("app.set", {"k": "v"}), now)
    t = now
    for _ in range(40):
        t += 250
        moved = False
        for p in (a, b):
            p.handle_timer(t) if p.next_deadline() <= t else None
            for e in p.effects():
                if isinstance(e, Send) and e.peer in peers:
                    corpus.append(e.frame)
                    peers[e.peer].receive(p.address, e.frame, t)
                    moved = True
        if not moved and len(corpus) > 20:
            break
    victim = boot(2)
    victim.link_up(a.address, b"boot", now)
    clock = [now]

    def feed(data: bytes) -> None:
        clock[0] += 1
        victim.receive(a.address, data, clock[0])
        victim.effects()  # drained: the victim's outbox stays bounded

    return Target(
        "peer_frames",
        "a Peer receiving frames on a link: events (feed batches), have/want, blobs, "
        "direct and relayed messages, membership, leases, runtime join frames",
        sorted(set(corpus)),
        feed,
        weight=3.0,
    )


def _codec_target() -> Target:
    from hivemesh.core.event import decode_event
    from hivemesh.core.feed import FeedWriter, Head
    from hivemesh.core.frames import FrameType, decode_frame, encode_frame
    from hivemesh.core.hlc import HLC
    from hivemesh.core.identity import Identity

    w = FeedWriter(Identity.from_seed(b"c" * 32), Head(), HLC())
    raws = [w.append("app.note", {"i": i, "l": [i, "s", b"b"]}, 1000 + i).raw for i in range(4)]
    corpus = [*raws, encode_frame(FrameType.HAVE, {b"a" * 32: 3}, True)]
    corpus.append(encode_frame(FrameType.WANT, [[b"a" * 32, 1, 4]]))

    def feed(data: bytes) -> None:
        try:
            decode_frame(data)
        finally:
            decode_event(data)

    return Target(
        "codec", "msgpack frames and signed events (decode_frame, decode_event)", corpus, feed
    )


# -- Noise handshake messages and session records ---------------------------------


def _handshake_target() -> Target:
    from hivemesh.core.identity import Identity
    from hivemesh.transports.noise import SecureHandshake, StaticCredentials

    rb = _rng_bytes("fuzz/noise")
    ca = StaticCredentials.generate(Identity.from_seed(b"n" * 32), rb)
    cb = StaticCredentials.generate(Identity.from_seed(b"o" * 32), rb)

    def hs(initiator: bool) -> SecureHandshake:
        return SecureHandshake(
            ca if initiator else cb, initiator=initiator, random_bytes=rb, authorize=lambda a: True
        )

    c, s = hs(True), hs(False)
    m1 = c.initiate()
    m2 = s.receive(m1)
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    s.receive(m3)

    def feed(data: bytes) -> None:
        # the same bytes as message 1, 2 and 3 of a fresh handshake
        errs: list[HivemeshError] = []
        for stage in range(3):
            try:
                if stage == 0:
                    hs(False).receive(data)
                elif stage == 1:
                    ini = hs(True)
                    ini.initiate()
                    ini.receive(data)
                else:
                    resp = hs(False)
                    resp.receive(hs(True).initiate())
                    resp.receive(data)
            except HivemeshError as exc:
                errs.append(exc)
        if errs:
            raise errs[0]

    return Target(
        "noise_handshake",
        "Noise XX handshake messages 1-3 (SecureHandshake)",
        [m1, m2, m3],
        feed,
        weight=0.4,
        max_size=600,
    )


def _session_target() -> Target:
    from hivemesh.core.identity import Identity
    from hivemesh.errors import BadRecord
    from hivemesh.transports.noise import SecureHandshake, StaticCredentials
    from hivemesh.transports.session import FrameSession

    rb = _rng_bytes("fuzz/session")
    ca = StaticCredentials.generate(Identity.from_seed(b"s" * 32), rb)
    cb = StaticCredentials.generate(Identity.from_seed(b"t" * 32), rb)

    def pair() -> tuple[FrameSession, FrameSession]:
        c = SecureHandshake(ca, initiator=True, random_bytes=rb, authorize=lambda a: True)
        s = SecureHandshake(cb, initiator=False, random_bytes=rb, authorize=lambda a: True)
        m2 = s.receive(c.initiate())
        assert m2 is not None
        m3 = c.receive(m2)
        assert m3 is not None
        s.receive(m3)
        rc, rs = c.result(), s.result()
        client = FrameSession(rc.send, rc.recv, initiator=True)
        server = FrameSession(rs.send, rs.recv, initiator=False)
        client.receive_data(server.encode_accept())
        return client, server

    client, server = pair()
    corpus = [client.encode_frames([b"frame", b"x" * 300]), client.encode_close("unknown_peer")]
    state = [server]

    def feed(data: bytes) -> None:
        srv = state[0]
        srv.receive_data(data)
        if srv.failure is not None:
            failure = srv.failure
            state[0] = pair()[1]
            if not isinstance(failure, (DecodeError, BadRecord)):
                raise Untyped(f"session failed with {type(failure).__name__}: {failure}")

    return Target(
        "session_records",
        "encrypted session records after a handshake (FrameSession)",
        corpus,
        feed,
        weight=0.5,
    )


# -- telemetry envelopes --------------------------------------------------------------


def _telemetry_target() -> Target:
    from hivemesh.core.codec import pack
    from hivemesh.telemetry.schema import decode_batch, validate_record

    rec = {"name": "gen_ai.usage.input_tokens", "value": 12, "attrs": {"gen_ai.request.model": "m"}}
    corpus = [
        json.dumps({"type": "metrics", "v": 1, "records": [rec], "hi": 1}).encode(),
        json.dumps({"records": [rec, {"name": "x", "value": 1.5}], "backlog": 0}).encode(),
        pack({"type": "metrics", "v": 1, "records": [rec], "hi": 7, "backlog": 2}),
    ]

    def feed(data: bytes) -> None:
        batch = decode_batch(data)  # a bad envelope drops the batch
        for r in batch.records:  # a bad record drops that record only (as the collector)
            with contextlib.suppress(HivemeshError):
                validate_record(r)

    return Target("telemetry_envelope", "telemetry batch envelopes and their records", corpus, feed)


def _columnar_target() -> Target:
    from hivemesh.core.codec import pack
    from hivemesh.telemetry.columnar import decode_columnar, encode_columnar, rebuild_records
    from hivemesh.telemetry.schema import validate_record

    recs = [
        {"seq": 1, "kind": "llm_call", "name": "gen_ai.client.operation.duration", "value": 1.5,
         "ts_ms": 7, "attrs": {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 3}},
        {"seq": 2, "kind": "tool_call", "name": "gen_ai.tool.duration", "value": 2.0,
         "attrs": {"gen_ai.tool.name": "t", "error.type": "E", "x.y": "z"}},
        {"seq": 4, "kind": "counter", "name": "n", "value": 1.0, "id": "r"},
    ]  # fmt: skip
    corpus = [c for c in (encode_columnar([pack(r)], 9, 1) for r in recs) if c is not None]
    whole = encode_columnar([pack(r) for r in recs], 4, 0)
    if whole is not None:
        corpus.append(whole)

    def feed(data: bytes) -> None:
        cb = decode_columnar(data, "fuzz", 1)  # a broken batch raises DecodeError (typed)
        if cb is not None and cb.batch is None:  # some record breaks a rule: judge each
            for r in rebuild_records(cb):
                with contextlib.suppress(HivemeshError):
                    validate_record(r)

    return Target("telemetry_columnar", "columnar (v2) telemetry batches", corpus, feed)


# -- journal import: the append log read back, its records ingested -----------------


def _journal_target() -> Target:
    from hivemesh.core.feed import FeedWriter, Head
    from hivemesh.core.hlc import HLC
    from hivemesh.core.identity import Identity
    from hivemesh.core.journal import Journal
    from hivemesh.core.store import MemoryStore
    from hivemesh.stores.appendlog import encode_record, read_records

    who = Identity.from_seed(b"j" * 32)
    w = FeedWriter(who, Head(), HLC())
    records = []
    for n in (1, 3):
        for i in range(n):
            w.append("app.note", {"i": i}, 1000 + i)
        sealed = w.seal()
        assert sealed is not None
        events, sig = sealed
        records.append(encode_record(who.public, sig, [e.raw for e in events]))
    corpus = [records[0], records[0] + records[1]]
    header = struct.Struct(">4sII")

    def ingest_all(data: bytes) -> None:
        journal = Journal(MemoryStore(), trusted=lambda a: True)
        for rec in read_records(data).records:
            journal.ingest(rec.author, rec.raws, rec.sig)

    def feed(data: bytes) -> None:
        try:
            ingest_all(data)  # the file as it is: checksums stop most damage
        finally:
            # and the same bytes with their checksums fixed: the payload decoder
            # and the journal's own checks must hold on their own
            if len(data) >= header.size:
                magic, _, _ = header.unpack_from(data)
                body = data[header.size :]
                ingest_all(header.pack(magic, len(body), zlib.crc32(body)) + body)

    return Target(
        "journal_import", "append-log files read back and ingested into a journal", corpus, feed
    )


# -- invite tokens ----------------------------------------------------------------------


def _invite_target() -> Target:
    from hivemesh.core.identity import Identity
    from hivemesh.trust import accept_invite, make_invite

    who = Identity.from_seed(b"i" * 32)
    tok = make_invite(who, ["127.0.0.1:7000", "[::1]:7001"], 3600, 1000, b"n" * 16)
    corpus = [tok.encode(), make_invite(who, [], 60, 5, b"m" * 16).encode()]

    def feed(data: bytes) -> None:
        accept_invite(data.decode("utf-8", "surrogateescape"), 2000)

    return Target("invite_token", "invite tokens (hivemesh join TOKEN)", corpus, feed)


# -- control-socket requests and CLI FIELD=VALUE words -----------------------------------


def _control_target() -> Target:
    from hivemesh.commands import COMMANDS, command_class
    from hivemesh.commands.wire import decode

    corpus = [
        b'{"id": 1, "op": "status", "args": {}}',
        b'{"id": 2, "op": "ctx.set", "args": {"key": "goal", "value": "ship"}}',
        b'{"id": 3, "op": "events.watch", "args": {"kinds": ["app.note"]}}',
        b'{"id": 4, "op": "lease.acquire", "args": {"resource": "r", "ttl_ms": 5000}}',
    ]
    corpus += [json.dumps({"id": 9, "op": op, "args": {}}).encode() for op in sorted(COMMANDS)]

    def feed(data: bytes) -> None:
        from hivemesh.errors import InvalidArgument

        req = decode(data)  # the control server's own steps, in its order
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            raise InvalidArgument("a request is an object with an op")
        command_class(req["op"]).from_wire(req.get("args"))

    return Target(
        "control_request",
        "control-socket request lines (JSON) into typed commands",
        corpus,
        feed,
        weight=1.5,
    )


def _cli_target() -> Target:
    from hivemesh.commands import COMMANDS, command_class
    from hivemesh.faces.cli.commands.call import parse_fields

    ops = sorted(COMMANDS)
    corpus = [
        b"ctx.set key=goal value='\"ship it\"'",
        b"events.watch kinds='[\"app.note\"]'",
        b"lease.acquire resource=r ttl_ms=5000",
        b"status",
    ]

    def feed(data: bytes) -> None:
        from hivemesh.errors import InvalidArgument

        text = data.decode("utf-8", "surrogateescape")
        try:
            words = shlex.split(text)
        except ValueError as exc:  # the shell would refuse it before us
            raise InvalidArgument(str(exc)) from None
        if not words:
            return
        op = words[0] if words[0] in COMMANDS else ops[len(words[0]) % len(ops)]
        command_class(op).from_wire(parse_fields(op, words[1:]))

    return Target(
        "cli_fields", "hivemesh call COMMAND FIELD=VALUE... words into typed commands", corpus, feed
    )


# -- MCP tool inputs of the web-tools server -----------------------------------------


def _mcp_target() -> Target:
    from mcp.server.mcpserver.exceptions import ToolError

    from hivemesh.webtools.fetch import Fetcher
    from hivemesh.webtools.server import build_server

    loop = asyncio.new_event_loop()
    app, counters = build_server(Fetcher({}))
    tools = ["extract_tables", "extract_structured", "extract_prices", "dom_snapshot"]
    html = (
        "<html><body><table><tr><th>item</th><th>price</th></tr><tr><td>tea</td>"
        '<td>€3,50</td></tr></table><div itemscope itemtype="https://schema.org/Product">'
        '<span itemprop="name">cup</span><span itemprop="price">2.00</span></div>'
        '<a rel="next" href="/p2">next</a></body></html>'
    )
    corpus = [json.dumps({"tool": t, "args": {"html": html}}).encode() for t in tools] + [
        json.dumps({"tool": "extract_prices", "args": {"html": html, "strategy": "table"}}).encode()
    ]

    def feed(data: bytes) -> None:
        from hivemesh.errors import InvalidArgument

        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            obj = {
                "tool": tools[len(data) % len(tools)],
                "args": {"html": data.decode("utf-8", "replace")},
            }
        if not isinstance(obj, dict):
            obj = {"args": obj}
        tool = obj.get("tool")
        args = obj.get("args")
        if not isinstance(tool, str) or tool not in tools:
            tool = tools[len(data) % len(tools)]
        if not isinstance(args, dict):
            args = {"html": json.dumps(args)}
        # never a URL: this fuzzer sends no traffic anywhere
        args = {k: v for k, v in args.items() if k != "url"}
        before = counters["errors.unexpected"]
        try:
            loop.run_until_complete(app.call_tool(tool, args))
        except ToolError as exc:  # argument validation or a typed hivemesh error
            raise InvalidArgument(f"tool error: {exc}"[:200]) from None
        finally:
            if counters["errors.unexpected"] != before:
                raise Untyped(f"{tool}: the server counted an unexpected exception")

    return Target(
        "mcp_tools",
        "web-tools MCP server tool inputs (html, strategy, ...)",
        corpus,
        feed,
        weight=0.25,
        max_size=2048,
    )


# -- tool calls of the mesh's MCP server (hivemesh mcp) -------------------------------


def _mesh_mcp_target() -> Target:
    from hivemesh.client.aio import AsyncClient
    from hivemesh.faces.mcp.server import MeshMcp
    from hivemesh.faces.mcp.tools import TOOLS

    face = MeshMcp(AsyncClient("/nonexistent/hivemesh-fuzz"))  # checks only: never connects
    names = [t.name for t in TOOLS] + ["ctx_watch"]
    corpus = [
        json.dumps(c).encode()
        for c in (
            {"tool": "ctx_set", "args": {"context": "c", "key": "k", "value": {"v": [1, 2]}}},
            {"tool": "ctx_append", "args": {"list": "chat", "values": ["hi", 2]}},
            {"tool": "ctx_incr", "args": {"counter": "n", "by": -2.5}},
            {"tool": "ctx_add", "args": {"set": "who", "elements": ["ann"]}},
            {"tool": "plan_goal", "args": {"title": "t", "max_depth": 2, "settle_ms": 0}},
            {"tool": "lease_renew", "args": {"resource": "r", "holder": "h", "token": 3}},
            {"tool": "metrics_record", "args": {"name": "m", "value": 1, "attrs": {"a": 1}}},
            {"tool": "ctx_watch", "args": {"context": "c", "timeout_s": 5}},
        )
    ]

    def feed(data: bytes) -> None:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            obj = {"tool": names[len(data) % len(names)], "args": data.decode("utf-8", "replace")}
        if not isinstance(obj, dict):
            obj = {"args": obj}
        tool = obj.get("tool")
        face.request_of(
            tool if isinstance(tool, str) else names[len(data) % len(names)], obj.get("args")
        )

    return Target(
        "mesh_mcp_tools", "the mesh MCP server's tool arguments into typed commands", corpus, feed
    )


# -- relay messages (QUIC relay channels) -------------------------------------------


def _relay_target() -> Target:
    from hivemesh.transports.relay_wire import Kind, Message, Punch, decode, encode

    addr = "hm" + "a" * 56
    corpus = [
        encode(Message(Kind.RESERVE)),
        encode(Message(Kind.CONNECT, 7, text=addr)),
        encode(Message(Kind.INCOMING, 9, text=addr)),
        encode(Message(Kind.DATA, 7, data=b"\x00noise stream bytes")),
        encode(Message(Kind.CLOSE, 7, text="unknown_peer")),
        encode(Message(Kind.OBSERVED, 0, text="198.18.0.2:7000")),
        encode(Message(Kind.PUNCH, 3, punch=Punch(addr, (("198.18.0.2", 7000), ("10.0.0.1", 1))))),
    ]

    def feed(data: bytes) -> None:
        decode(data)

    return Target(
        "relay_frames", "relay channel messages (reserve, connect, data, punch...)", corpus, feed
    )


_BUILDERS: dict[str, Callable[[], Target]] = {
    "peer_frames": _peer_target,
    "codec": _codec_target,
    "noise_handshake": _handshake_target,
    "session_records": _session_target,
    "telemetry_envelope": _telemetry_target,
    "telemetry_columnar": _columnar_target,
    "journal_import": _journal_target,
    "invite_token": _invite_target,
    "control_request": _control_target,
    "cli_fields": _cli_target,
    "mcp_tools": _mcp_target,
    "mesh_mcp_tools": _mesh_mcp_target,
    "relay_frames": _relay_target,
}


def all_targets(names: list[str] | None = None) -> list[Target]:
    """Build the targets named (all of them by default), in a fixed order."""
    chosen = names if names else sorted(_BUILDERS)
    unknown = [n for n in chosen if n not in _BUILDERS]
    if unknown:
        from hivemesh.errors import InvalidArgument

        raise InvalidArgument(f"unknown fuzz target(s) {unknown}; known: {sorted(_BUILDERS)}")
    return [_BUILDERS[n]() for n in chosen]


def target_names() -> list[str]:
    """Every target's name."""
    return sorted(_BUILDERS)
