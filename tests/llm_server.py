"""A scripted OpenAI-compatible chat server on 127.0.0.1 for tests (real HTTP).

Speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) to serve
``POST /v1/chat/completions`` and ``GET /v1/models``. What each completion
returns is scripted: a list consumed in order, or a responder function of the
parsed request. A scripted step is one of:

* ``str`` or a JSON value -- the assistant message content (values are
  serialised with :func:`json.dumps`);
* ``Step(...)`` -- full control: HTTP status, raw body bytes, a delay before
  answering, ``hang`` (never answer), ``close`` (drop the connection).

Every completion request body is recorded in :attr:`ScriptedServer.requests`
and every request's (lower-cased) headers in :attr:`ScriptedServer.headers`.

Use inside a running loop (``async with ScriptedServer(...) as srv``), or from
synchronous code and other processes with :meth:`ScriptedServer.in_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ScriptedServer", "Step"]


@dataclass
class Step:
    """One scripted answer."""

    content: Any = None
    status: int = 200
    raw: bytes | None = None
    delay_s: float = 0.0
    hang: bool = False
    close: bool = False
    prompt_tokens: int = 11
    completion_tokens: int = 7


Responder = Callable[[dict[str, Any]], Any]


class ScriptedServer:
    """An asyncio HTTP server answering chat completions from a script."""

    def __init__(self, script: list[Any] | Responder | None = None) -> None:
        self._responder = script if callable(script) else None
        self._script: list[Any] = [] if callable(script) or script is None else list(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None
        self._hung: list[asyncio.Event] = []
        self.port = 0

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *steps: Any) -> None:
        """Append steps to the script."""
        self._script.extend(steps)

    async def start(self) -> None:
        """Listen on an ephemeral loopback port."""
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and release hung requests."""
        for ev in self._hung:
            ev.set()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def __aenter__(self) -> ScriptedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @classmethod
    @contextlib.contextmanager
    def in_thread(cls, script: list[Any] | Responder | None = None) -> Iterator[ScriptedServer]:
        """Run a server on its own loop in a daemon thread for the ``with`` block."""
        srv = cls(script)
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(srv.start())
            ready.set()
            loop.run_forever()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        if not ready.wait(10):
            raise RuntimeError("scripted LLM server did not start")
        try:
            yield srv
        finally:

            async def shutdown() -> None:
                await srv.stop()
                # connections still open (clients in other processes): end them
                # here rather than leave pending tasks to a garbage-collected loop
                tasks = [x for x in asyncio.all_tasks() if x is not asyncio.current_task()]
                for x in tasks:
                    x.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            t.join(5)
            if not t.is_alive():
                loop.close()

    def _next(self, request: dict[str, Any]) -> Step:
        if self._responder is not None:
            item = self._responder(request)
        elif self._script:
            item = self._script.pop(0)
        else:
            item = Step(status=500, raw=b'{"error": "script exhausted"}')
        if isinstance(item, Step):
            return item
        return Step(content=item)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.headers.append(headers)
                if not await self._handle(method, path, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        if method == "GET" and path.endswith("/models"):
            self._send(writer, 200, json.dumps({"data": [{"id": "scripted"}]}).encode())
            return True
        if method != "POST" or not path.endswith("/chat/completions"):
            self._send(writer, 404, b'{"error": "not found"}')
            return True
        try:
            request = json.loads(body)
        except ValueError:
            self._send(writer, 400, b'{"error": "bad json"}')
            return True
        self.requests.append(request)
        step = self._next(request)
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        if step.hang:
            ev = asyncio.Event()
            self._hung.append(ev)
            await ev.wait()
            return False
        if step.close:
            return False
        if step.raw is not None:
            payload = step.raw
        else:
            content = step.content if isinstance(step.content, str) else json.dumps(step.content)
            payload = json.dumps(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "model": request.get("model", ""),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": step.prompt_tokens,
                        "completion_tokens": step.completion_tokens,
                        "total_tokens": step.prompt_tokens + step.completion_tokens,
                    },
                }
            ).encode()
        self._send(writer, step.status, payload)
        return True

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, payload: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Status")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n".encode()
            + payload
        )
