"""The faces served over HTTP: localhost unless a token is set, then a bearer token.

The MCP server runs over streamable HTTP (a real socket, uvicorn) in front
of a real node; without the token a request is refused 401 (counted) and
nothing reaches the node; with it the official MCP client works. Binding
off localhost without a token is refused, by the library and by the CLI.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import hivemesh
from hivemesh.client.aio import AsyncClient
from hivemesh.commands import CtxGet
from hivemesh.errors import ConfigError
from hivemesh.faces.httpguard import check_binding, is_loopback
from hivemesh.faces.mcp import MeshMcp, serve_http

TOKEN = "s3cret-token"


def test_binding_rules() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback(host)
        check_binding(host, None)
    for host in ("0.0.0.0", "10.1.2.3", "example.org"):
        assert not is_loopback(host)
        with pytest.raises(ConfigError):
            check_binding(host, None)
        check_binding(host, TOKEN)


def test_mcp_over_http_requires_the_bearer_token(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "n") as node:
            face = MeshMcp(AsyncClient(node.config.data_dir))
            ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            server = asyncio.ensure_future(
                serve_http(face, port=0, token=TOKEN, on_ready=ready.set_result)
            )
            try:
                async with asyncio.timeout(20):
                    port = await asyncio.wait_for(asyncio.shield(ready), 15)
                    url = f"http://127.0.0.1:{port}/mcp"
                    body: dict[str, Any] = {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": "ctx_set", "arguments": {"key": "k", "value": 1}},
                    }
                    async with httpx.AsyncClient(timeout=10) as http:
                        bare = await http.post(url, json=body)
                        wrong = await http.post(
                            url, json=body, headers={"Authorization": "Bearer nope"}
                        )
                    assert bare.status_code == wrong.status_code == 401
                    assert face.counters["refused_http_unauthorized"] == 2
                    assert (await node.call(CtxGet())).to_wire() == {}  # nothing reached it

                    headers = {"Authorization": f"Bearer {TOKEN}"}
                    async with (
                        httpx2.AsyncClient(headers=headers, timeout=10) as h2,
                        Client(streamable_http_client(url, http_client=h2)) as mcp,
                    ):
                        names = {t.name for t in (await mcp.list_tools()).tools}
                        assert "ctx_set" in names
                        res = await mcp.call_tool("ctx_set", {"key": "k", "value": 1})
                        assert not res.is_error, res.content
                    got = (await node.call(CtxGet(key="k"))).to_wire()
                    assert got == {"key": "k", "found": True, "value": 1}
            finally:
                server.cancel()
                await asyncio.gather(server, return_exceptions=True)

    asyncio.run(main())


def test_cli_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    for face in (["mcp", "--http"], ["a2a"]):
        done = subprocess.run(
            [sys.executable, "-m", "hivemesh", *face, "--host", "0.0.0.0"],
            env={"PYTHONPATH": src, "HIVEMESH_DATA_DIR": str(tmp_path / "none")},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 1 and "a token is required" in done.stderr, done.stderr
