"""Every command of the table, through every face, against a real node.

One in-process :class:`hivemesh.Node` (its daemon, SQLite store and control
socket are real) is driven three ways for each case: ``await node.call``,
the control socket (:class:`~hivemesh.client.blocking.Client`, in a thread so
the node's loop keeps serving) and the ``hivemesh`` CLI in a separate process
(``hivemesh call``). A command answers the same through each; an error has
the same code through each, and the CLI's exit code and ``--json`` shape are
the documented ones. A last test runs every daemon-facing CLI verb against a
data dir with no daemon: "daemon not running" (exit 3) everywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh import commands as c
from hivemesh.client.blocking import Client
from hivemesh.client.cli import exit_code
from hivemesh.commands import COMMANDS, Command
from hivemesh.errors import HivemeshError
from hivemesh.faces.cli import SUBCOMMANDS

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
ENV = {**os.environ, "PYTHONPATH": SRC}


def _cli(*argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=ENV,
    )


def _words(req: Command) -> list[str]:
    """``FIELD=VALUE`` words for ``hivemesh call`` (text as is, the rest as JSON)."""
    out = []
    for name, value in req.to_wire().items():
        out.append(f"{name}={value if isinstance(value, str) else json.dumps(value)}")
    return out


#: One request per request-reply command that a lone node answers.
ANSWERED: list[Command] = [
    c.Status(),
    c.Peers(),
    c.FeedStatus(),
    c.Append(kind="app.note", body={"n": 1}),
    c.CtxSet(key="k", value={"v": [1, 2]}, context="room"),
    c.CtxGet(context="room", key="k"),
    c.CtxAdd(set="who", elements=("ann", "bob"), context="room"),
    c.CtxRemove(set="who", elements=("bob",), context="room"),
    c.CtxMembers(set="who", context="room"),
    c.CtxAppend(list="chat", values=("hi", {"n": 2}), context="room"),
    c.CtxIncr(counter="tokens", by=3, context="room"),
    c.CtxContexts(),
    c.NameClaim(name="faces-node"),
    c.Names(),
    c.TrustList(),
    c.Invite(ttl_s=60),
    c.Inbox(limit=5),
    c.Claim(resource="job-1"),
    c.ClaimWait(resource="job-1", timeout_s=10),
    c.ClaimShow(resource="job-1"),
    c.ClaimRelease(resource="job-1"),
    c.ClaimDone(resource="job-1"),
    c.LeaseVoters(),
    c.SyncMajority(own_seq=1, pull=True, timeout_s=5),
    c.MetricsRecord(name="faces.test", value=2.0),
    c.MetricsSend(),
    c.PlanGoal(title="check the faces", settle_ms=0),
    c.PlanShow(),
    c.AuditInbox(),
    c.AuditStatus(),
]

#: Requests each face must refuse with the same code (and the CLI with its exit code).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("status", {"verbose": True}, "invalid_argument"),  # unknown field
    ("inbox", {"limit": "many"}, "invalid_argument"),  # wrong type
    ("inbox", {"limit": 0}, "invalid_argument"),  # out of range
    ("feed.accept_loss", {}, "invalid_argument"),  # needs confirm
    ("ping", {"address": "nobody-by-this-name", "timeout_s": 2}, "unknown_peer"),
    ("send", {"to": "nobody-by-this-name", "data": 1, "timeout_s": 2}, "unknown_peer"),
    ("join", {"token": "not-a-token", "timeout_s": 2}, "invite_malformed"),
    ("trust.revoke", {"address": "not-an-address"}, "invalid_argument"),
    ("trust.admit", {"address": "hm" + "x" * 56}, "invalid_argument"),
    ("metrics", {"what": "stats"}, "invalid_argument"),  # this node runs no collector
    ("plan.cancel", {"goal": "f" * 32}, "invalid_argument"),  # no such goal
    ("lease.renew", {"resource": "r", "holder": "h", "token": 0}, "invalid_argument"),
    ("audit.answer", {"id": "q-nobody-asked", "text": "yes"}, "unknown_escalation"),
    ("audit.export", {}, "invalid_argument"),  # no audit in this journal
    ("sync.majority", {}, "invalid_argument"),  # neither barrier asked for
]


def test_every_command_is_reachable_from_every_face() -> None:
    # the CLI: `hivemesh call` takes every wire name (and verbs cover the common ones)
    assert "call" in SUBCOMMANDS
    from hivemesh.faces.cli import build_parser

    parser = build_parser("call")
    for op in COMMANDS:
        assert parser.parse_args(["call", op]).op == op
    # the control socket and hivemesh.Node dispatch through the handler table
    from hivemesh.runtime.handlers import HANDLERS, STREAMS

    assert set(HANDLERS) | set(STREAMS) == set(COMMANDS.values())
    covered = {type(r) for r in ANSWERED} | {COMMANDS[op] for op, _, _ in REFUSED}
    missing = set(COMMANDS.values()) - covered - set(STREAMS) - {c.Stop}
    # the rest are lease ops on the quorum: below, with whatever they answer
    assert missing == {c.LeaseAcquire, c.LeaseRelease, c.LeaseShow}, missing


def test_commands_answer_the_same_through_node_socket_and_cli(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "n") as node:
            client = Client(node.config.data_dir, timeout_s=30)
            for req in ANSWERED:
                via_node = await node.call(req)
                assert isinstance(via_node, type(req).reply), req
                raw = await asyncio.to_thread(client.call, req.op, **req.to_wire())
                via_socket = type(req).reply.from_wire(raw)
                assert type(via_socket) is type(via_node)
                cli = await asyncio.to_thread(
                    _cli,
                    "call",
                    req.op,
                    *_words(req),
                    "--json",
                    "--data-dir",
                    str(node.config.data_dir),
                )
                assert cli.returncode == 0, (req.op, cli.stdout, cli.stderr)
                via_cli = type(req).reply.from_wire(json.loads(cli.stdout))
                assert type(via_cli) is type(via_node)
                reads = ("ctx.contexts", "ctx.get", "ctx.members", "trust.list", "names")
                if req.op in (*reads, "feed.status"):
                    assert via_node == via_socket == via_cli, req.op  # reads: equal answers
            # status carries every feed's head: the seq and hash of its last event
            st = await node.call(c.Status())
            assert isinstance(st, c.Record)
            own = st.data["journal"]["heads"][node.address]
            assert own["seq"] == st.data["journal"]["own_seq"] >= 1 and int(own["hash"], 16)
            text = await asyncio.to_thread(
                _cli, "status", "--heads", "--data-dir", str(node.config.data_dir)
            )
            assert re.search(rf"^{node.address}  #\d+ +[0-9a-f]+$", text.stdout, re.M), text.stdout
            # the lease ops answer or fail alike (a lone node is its own quorum of one)
            for lease_req in (
                c.LeaseAcquire(resource="faces", holder="h1", ttl_ms=5000),
                c.LeaseShow(resource="faces"),
                c.LeaseRelease(resource="faces", holder="h1", token=1),
            ):
                outcomes = []
                for face in ("node", "socket"):
                    try:
                        if face == "node":
                            await node.call(lease_req)
                        else:
                            await asyncio.to_thread(client.run, lease_req)
                        outcomes.append("ok")
                    except HivemeshError as exc:
                        outcomes.append(exc.code)
                assert outcomes[0] in ("ok", "backend_unavailable", "lease_lost"), outcomes
            # streams: through the socket and the CLI (the Node face is subscribe())
            events = await asyncio.to_thread(
                lambda: list(client.stream("ctx.watch", idle_timeout_s=0.5, context="room"))
            )
            assert events and events[0]["state"]["kv"]["k"] == {"v": [1, 2]}
            cli = await asyncio.to_thread(
                _cli, "call", "ctx.watch", "context=room", "--idle-timeout-s", "0.5",
                "--data-dir", str(node.config.data_dir),
            )  # fmt: skip
            assert (
                cli.returncode == 0 and json.loads(cli.stdout.splitlines()[0])["context"] == "room"
            )
            with pytest.raises(hivemesh.HivemeshError) as info:
                await node.call(c.CtxWatch())
            assert info.value.code == "invalid_argument"
            stop = await node.call(c.Stop())
            assert stop == c.StopReply(stopping=True)

    asyncio.run(main())


def test_errors_have_one_code_exit_code_and_shape_through_every_face(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "n") as node:
            data_dir = str(node.config.data_dir)
            client = Client(data_dir, timeout_s=30)
            before = node.status()["counters"]
            for op, args, code in REFUSED:
                with pytest.raises(HivemeshError) as via_socket:
                    await asyncio.to_thread(client.call, op, **args)
                assert via_socket.value.code == code, (op, via_socket.value)
                cli = await asyncio.to_thread(
                    _cli, "call", op, *_words_of(op, args), "--json", "--data-dir", data_dir
                )
                assert "error" in json.loads(cli.stdout), (op, cli.stdout)
                err = json.loads(cli.stdout)["error"]
                assert set(err) == {"type", "code", "message", "exit"}
                assert err["code"] == code and cli.returncode == err["exit"], (op, err)
                assert cli.returncode == exit_code(via_socket.value)
                try:
                    request = COMMANDS[op](**args)
                except TypeError:  # no such field: the Node face cannot even build it
                    continue
                with pytest.raises(HivemeshError) as via_node:
                    await node.call(request)
                assert via_node.value.code == code, (op, via_node.value)
            # unknown commands: typed, counted, the same code and exit code
            with pytest.raises(HivemeshError) as unknown:
                await asyncio.to_thread(client.call, "ctx.frobnicate")
            assert unknown.value.code == "unknown_command"
            counters = node.status()["counters"]
            bad = counters["control_bad_request"] - before.get("control_bad_request", 0)
            assert bad >= 2 * sum(code == "invalid_argument" for _, _, code in REFUSED)
            assert counters["control_bad_request_unknown_command"] == 1

    asyncio.run(main())


def _words_of(op: str, args: dict[str, Any]) -> list[str]:
    hints_str = {k for k, v in args.items() if isinstance(v, str)}
    return [f"{k}={v if k in hints_str else json.dumps(v)}" for k, v in args.items()]


#: A daemon-facing invocation of every verb (options after the action where it has one).
NO_DAEMON = [
    ["status"],
    ["status", "--heads"],
    ["peers"],
    ["inbox"],
    ["invite"],
    ["join", "sometoken"],
    ["ping", "somebody"],
    ["send-message", "somebody", "--data", "1"],
    ["ctx", "get"],
    ["ctx", "set", "k", "v"],
    ["ctx", "add", "s", "x"],
    ["ctx", "members", "s"],
    ["name", "claim", "me"],
    ["name", "list"],
    ["claim", "take", "r"],
    ["claim", "show", "r"],
    ["feed", "status"],
    ["trust", "list"],
    ["lease", "acquire", "r", "--holder", "h"],
    ["lease", "show", "r"],
    ["metrics", "record", "m", "1"],
    ["plan", "show", "f" * 32],
    ["call", "lease.voters"],
]


@pytest.mark.parametrize("where", ["before", "after"])
def test_daemon_not_running_is_exit_3_in_every_command(tmp_path: Path, where: str) -> None:
    empty = str(tmp_path / "nobody-home")
    os.makedirs(empty)
    for argv in NO_DAEMON:
        opts = ["--data-dir", empty, "--json"]
        # before the action (right after the command) or at the very end
        full = [argv[0], *opts, *argv[1:]] if where == "before" else [*argv, *opts]
        out = _cli(*full)
        assert out.returncode == 3, (full, out.stdout, out.stderr)
        err = json.loads(out.stdout)["error"]
        assert err["code"] == "daemon_not_running" and err["exit"] == 3, (full, err)


@pytest.mark.parametrize(
    "argv",
    [["call", "no.such.command"], ["lease", "acquire"], ["ctx", "set", "k"], ["status", "--bogus"]],
)
def test_usage_errors_have_the_one_shape_with_json(argv: list[str]) -> None:
    out = _cli(*argv, "--json")
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "invalid_argument" and err["exit"] == 2 and err["message"]
