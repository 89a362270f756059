"""Malformed local input against a real daemon: the control socket and the CLI.

Deeply nested JSON, invalid UTF-8 and oversize requests, sent raw on the
control socket and as CLI arguments (a separate ``python -m hivemesh``
process, as a user runs it). Each gets a typed error with a stable code and
a non-zero exit -- never a traceback, an unanswered request or a
``BrokenPipeError`` -- and the daemon goes on serving.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, NodeProc
from hivemesh.errors import InputTooDeep, InputTooLarge, InvalidEncoding

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
DEEP = "[" * 30_000 + "]" * 30_000  # fits in one argv string (128 KiB)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with LocalSwarm(tmp_path_factory.mktemp("input")) as swarm:
        yield swarm.start("a")


class Raw:
    """One raw control connection: send bytes, read answer lines."""

    def __init__(self, node: NodeProc) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(str(node.data_dir / "ctl.sock"))
        self.file = self.sock.makefile("rb")

    def ask(self, line: bytes) -> dict[str, Any]:
        self.sock.sendall(line)  # whole, even when the line is far over the limit
        answer = self.file.readline()
        assert answer, "the daemon hung up without answering"
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        self.sock.close()


def _code(reply: dict[str, Any]) -> str:
    assert reply["ok"] is False, reply
    return str(reply["error"]["code"])


def test_deeply_nested_json_on_the_control_socket(node: NodeProc) -> None:
    with Raw(node) as raw:
        deep = b'{"id":1,"op":"status","args":' + DEEP.encode() * 3 + b"}\n"
        assert _code(raw.ask(deep)) == "too_deep"
        value = "[" * 200 + "]" * 200  # parses, but deeper than the protocol allows
        line = b'{"id":2,"op":"ctx.set","args":{"key":"k","value":' + value.encode() + b"}}\n"
        assert _code(raw.ask(line)) == "too_deep"
        # the same connection goes on serving
        assert raw.ask(b'{"id":3,"op":"status"}\n')["ok"] is True


def test_invalid_utf8_on_the_control_socket(node: NodeProc) -> None:
    with Raw(node) as raw:
        bad_bytes = b'{"id":1,"op":"ctx.set","args":{"key":"\xff\xfe","value":1}}\n'
        assert _code(raw.ask(bad_bytes)) == "bad_encoding"
        # valid JSON escaping a lone surrogate: not text either
        lone = b'{"id":2,"op":"ctx.set","args":{"key":"\\udcff","value":1}}\n'
        reply = raw.ask(lone)
        assert _code(reply) == "bad_encoding" and "args.key" in reply["error"]["message"]
        assert raw.ask(b'{"id":3,"op":"status"}\n')["ok"] is True


def test_an_oversize_request_is_read_to_its_end_and_answered(node: NodeProc) -> None:
    with Raw(node) as raw:
        big = b'{"id":1,"op":"ctx.set","args":{"key":"k","value":"' + b"x" * (3 << 20) + b'"}}\n'
        assert _code(raw.ask(big)) == "too_large"
        assert raw.ask(b'{"id":2,"op":"status"}\n')["ok"] is True


def test_the_client_refuses_what_the_daemon_would_before_sending(node: NodeProc) -> None:
    client = Client(node.data_dir)
    with pytest.raises(InputTooLarge):
        client.ctx_set("default", "k", "x" * (2 << 20))
    with pytest.raises(InputTooDeep):
        client.ctx_set("default", "k", json.loads("[" * 500 + "]" * 500))
    with pytest.raises(InvalidEncoding):
        client.ctx_set("default", "\udcff", 1)
    # found by hivemesh fuzz (mesh_mcp_tools): a lone surrogate outside
    # surrogateescape's range made the error message itself raise
    with pytest.raises(InvalidEncoding):
        client.ctx_set("default", "\ud800", 1)


def cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *args, "--json", "--data-dir", str(data_dir)],
        env={"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("ctx", "set", "k", DEEP), "too_deep"),
        (("send-message", "somebody", "--data", DEEP), "too_deep"),
        (("ctx", "set", "\udcff\udcfe", "1"), "bad_encoding"),  # argv bytes ff fe
        (("ctx", "set", "k", "caf\udce9"), "bad_encoding"),  # latin-1 text, not UTF-8
        (("ctx", "get", "\udcff"), "bad_encoding"),
        (("name", "claim", "\udcff"), "bad_encoding"),
        (("send-message", "somebody", "--data", '"\udcff"'), "bad_encoding"),
        (("ctx", "set", "k", "x" * 100_000), "invalid_argument"),  # over 64 KiB: a blob
    ],
)
def test_malformed_cli_values_get_typed_errors(
    node: NodeProc, args: tuple[str, ...], code: str
) -> None:
    out = cli(*args, data_dir=node.data_dir)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)  # bad input
    assert json.loads(out.stdout)["error"]["code"] == code


def test_the_daemon_logged_no_traceback_and_counted_the_bad_requests(node: NodeProc) -> None:
    counters = node.client.status()["counters"]
    for code in ("too_deep", "bad_encoding", "too_large"):
        assert counters.get(f"control_bad_request_{code}", 0) >= 1, counters
    log = (node.data_dir / "daemon.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log, log
