"""The dashboard's live picture of one node: which command answers each
section, and when to ask again.

Theory of operation
-------------------
Every section of the page is the answer of typed commands of
:mod:`hivemesh.commands`, asked through a
:class:`~hivemesh.faces.dashboard.source.Source`, trimmed to what the page
draws and published to the :class:`~hivemesh.faces.dashboard.hub.Hub`:

========== ==================================================================
section    commands
========== ==================================================================
node       ``status``
peers      ``peers``, ``status`` (members), ``ping`` (round-trip time)
plan       ``plan.show`` (the goals), then ``plan.show goal=...`` per goal
audit      ``audit.status``, ``audit.inbox all=true``
context    ``ctx.contexts``, then ``ctx.get`` per context
alerts     ``metrics what=alerts``
telemetry  ``metrics what=top`` by agent and by tool; ``metrics what=query``
           for latency percentiles and tool failures over time
events     the last journal events seen on the stream
========== ==================================================================

**When.** Three supervised loops (:mod:`hivemesh.runtime.supervise`):

* ``watch`` reads the node's stream of new journal events (``events.watch``,
  the node's subscription; its queue in the daemon is bounded and counts
  what it drops, which the periods below make up for). An event marks the
  sections it changes stale by its kind (``plan.*`` the plan, ``audit.*``
  the audit, ``ctx.*`` the context, ``member.*``/``name.*`` the peers) and
  wakes the refresher. If
  the stream ends (the daemon stopped), the loop fails and the supervisor
  opens it again after a backoff.
* ``refresh`` asks again for every section whose period (:data:`PERIOD_S`)
  has passed, and for every stale section at once -- unless it was asked
  for less than ``min_interval_s`` ago, then as soon as that has passed: a
  burst of events costs one round of commands per section. The sections of
  one round are asked concurrently, each under the source's deadline. A
  command that fails puts ``{"error": code, "message"}`` in its section
  (a node without a collector has no telemetry: the page says so).
* ``ping`` measures the round-trip time to each peer that is up
  (``ping``, a few at a time, each with a deadline) every ``ping_every_s``.

Nothing here keeps state of its own beyond the last answers: a dashboard
started late shows what the node shows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hivemesh import commands as c
from hivemesh.core.identity import address_of
from hivemesh.errors import HivemeshError, InvalidAddress
from hivemesh.faces.dashboard.hub import Hub
from hivemesh.faces.dashboard.source import Source
from hivemesh.runtime.supervise import Policy, Supervisor

__all__ = ["COST_WEIGHTS", "PERIOD_S", "SECTIONS", "Live"]

#: Every section of the page, in the order the page lays them out.
SECTIONS = ("node", "peers", "plan", "audit", "context", "alerts", "telemetry", "events")
#: How often each section is asked for again without an event (seconds).
PERIOD_S = {
    "node": 1.0,
    "peers": 1.0,
    "plan": 5.0,
    "audit": 3.0,
    "context": 5.0,
    "alerts": 2.0,
    "telemetry": 2.0,
}
#: Journal event kinds (by prefix) -> the section they change.
STALE_BY_KIND = (
    ("plan.", "plan"),
    ("audit.", "audit"),
    ("ctx.", "context"),
    ("member.", "peers"),
    ("name.", "peers"),
)
#: The cost proxy per agent: input and output tokens weighted (output tokens
#: cost several times more than input tokens at most LLM providers).
COST_WEIGHTS = (1.0, 4.0)
#: The loops' policy: a daemon that is away for a while is retried, not fatal.
LOOP_POLICY = Policy(restart=True, max_restarts=10_000, backoff_min_s=0.5, backoff_max_s=5.0)

_MAX_GOALS = 12
_MAX_CONTEXTS = 8
_MAX_KEYS = 100
_MAX_PREVIEW = 160
_MAX_ALERTS = 30
_RECENT_EVENTS = 30
_BUCKET_MS = 2_000
_WINDOW_MS = 15 * 60_000
_PING_CONCURRENCY = 4


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _MAX_PREVIEW else text[: _MAX_PREVIEW - 1] + "…"


def _rows(answer: Any) -> list[dict[str, Any]]:
    """A ``metrics`` table answer (``{columns, rows}``) as a list of records."""
    if not isinstance(answer, dict):
        return []
    cols = answer.get("columns") or []
    return [dict(zip(cols, row, strict=False)) for row in answer.get("rows") or []]


def _with_addresses(node: dict[str, Any]) -> dict[str, Any]:
    """A plan tree whose claims and results also name their author's address
    (the plan view names authors by public key, the peers list by address)."""
    for item in [*(node.get("claims") or []), node.get("result") or {}]:
        key = item.get("author")
        if isinstance(key, str):
            try:
                item["address"] = address_of(bytes.fromhex(key))
            except (ValueError, InvalidAddress):
                item["address"] = None
    for child in node.get("children") or []:
        _with_addresses(child)
    return node


def _failed(exc: HivemeshError) -> dict[str, Any]:
    return {"error": exc.code, "message": str(exc)[:300]}


#: Latency percentiles and tool failures per time bucket over the last
#: window of records (the window ends at the newest record the collector
#: stored, so the dashboard needs no clock of its own).
LATENCY_SQL = (
    f"SELECT (ts_ms // {_BUCKET_MS}) * {_BUCKET_MS} AS t, count(*) AS n,"
    " round(quantile_cont(value, 0.5), 3) AS p50,"
    " round(quantile_cont(value, 0.9), 3) AS p90,"
    " round(quantile_cont(value, 0.99), 3) AS p99,"
    " count(*) FILTER (WHERE kind = 'tool_call') AS tool_calls,"
    " count(*) FILTER (WHERE kind = 'tool_call' AND NOT ok) AS tool_failures"
    " FROM metrics WHERE unit = 'ms'"
    " AND kind IN ('llm_call', 'tool_call', 'task', 'timer')"
    f" AND ts_ms >= (SELECT max(ts_ms) FROM metrics) - {_WINDOW_MS}"
    " GROUP BY t ORDER BY t"
)


class Live:
    """Keeps the hub's sections fresh from ``source`` (see module docs)."""

    def __init__(
        self,
        source: Source,
        hub: Hub,
        *,
        min_interval_s: float = 0.25,
        ping_every_s: float = 5.0,
        ping_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.hub = hub
        self.min_interval_s = min_interval_s
        self.ping_every_s = ping_every_s
        self.ping_timeout_s = ping_timeout_s
        self._clock = clock
        self._stale: set[str] = set(PERIOD_S)
        self._asked: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._rtt: dict[str, float | None] = {}
        self._up: list[str] = []
        self._goal_order: list[str] = []
        self._recent: deque[dict[str, Any]] = deque(maxlen=_RECENT_EVENTS)
        #: events seen on the stream, streams opened
        self.events_seen = 0
        self.streams_opened = 0

    def start(self, supervisor: Supervisor) -> None:
        """Run the three loops under ``supervisor``."""
        supervisor.spawn("dashboard_watch", self.watch, LOOP_POLICY)
        supervisor.spawn("dashboard_refresh", self.refresh, LOOP_POLICY)
        supervisor.spawn("dashboard_ping", self.ping, LOOP_POLICY)

    def mark_stale(self, section: str) -> None:
        """Ask for ``section`` again in the next round (after a write, say)."""
        self._stale.add(section)
        self._wake.set()

    # -- the loops ---------------------------------------------------------------

    async def watch(self) -> None:
        """Read the node's event stream until it ends (module docs)."""
        self.streams_opened += 1
        # what happened while no stream was open is asked for again
        self._stale.update(PERIOD_S)
        async for ev in self.source.watch():
            self.events_seen += 1
            kind = str(ev.get("kind", ""))
            for prefix, section in STALE_BY_KIND:
                if kind.startswith(prefix):
                    self._stale.add(section)
            self._recent.appendleft(
                {
                    "kind": kind,
                    "author": str(ev.get("author", ""))[:12],
                    "seq": ev.get("seq"),
                    "hlc": ev.get("hlc"),
                }
            )
            self._stale.add("events")
            self._wake.set()
        raise HivemeshError("the node's event stream ended")  # restarted by the supervisor

    async def refresh(self) -> None:
        """Ask for stale and due sections, round after round (module docs)."""
        while True:
            self._wake.clear()
            now = self._clock()
            due = {s for s, p in PERIOD_S.items() if now - self._asked.get(s, -1e9) >= p}
            due |= {s for s in self._stale if now - self._asked.get(s, -1e9) >= self.min_interval_s}
            self._stale -= due
            for s in due:
                self._asked[s] = now
            if due:
                names = sorted(due)
                answers = await asyncio.gather(*(self._fetch(s) for s in names))
                for name, data in zip(names, answers, strict=True):
                    self.hub.publish(name, data)
            wait_s = self._next_round() - self._clock()
            if wait_s <= 0:
                await asyncio.sleep(0)  # let the stream and the pages run
                continue
            try:
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _next_round(self) -> float:
        """When the next section falls due: its period, or a stale one's
        ``min_interval_s`` after it was last asked for."""
        times = [self._asked.get(s, -1e9) + p for s, p in PERIOD_S.items()]
        times += [self._asked.get(s, -1e9) + self.min_interval_s for s in self._stale]
        return min(times)

    async def ping(self) -> None:
        """Measure the round-trip time to every peer that is up (module docs)."""
        gate = asyncio.Semaphore(_PING_CONCURRENCY)

        async def one(address: str) -> None:
            async with gate:
                try:
                    reply = await self.source.run(
                        c.Ping(address=address, timeout_s=self.ping_timeout_s)
                    )
                    rtt = getattr(reply, "rtt_ms", None)
                    self._rtt[address] = float(rtt) if isinstance(rtt, (int, float)) else None
                except HivemeshError:
                    self._rtt[address] = None

        while True:
            up = list(self._up)
            await asyncio.gather(*(one(a) for a in up))
            for gone in set(self._rtt) - set(up):
                del self._rtt[gone]
            if up:
                self.mark_stale("peers")
            await asyncio.sleep(self.ping_every_s)

    # -- the sections ------------------------------------------------------------

    async def _fetch(self, section: str) -> Any:
        try:
            return await getattr(self, f"_{section}")()
        except HivemeshError as exc:
            return _failed(exc)

    async def _record(self, request: c.Command) -> Any:
        return getattr(await self.source.run(request), "data", None)

    async def _events(self) -> dict[str, Any]:
        return {"recent": list(self._recent), "seen": self.events_seen}

    async def _node(self) -> dict[str, Any]:
        st = await self._record(c.Status())
        journal = st.get("journal") or {}
        members = st.get("members") or {}
        return {
            "label": self.source.label,
            "address": st.get("address"),
            "names": st.get("names") or [],
            "listen": st.get("listen"),
            "uptime_s": st.get("uptime_s"),
            "rehydrating": st.get("rehydrating"),
            "events": journal.get("events"),
            "feeds": journal.get("feeds"),
            "own_seq": journal.get("own_seq"),
            "peers_connected": st.get("peers_connected"),
            "members": len(members),
            "members_up": sum(1 for m in members.values() if m.get("state") == "up"),
            "detection_bound_ms": st.get("detection_bound_ms"),
            "trust_mode": (st.get("trust") or {}).get("mode"),
            "dropped_total": st.get("dropped_total"),
            "dashboard": {
                "clients": self.hub.clients,
                "events_seen": self.events_seen,
                "streams_opened": self.streams_opened,
                **dict(self.hub.counters),
            },
        }

    async def _peers(self) -> list[dict[str, Any]]:
        peers = await self._record(c.Peers())
        out = []
        for p in peers or []:
            ch = p.get("channel")
            link: dict[str, Any] = {"type": "none (known through gossip)"}
            if ch:
                link = {
                    # the link's path in words: direct TCP, direct UDP (QUIC), punched,
                    # relayed via <relay>; every one of them carries a Noise channel
                    "type": p.get("path") or "direct TCP",
                    "direction": ch.get("direction"),
                    "endpoint": ch.get("endpoint"),
                    "since_s": ch.get("since_s"),
                    "bytes_in": ch.get("bytes_in"),
                    "bytes_out": ch.get("bytes_out"),
                    "send_queue_frames": ch.get("send_queue_frames"),
                    "frames_dropped": ch.get("frames_dropped"),
                }
            out.append(
                {
                    "address": p.get("address"),
                    "names": p.get("names") or [],
                    "state": "revoked" if p.get("revoked") else p.get("state"),
                    "endpoints": p.get("endpoints") or [],
                    "link": link,
                    # QUIC's smoothed RTT when the link has one, else our own ping's
                    "rtt_ms": p.get("rtt_ms") or self._rtt.get(str(p.get("address"))),
                }
            )
        linked = [p for p in out if p["state"] == "up" and "direction" in p["link"]]
        self._up = [str(p["address"]) for p in linked]
        return out

    async def _plan(self) -> dict[str, Any]:
        # Every plan.show answer lists the goals; only the one without a goal
        # carries the whole plan's snapshot, so it is asked only while no goal
        # is known, and the goals are learnt from the trees' answers after.
        shown: dict[str, Any] = {}
        if not self._goal_order:
            shown = await self._record(c.PlanShow())
            self._learn_goals(shown)
        answers: dict[str, dict[str, Any]] = {}
        while todo := [g for g in self._newest_goals() if g not in answers]:
            for g in todo:
                try:
                    one = await self._record(c.PlanShow(goal=g))
                except HivemeshError as exc:
                    answers[g] = {"id": g, **_failed(exc)}
                    continue
                shown = one
                self._learn_goals(one)
                tree = one.get("tree")
                if isinstance(tree, dict):
                    _with_addresses(tree)
                answers[g] = {"id": g, "tree": tree, "answer": one.get("answer")}
        return {
            "goals": len(shown.get("goals") or self._goal_order),
            "shown": [answers[g] for g in self._newest_goals()],
            "digest": shown.get("digest"),
            "nodes": (shown.get("stats") or {}).get("nodes") or {},
        }

    def _learn_goals(self, shown: Any) -> None:
        for g in (shown or {}).get("goals") or []:
            if isinstance(g, str) and g not in self._goal_order:
                self._goal_order.append(g)

    def _newest_goals(self) -> list[str]:
        """The goals to show: the last learnt first (at start, in id order)."""
        return list(reversed(self._goal_order))[:_MAX_GOALS]

    async def _audit(self) -> dict[str, Any]:
        status = await self._record(c.AuditStatus())
        inbox = await self._record(c.AuditInbox(all=True))
        return {"status": status, "questions": (inbox or {}).get("questions") or []}

    async def _context(self) -> dict[str, Any]:
        listed = (await self._record(c.CtxContexts())).get("contexts") or {}
        names = sorted(listed, key=lambda n: (n != "default", n))[:_MAX_CONTEXTS]
        out = []
        for name in names:
            state = await self._record(c.CtxGet(context=name)) or {}
            # {kind: {name: value}}: registers (kv), lists, counters, texts, sets
            items = sorted(
                (key, kind, value)
                for kind, entries in state.items()
                if isinstance(entries, dict)
                for key, value in entries.items()
            )
            out.append(
                {
                    "context": name,
                    "keys": len(items),
                    "items": [
                        {"key": k, "type": kind, "value": _short(v)}
                        for k, kind, v in items[:_MAX_KEYS]
                    ],
                }
            )
        return {"contexts": out, "total": len(listed)}

    async def _alerts(self) -> dict[str, Any]:
        alerts = await self._record(c.MetricsQuery(what="alerts", all=True))
        alerts = alerts if isinstance(alerts, list) else []
        return {
            "firing": sum(1 for a in alerts if a.get("status") == "firing"),
            "alerts": alerts[:_MAX_ALERTS],
        }

    async def _telemetry(self) -> dict[str, Any]:
        agents = _rows(await self._record(c.MetricsQuery(what="top", by="agent", limit=20)))
        w_in, w_out = COST_WEIGHTS
        for a in agents:
            a["cost"] = w_in * (a.get("input_tokens") or 0) + w_out * (a.get("output_tokens") or 0)
        tools = _rows(await self._record(c.MetricsQuery(what="top", by="tool", limit=20)))
        series = _rows(await self._record(c.MetricsQuery(what="query", sql=LATENCY_SQL)))
        return {
            "available": True,
            "agents": agents,
            "tools": [t for t in tools if t.get("tool")],
            "latency": series,
            "bucket_ms": _BUCKET_MS,
            "cost_weights": list(COST_WEIGHTS),
        }
