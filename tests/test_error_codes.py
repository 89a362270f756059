"""Errors cross the control socket by their stable code, never by class name.

The code -> class map is built from an explicit list of modules (the
taxonomy, then each application's ``errors`` module); codes are unique;
every code a command documents exists; the core loads no application's
errors (it imports :mod:`hivemesh.errors` only).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hivemesh import errors
from hivemesh.client.blocking import Client
from hivemesh.commands import COMMANDS, COMMON_ERRORS
from hivemesh.error_codes import ERROR_MODULES, all_codes, error_class, error_from_wire
from hivemesh.errors import HivemeshError, UnknownPeer
from hivemesh.leases.errors import LeaseUnavailable
from hivemesh.llm.errors import LLMTimeout


def test_codes_are_unique_and_cover_every_error_class() -> None:
    codes = all_codes()  # raises if two classes share a code
    seen = {cls for cls in codes.values()}
    for name in ERROR_MODULES:
        module = sys.modules[name]
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, HivemeshError) and obj.__module__ == name:
                assert obj in seen, obj
                assert codes[obj.code] is obj


def test_every_documented_command_error_is_a_real_code() -> None:
    codes = set(all_codes()) | {"internal"}
    for cls in COMMANDS.values():
        assert set(cls.errors) <= codes, (cls.op, set(cls.errors) - codes)
    assert set(COMMON_ERRORS) <= codes


def test_lookup_by_code_not_by_name() -> None:
    assert error_class("unknown_peer") is UnknownPeer
    assert error_class("lease_unavailable") is LeaseUnavailable  # an application's
    assert error_class("llm_timeout") is LLMTimeout
    assert error_class(None) is HivemeshError
    # the type name is ignored: a renamed class still maps by its code
    exc = error_from_wire({"type": "SomethingElse", "code": "unknown_peer", "message": "m"})
    assert type(exc) is UnknownPeer and str(exc) == "m"
    # an unknown code stays visible as the code of a plain HivemeshError
    odd = error_from_wire({"type": "UnknownPeer", "code": "from_the_future", "message": "m"})
    assert type(odd) is HivemeshError and odd.code == "from_the_future"
    # a class whose constructor wants more keeps its category
    ahead = error_from_wire({"code": "clock_ahead", "message": "m"})
    assert isinstance(ahead, errors.RemoteProtocolError)


def test_the_taxonomy_knows_no_application() -> None:
    for name in ("LLMError", "LeaseLost", "ToolError", "FetchError", "SpoolFull"):
        assert not hasattr(errors, name), name
    code = (
        "import sys, hivemesh.errors, hivemesh.core.node, hivemesh.core.plan, "
        "hivemesh.core.lease_quorum, hivemesh.commands; "
        "print(sorted(m for m in sys.modules if m.startswith(('hivemesh.llm', "
        "'hivemesh.leases', 'hivemesh.telemetry', 'hivemesh.tools', 'hivemesh.webtools'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _answer_once(srv: socket.socket, answer: bytes) -> None:
    conn, _ = srv.accept()
    with conn:
        conn.makefile("rb").readline()
        conn.sendall(answer)


@pytest.fixture
def one_answer(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A unix socket at ``ctl.sock`` standing in for a daemon."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(tmp_path / "ctl.sock"))
    srv.listen(1)
    srv.settimeout(10)
    yield tmp_path, srv
    srv.close()


def test_client_raises_by_code(one_answer: tuple[Path, socket.socket]) -> None:
    data_dir, srv = one_answer
    answer = (
        b'{"id":1,"ok":false,"error":{"type":"NotTheName","code":"lease_unavailable",'
        b'"message":"held"}}\n'
    )
    server = threading.Thread(target=_answer_once, args=(srv, answer), daemon=True)
    server.start()
    with pytest.raises(LeaseUnavailable, match="held"):
        Client(data_dir, timeout_s=5).call("lease.show", resource="r")
    server.join(10)
