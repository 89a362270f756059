"""The MCP server of a node: tools and resources over the node's command table.

Theory of operation
-------------------
:class:`MeshMcp` is an MCP server (``mcp`` 2.x, the low-level
:class:`mcp.server.lowlevel.Server`, so the tool schemas come from the
command table rather than from Python signatures) in front of one running
node, reached through its control socket (:class:`~hivemesh.client.aio.AsyncClient`).

* **Tools** (:mod:`hivemesh.faces.mcp.tools`): a call is checked for size
  (:data:`MAX_ARGUMENT_BYTES`), turned into the typed command with
  ``Command.from_wire`` and run on the node. Its answer is the command's
  reply as JSON (text and structured content).
* **Errors by stable code.** A request that is refused for its form (an
  unknown tool, a wrong type, an unknown or missing field, an oversized or
  too deep payload: :class:`~hivemesh.errors.InvalidArgument` and its kinds)
  is a JSON-RPC error ``-32602`` (invalid params) whose ``data`` is
  ``{"code": <hivemesh code>}``; nothing reached the node's journal. A
  command that ran and failed (a contended lease, an unknown peer, a node
  that went away) is a tool result with ``isError`` and
  ``structuredContent = {"error": {"code", "message"}}``, so a model reads
  why. Both are counted by code in :attr:`MeshMcp.counters`.
* **Resources**: ``hivemesh://context/{name}`` (a context's state),
  ``hivemesh://plan`` (the goals) and ``hivemesh://plan/{goal}`` (a goal's
  tree and answer), each read with one command. ``hivemesh://mcp/stats`` is
  this server's counters.
* **Change notifications**, on the 2026 wire through ``subscriptions/listen``
  and for handshake-era clients through ``resources/subscribe``: one supervised task
  follows the node's ``events.watch`` stream (the node's bounded
  subscription) for context updates and plan events, and publishes
  ``notifications/resources/updated`` for the context that changed, and,
  after plan events (coalesced over :data:`PLAN_COALESCE_S`, and every
  :data:`PLAN_RECHECK_S` while a goal is unfinished), for each goal whose
  tree changed and for the plan index. The listen streams are bounded
  (:data:`MAX_LISTENERS`, :data:`MAX_BUFFERED_EVENTS` each: a client that
  stops reading loses its stream, as the MCP spec has it, and re-listens).
  Handshake-era subscriptions are bounded too (:data:`MAX_LISTENERS`
  sessions of :data:`MAX_SUBSCRIBED_URIS` URIs; their notifications wait in
  one queue of :data:`MAX_BUFFERED_EVENTS`, a full queue drops and counts
  ``dropped_notifications``), sent by a supervised task; a session that
  cannot be written to any more is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as t
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from hivemesh import __version__
from hivemesh.client.aio import AsyncClient
from hivemesh.commands import CtxGet, CtxWatch, EventsWatch, PlanShow
from hivemesh.commands import wire as wirejson
from hivemesh.core.plan_events import ALL_KINDS as PLAN_KINDS
from hivemesh.errors import (
    ConnectionClosed,
    HivemeshError,
    InputTooLarge,
    InvalidArgument,
    UnknownCommand,
)
from hivemesh.faces.mcp.tools import TOOLS, WATCH_SCHEMA, WATCH_TOOL, ToolSpec, input_schema
from hivemesh.faces.mcp.tools import tool_named as _tool_named
from hivemesh.runtime.supervise import RESTART, Supervisor, TaskFailed

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MAX_BUFFERED_EVENTS",
    "MAX_LISTENERS",
    "MAX_SUBSCRIBED_URIS",
    "PLAN_COALESCE_S",
    "PLAN_RECHECK_S",
    "RESOURCE_NOT_FOUND",
    "MeshMcp",
    "context_uri",
    "plan_uri",
]

log = logging.getLogger("hivemesh.faces.mcp")

#: The largest tool arguments accepted, as JSON (an event is at most 256 KiB).
MAX_ARGUMENT_BYTES = 128 * 1024
#: Open ``subscriptions/listen`` streams at once.
MAX_LISTENERS = 64
#: Notifications held per listen stream for a slow reader.
MAX_BUFFERED_EVENTS = 256
#: Resources one handshake-era session may subscribe to.
MAX_SUBSCRIBED_URIS = 256
#: Plan events within this window give one round of plan notifications.
PLAN_COALESCE_S = 0.1
#: While a goal is unfinished, its tree is checked this often even without
#: events (a settle window closing changes a status with no event).
PLAN_RECHECK_S = 1.0
#: The longest ``ctx_watch`` wait.
MAX_WATCH_S = 60.0

#: The JSON-RPC error code of an unknown resource (the MCP spec's).
RESOURCE_NOT_FOUND = -32002

_SCHEME = "hivemesh://"
_JSON = "application/json"
_CONTEXT_RE = re.compile(r"^hivemesh://context/([^/?#]{1,200})$")
_PLAN_RE = re.compile(r"^hivemesh://plan/([0-9a-f]{1,64})$")
_STATS_URI = "hivemesh://mcp/stats"
_PLAN_INDEX = "hivemesh://plan"


def context_uri(name: str) -> str:
    """The resource URI of context ``name``."""
    return f"{_SCHEME}context/{name}"


def plan_uri(goal: str | None = None) -> str:
    """The resource URI of goal ``goal``'s tree (or of the goals)."""
    return _PLAN_INDEX if goal is None else f"{_PLAN_INDEX}/{goal}"


def _json_text(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _digest(tree: Any) -> str:
    raw = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _refusal(exc: HivemeshError) -> MCPError:
    return MCPError(t.INVALID_PARAMS, str(exc), {"code": exc.code})


class MeshMcp:
    """An MCP server in front of the node whose control socket ``client`` reaches."""

    def __init__(self, client: AsyncClient, *, name: str = "hivemesh") -> None:
        self.client = client
        #: ``calls``, ``ok``, ``refused_<code>``, ``failed_<code>``, ``reads``,
        #: ``notified``, and the notifier's ``task_*`` counters
        self.counters: Counter[str] = Counter()
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(
            self.bus, max_subscriptions=MAX_LISTENERS, max_buffered_events=MAX_BUFFERED_EVENTS
        )
        self.failure: TaskFailed | None = None
        self._plan_dirty = asyncio.Event()
        #: handshake-era subscriptions: session -> URIs
        self._legacy: dict[Any, set[str]] = {}
        self._legacy_out: asyncio.Queue[tuple[Any, str]] = asyncio.Queue(MAX_BUFFERED_EVENTS)
        self.server: Server[Any] = Server(
            name,
            version=__version__,
            instructions=(
                "Tools and resources of a hivemesh node: shared context (keys, lists, "
                "counters, sets), direct messages, the leaderless planner, claims, leases "
                "with fencing tokens, metrics and escalations to a human."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscriptions_listen=self.listen,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
        )

    # -- tools -----------------------------------------------------------------------

    def tools(self) -> list[t.Tool]:
        """Every tool with its schema."""
        out = []
        for spec in (*TOOLS, WATCH_TOOL):
            schema = WATCH_SCHEMA if spec is WATCH_TOOL else input_schema(spec.command)
            out.append(
                t.Tool(
                    name=spec.name,
                    description=spec.description(),
                    input_schema=schema,
                    annotations=t.ToolAnnotations(read_only_hint=spec.read_only),
                )
            )
        return out

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: t.PaginatedRequestParams | None
    ) -> t.ListToolsResult:
        return t.ListToolsResult(tools=self.tools())

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: t.CallToolRequestParams
    ) -> t.CallToolResult:
        return await self.call(params.name, params.arguments)

    async def call(self, name: str, arguments: Any) -> t.CallToolResult:
        """Run tool ``name`` (see module docs); raises :class:`MCPError` for a refusal."""
        self.counters["calls"] += 1
        try:
            spec, request = self.request_of(name, arguments)
        except InvalidArgument as exc:
            self.counters[f"refused_{exc.code}"] += 1
            log.info("mcp: refused %s: %s [%s]", str(name)[:60], exc, exc.code)
            raise _refusal(exc) from None
        try:
            if spec is WATCH_TOOL:
                result = await self._watch(request, float((arguments or {}).get("timeout_s", 10)))
            else:
                result = (await self.client.run(request)).to_wire()
        except InvalidArgument as exc:  # refused by the node's own checks: nothing changed
            self.counters[f"refused_{exc.code}"] += 1
            raise _refusal(exc) from None
        except HivemeshError as exc:
            self.counters[f"failed_{exc.code}"] += 1
            error = {"code": exc.code, "message": str(exc)}
            return t.CallToolResult(
                content=[t.TextContent(type="text", text=f"{exc.code}: {exc}")],
                structured_content={"error": error},
                is_error=True,
            )
        self.counters["ok"] += 1
        structured = result if isinstance(result, dict) else {"result": result}
        return t.CallToolResult(
            content=[t.TextContent(type="text", text=_json_text(result))],
            structured_content=structured,
        )

    def request_of(self, name: Any, arguments: Any) -> tuple[ToolSpec, Any]:
        """The tool and the typed command a call of tool ``name`` runs, or the
        :class:`~hivemesh.errors.InvalidArgument` (of some kind) refusing it.
        Nothing is sent to the node."""
        spec = _tool_named(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownCommand(f"unknown tool {str(name)[:80]!r}")
        args = {} if arguments is None else arguments
        if not isinstance(args, dict):
            raise InvalidArgument(f"{spec.name}: arguments must be an object")
        wirejson.check(args, what=f"{spec.name} arguments")  # depth and text first
        try:
            size = len(json.dumps(args, ensure_ascii=False, allow_nan=False).encode("utf-8"))
        except (ValueError, TypeError) as exc:  # NaN, infinity, a value JSON cannot hold
            raise InvalidArgument(f"{spec.name}: arguments are not JSON data: {exc}") from None
        if size > MAX_ARGUMENT_BYTES:
            raise InputTooLarge(
                f"{spec.name}: arguments of {size} bytes (at most {MAX_ARGUMENT_BYTES})"
            )
        if spec is WATCH_TOOL:
            wait = args.get("timeout_s", 10)
            if isinstance(wait, bool) or not isinstance(wait, (int, float)):
                raise InvalidArgument("ctx_watch: timeout_s must be a number")
            if not 0 < wait <= MAX_WATCH_S:
                raise InvalidArgument(f"ctx_watch: timeout_s must be in (0, {MAX_WATCH_S:g}]")
            args = {k: v for k, v in args.items() if k != "timeout_s"}
        return spec, spec.command.from_wire(args)

    async def _watch(self, request: CtxWatch, wait_s: float) -> dict[str, Any]:
        stream = self.client.stream(request)
        try:
            first = await anext(stream)
            try:
                async with asyncio.timeout(wait_s):
                    ev = await anext(stream)
            except TimeoutError:
                return {"changed": False, "context": request.context, "state": first["state"]}
            except StopAsyncIteration:
                raise ConnectionClosed("the node ended the watch") from None
            return {"changed": True, **ev}
        finally:
            await stream.aclose()

    # -- resources -------------------------------------------------------------------

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: t.PaginatedRequestParams | None
    ) -> t.ListResourcesResult:
        out = [
            t.Resource(name="plan", uri=_PLAN_INDEX, mime_type="application/json"),
            t.Resource(name="mcp-stats", uri=_STATS_URI, mime_type="application/json"),
            t.Resource(
                name="context default", uri=context_uri("default"), mime_type="application/json"
            ),
        ]
        with contextlib.suppress(HivemeshError):  # a node without a plan lists none
            shown = (await self.client.run(PlanShow())).to_wire()
            for goal in shown.get("goals", [])[:100]:
                out.append(
                    t.Resource(
                        name=f"goal {goal}", uri=plan_uri(goal), mime_type="application/json"
                    )
                )
        return t.ListResourcesResult(resources=out)

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: t.PaginatedRequestParams | None
    ) -> t.ListResourceTemplatesResult:
        return t.ListResourceTemplatesResult(
            resource_templates=[
                t.ResourceTemplate(
                    name="context",
                    uri_template=f"{_SCHEME}context/{{name}}",
                    description="A shared context's state: kv, list, counter, gset, orset.",
                    mime_type="application/json",
                ),
                t.ResourceTemplate(
                    name="plan tree",
                    uri_template=f"{_PLAN_INDEX}/{{goal}}",
                    description="A goal's plan tree, its final answer and the plan's digest.",
                    mime_type="application/json",
                ),
            ]
        )

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: t.ReadResourceRequestParams
    ) -> t.ReadResourceResult:
        uri = str(params.uri)
        text = _json_text(await self.read(uri))
        return t.ReadResourceResult(
            contents=[t.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
        )

    async def read(self, uri: str) -> Any:
        """The JSON data of resource ``uri``; :class:`MCPError` if there is none."""
        self.counters["reads"] += 1
        try:
            if uri == _STATS_URI:
                return dict(self.counters)
            if uri == _PLAN_INDEX:
                shown = (await self.client.run(PlanShow())).to_wire()
                return {k: shown[k] for k in ("goals", "digest", "stats")}
            if m := _CONTEXT_RE.match(uri):
                return (await self.client.run(CtxGet(context=m.group(1)))).to_wire()
            if m := _PLAN_RE.match(uri):
                return (await self.client.run(PlanShow(goal=m.group(1)))).to_wire()
        except InvalidArgument as exc:
            self.counters[f"refused_{exc.code}"] += 1
            raise MCPError(RESOURCE_NOT_FOUND, str(exc), {"code": exc.code, "uri": uri}) from None
        except HivemeshError as exc:
            self.counters[f"failed_{exc.code}"] += 1
            raise MCPError(t.INTERNAL_ERROR, str(exc), {"code": exc.code, "uri": uri}) from None
        self.counters["refused_unknown_resource"] += 1
        raise MCPError(RESOURCE_NOT_FOUND, f"no resource {uri[:120]!r}", {"uri": uri[:200]})

    # -- change notifications --------------------------------------------------------

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: t.SubscribeRequestParams
    ) -> t.EmptyResult:
        uris = self._legacy.get(ctx.session)
        if uris is None:
            if len(self._legacy) >= MAX_LISTENERS:
                self.counters["refused_subscriptions_full"] += 1
                raise MCPError(t.INTERNAL_ERROR, "subscription limit reached")
            uris = self._legacy[ctx.session] = set()
        if len(uris) >= MAX_SUBSCRIBED_URIS:
            self.counters["refused_subscriptions_full"] += 1
            raise MCPError(t.INVALID_PARAMS, f"at most {MAX_SUBSCRIBED_URIS} subscriptions")
        uris.add(str(params.uri))
        return t.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: t.UnsubscribeRequestParams
    ) -> t.EmptyResult:
        self._legacy.get(ctx.session, set()).discard(str(params.uri))
        return t.EmptyResult()

    def _to_legacy(self, event: Any) -> None:
        """Bus listener: queue the event for every handshake-era subscriber."""
        uri = getattr(event, "uri", None)
        for session, uris in list(self._legacy.items()):
            if uri in uris:
                try:
                    self._legacy_out.put_nowait((session, uri))
                except asyncio.QueueFull:
                    self.counters["dropped_notifications"] += 1

    async def _send_legacy(self) -> None:
        while True:
            session, uri = await self._legacy_out.get()
            if session not in self._legacy:
                continue
            try:
                async with asyncio.timeout(5):
                    await session.send_resource_updated(uri)
            except Exception:  # a session that cannot be written to: forget it (counted)
                self.counters["subscriber_gone"] += 1
                self._legacy.pop(session, None)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Follow the node's changes (supervised) while the server runs."""
        sup = Supervisor(self.counters, self._fatal)
        sup.install(asyncio.get_running_loop())
        sup.spawn("mcp_events", self._follow_events, RESTART)
        sup.spawn("mcp_plan_notes", self._plan_notes, RESTART)
        sup.spawn("mcp_legacy_notes", self._send_legacy, RESTART)
        unsubscribe = self.bus.subscribe(self._to_legacy)
        try:
            yield
        finally:
            unsubscribe()
            self.listen.close()
            await sup.close()

    def _fatal(self, exc: TaskFailed) -> None:
        log.error("mcp: change notifications stopped: %s", exc)
        self.failure = exc

    async def _publish(self, uri: str) -> None:
        self.counters["notified"] += 1
        await self.bus.publish(ResourceUpdated(uri=uri))

    async def _follow_events(self) -> None:
        kinds = ("ctx.update", *sorted(PLAN_KINDS))
        async for ev in self.client.stream(EventsWatch(kinds=kinds)):
            if ev.get("kind") == "ctx.update":
                body = ev.get("body")
                name = body.get("c") if isinstance(body, dict) else None
                if isinstance(name, str):
                    await self._publish(context_uri(name))
            else:
                self._plan_dirty.set()
        raise ConnectionClosed("the node ended its event stream")

    async def _plan_notes(self) -> None:
        seen: dict[str, str] = {}  # goal -> digest of its tree, as last announced
        running = False  # a goal is unfinished: its status may change with time alone
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PLAN_RECHECK_S if running else None):
                    await self._plan_dirty.wait()
            await asyncio.sleep(PLAN_COALESCE_S)  # gather a burst of plan events into one round
            self._plan_dirty.clear()
            trees = (await self.client.run(PlanShow())).to_wire()["snapshot"]["goals"]
            running = any(t["status"] not in ("done", "failed", "cancelled") for t in trees)
            now = {t["id"]: _digest(t) for t in trees}
            changed = [g for g, d in now.items() if seen.get(g) != d]
            seen = now
            if changed:
                await self._publish(_PLAN_INDEX)
            for goal in changed:
                await self._publish(plan_uri(goal))
