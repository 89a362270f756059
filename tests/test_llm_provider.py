"""OpenAI-compatible provider against a real scripted HTTP server on loopback."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.errors import ConfigError
from hivemesh.llm import (
    LLMConfig,
    OpenAICompatProvider,
    RetryPolicy,
    ScriptedLLM,
    extract_json,
    provider_from_config,
)
from hivemesh.llm.errors import (
    LLMBadOutput,
    LLMHTTPError,
    LLMNotConfigured,
    LLMTimeout,
    LLMUnavailable,
)
from llm_server import ScriptedServer, Step

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "hi"}]
Usage = list[tuple[str, int, int, float, bool]]


def run(
    script: list[Any],
    body: Callable[[OpenAICompatProvider, ScriptedServer], Awaitable[Any]],
    *,
    attempts: int = 3,
    timeout_s: float = 5.0,
) -> tuple[Any, ScriptedServer, Usage]:
    usage: Usage = []

    async def main() -> Any:
        async with ScriptedServer(script) as srv:
            cfg = LLMConfig(base_url=srv.base_url, model="m1", api_key="k", timeout_s=timeout_s)
            prov = OpenAICompatProvider(
                cfg,
                on_usage=lambda *a: usage.append(a),
                rng=random.Random(1),
                policy=RetryPolicy(max_attempts=attempts, backoff_base_s=0.01),
            )
            async with prov:
                return await body(prov, srv), srv

    out, srv = asyncio.run(main())
    return out, srv, usage


def test_structured_reply_parsed_and_usage_recorded() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        return await p.complete(MSGS, schema=SCHEMA)

    res, srv, usage = run([{"answer": "yes", "n": 3}], body)
    assert res.parsed == {"answer": "yes", "n": 3} and res.attempts == 1
    assert (res.input_tokens, res.output_tokens) == (11, 7)
    assert usage == [("m1", 11, 7, usage[0][3], True)] and usage[0][3] > 0
    req = srv.requests[0]
    assert req["model"] == "m1" and req["response_format"] == {"type": "json_object"}
    assert srv.headers[0]["authorization"] == "Bearer k"


def test_malformed_then_off_schema_then_valid_feeds_errors_back() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        return await p.complete(MSGS, schema=SCHEMA)

    script = [
        "{not json",
        '```json\n{"answer": "x", "n": -1}\n```',
        'Sure! {"answer": "x", "n": 2}',
    ]
    res, srv, usage = run(script, body)
    assert res.parsed == {"answer": "x", "n": 2} and res.attempts == 3
    second, third = srv.requests[1]["messages"], srv.requests[2]["messages"]
    assert second[-2] == {"role": "assistant", "content": "{not json"}
    assert "not JSON" in second[-1]["content"]
    assert "at n" in third[-1]["content"] and "minimum" in third[-1]["content"]
    assert [u[4] for u in usage] == [False, False, True]


def test_bad_output_exhausts_attempts() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        with pytest.raises(LLMBadOutput):
            await p.complete(MSGS, schema=SCHEMA)

    _, srv, _ = run(["nope", "nope", "nope"], body)
    assert len(srv.requests) == 3


def test_http_500_retried_then_ok_and_400_is_final() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        res = await p.complete(MSGS)
        with pytest.raises(LLMHTTPError) as info:
            await p.complete(MSGS)
        return res, info.value.status

    script = [
        Step(status=500, raw=b"oops"),
        Step(status=503, raw=b"busy"),
        "plain",
        Step(status=400, raw=b"bad"),
    ]
    (res, status), srv, usage = run(script, body)
    assert res.text == "plain" and res.attempts == 3 and status == 400
    assert len(srv.requests) == 4 and [u[4] for u in usage] == [False, False, True, False]


def test_timeout_is_typed_and_retried() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        with pytest.raises(LLMTimeout):
            await p.complete(MSGS, timeout_s=0.2)
        return await p.complete(MSGS, timeout_s=2)

    res, srv, _ = run(
        [Step(hang=True), Step(delay_s=1.0, content="slow"), "fast"], body, attempts=2
    )
    assert res.text == "fast" and len(srv.requests) == 3


def test_dropped_connection_and_garbled_payload_are_retried() -> None:
    async def body(p: OpenAICompatProvider, srv: ScriptedServer) -> Any:
        return await p.complete(MSGS)

    res, _srv, _ = run([Step(close=True), Step(raw=b'{"choices": []}'), "ok"], body)
    assert res.text == "ok" and res.attempts == 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_unavailable_and_says_so() -> None:
    port = _closed_port()

    async def main() -> None:
        cfg = LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2)
        async with OpenAICompatProvider(cfg, policy=RetryPolicy(2, backoff_base_s=0.01)) as p:
            with pytest.raises(LLMUnavailable, match=f"connection refused to 127.0.0.1:{port}"):
                await p.complete(MSGS)

    asyncio.run(main())


def test_a_silent_server_is_a_timeout_that_names_the_endpoint() -> None:
    with socket.socket() as listener:  # accepts (the kernel does), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        async def main() -> None:
            cfg = LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=0.3)
            async with OpenAICompatProvider(cfg, policy=RetryPolicy(1)) as p:
                with pytest.raises(LLMTimeout, match=f"127.0.0.1:{port}"):
                    await p.complete(MSGS)

        asyncio.run(main())


def test_the_plan_command_shows_why_the_llm_is_unreachable() -> None:
    """What the user sees: the CLI, as a separate process, against a closed port."""
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env.update(PYTHONPATH=SRC, HIVEMESH_LLM_MAX_ATTEMPTS="1")
    url = f"http://127.0.0.1:{port}/v1"
    cmd = [sys.executable, "-m", "hivemesh", "plan", "--in-process", "--timeout-s", "10"]
    out = subprocess.run(
        [*cmd, "--base-url", url, "--model", "m", "Plan a trip"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert f"connection refused to 127.0.0.1:{port}" in out.stdout + out.stderr
    assert "All connection attempts failed" not in out.stdout + out.stderr


def test_config_resolution_and_missing_config_explains() -> None:
    env = {"HIVEMESH_LLM_BASE_URL": "http://h:1/v1/", "HIVEMESH_LLM_MODEL": "env-model"}
    cfg = LLMConfig.resolve({"model": "file-model", "api_key": "fk"}, env, model="flag-model")
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://h:1/v1", "flag-model", "fk")
    assert LLMConfig.resolve({"base_url": "http://x/v1", "model": "f"}, {}).model == "f"
    with pytest.raises(LLMNotConfigured) as info:
        LLMConfig.resolve(None, {})
    assert "HIVEMESH_LLM_BASE_URL" in str(info.value)
    with pytest.raises(ConfigError):
        LLMConfig.resolve(None, {**env, "HIVEMESH_LLM_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError):
        LLMConfig.resolve(None, {"HIVEMESH_LLM_BASE_URL": "ftp://x", "HIVEMESH_LLM_MODEL": "m"})
    assert isinstance(provider_from_config(cfg), OpenAICompatProvider)


def test_extract_json_and_scripted_stub() -> None:
    assert extract_json("```\n[1, 2]\n```") == [1, 2]
    assert extract_json('noise {"a": {"b": 1}} tail') == {"a": {"b": 1}}
    with pytest.raises(ValueError):
        extract_json("no json here")

    async def main() -> None:
        stub = ScriptedLLM(["bad", {"answer": "a", "n": 1}])
        res = await stub.complete(MSGS, schema=SCHEMA)
        assert res.parsed["n"] == 1 and res.attempts == 2

    asyncio.run(main())


def test_server_in_thread_serves_sync_clients() -> None:
    import httpx

    with ScriptedServer.in_thread(lambda req: {"echo": req["model"]}) as srv:
        r = httpx.post(f"{srv.base_url}/chat/completions", json={"model": "zz", "messages": []})
        assert r.json()["choices"][0]["message"]["content"] == '{"echo": "zz"}'


def test_gguf_provider_with_a_stand_in_llama_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The llama-cpp-python extra is not installed here: a stand-in module
    checks what the provider sends and how it reads the reply."""
    import sys
    import types

    seen: list[dict[str, Any]] = []

    class Llama:
        def __init__(self, model_path: str, n_ctx: int, verbose: bool) -> None:
            self.path = model_path

        def create_chat_completion(self, **kw: Any) -> dict[str, Any]:
            seen.append(kw)
            text = "oops" if len(seen) == 1 else '{"answer": "local", "n": 1}'
            return {
                "choices": [{"message": {"content": text}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3},
            }

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Llama))
    cfg = LLMConfig.resolve(None, {"HIVEMESH_LLM_GGUF": "/models/tiny.gguf"})
    prov = provider_from_config(cfg)
    res = asyncio.run(prov.complete(MSGS, schema=SCHEMA))
    assert res.parsed == {"answer": "local", "n": 1} and res.attempts == 2
    assert seen[0]["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert prov.model == "tiny.gguf"


def test_gguf_provider_without_the_extra_explains() -> None:
    import sys

    if "llama_cpp" in sys.modules or __import__("importlib").util.find_spec("llama_cpp"):
        pytest.skip("llama-cpp-python is installed")
    cfg = LLMConfig(gguf_path="/models/tiny.gguf")
    with pytest.raises(ConfigError, match="llama-cpp-python"):
        asyncio.run(provider_from_config(cfg).complete(MSGS))
