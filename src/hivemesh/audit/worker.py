"""The audit executor: leases a shop, reads its pages with MCP tools, submits.

Theory of operation
-------------------
An :class:`AuditExecutor` runs on one node. It follows the latest audit in
its :class:`~hivemesh.audit.view.AuditView` and works the published shops
that are neither done nor waiting for the operator, up to
``max_concurrent`` at once, each under a **lease** ``audit.<id>.<shop>``
(the swarm's embedded quorum; renewed every third of its TTL). A shop
someone else holds is skipped (the lease refuses it); a lease that cannot
be renewed cancels the work on that shop.

A shop is a sequence of *steps*, one per catalogue page, through the MCP
web tools: ``fetch_page`` reads the page in one call (its prices, next page
and DOM snapshot, whose canonical HTML becomes a content-addressed blob);
when it finds no prices the HTML comes back and ``extract_prices`` tries
other strategies on it, without fetching again. Every call is a ``tool.call``
event, every outcome a ``tool.result`` event (tool, arguments digest,
duration, outcome, error code, blob hash; the extraction's products), and a
telemetry record. A failed call waits for the reflector's correction
(``audit.correction``; :mod:`hivemesh.roles.reflector`) and applies it:
wait and retry, switch route, try another extraction strategy, or stop and
leave the shop to the operator (escalation) or to another holder (abandon).
If no correction arrives within ``reflect_wait_s`` (no reflector alive), the
executor applies the same deterministic rules itself (:func:`~hivemesh.audit.rules.decide`)
and journals them, so the audit never stalls on a dead reflector.

**Takeover by replay.** Before working a shop the executor replays what
earlier holders journaled (:meth:`AuditView.replay`): pages whose
``extract_prices`` result another node acknowledged are taken as they are,
and the route that worked is reused; only the other pages are fetched. An
``audit.takeover`` event says what was reused and what is redone. A lease
whose fencing token is not the first had an earlier holder: the executor
first pulls what a majority of the voters holds (``sync.majority``), and if
it still sees no step of that holder (paused or killed before its events
left it), the takeover is journaled with an empty ``from``.

**Fencing.** The prices are submitted to the market database with the
lease's fencing token; a holder that was paused until its lease expired is
refused there (``stale_fencing_token``), journals the refusal and gives up
the shop. Accepted prices go into shared context ``audit-<id>`` (key = shop)
and the ``done`` grow-only set, and an ``audit.shop`` event records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from hivemesh.audit import events as ev
from hivemesh.audit.live import LiveView
from hivemesh.audit.rules import Correction, Limits, decide
from hivemesh.audit.view import Audit
from hivemesh.commands import SyncMajority
from hivemesh.core.hlc import LOGICAL_BITS
from hivemesh.errors import HivemeshError
from hivemesh.leases import Lease, LeaseClient
from hivemesh.leases.errors import LeaseUnavailable
from hivemesh.telemetry.schema import ATTR_ERROR_TYPE

__all__ = ["AuditExecutor", "ExecutorOptions", "Tools", "escalation_id"]

log = logging.getLogger("hivemesh.audit.executor")

MAX_PAGES = 50


class Tools(Protocol):
    """What the executor calls tools through (an :class:`~hivemesh.tools.mcp_client.MCPToolSet`)."""

    async def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> Any:
        """One call; a ``ToolResult`` (``is_error``, ``reason``, ``structured``)."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    """Knobs of an :class:`AuditExecutor`."""

    max_concurrent: int = 4
    lease_ttl_ms: int = 4000
    tool_timeout_s: float = 20.0
    #: How long a failed call waits for the reflector before deciding alone.
    reflect_wait_s: float = 3.0
    #: The MCP server name of the web tools (tools are ``<server>.<tool>``).
    server: str = "web"
    limits: Limits = field(default_factory=Limits)
    #: Test hook: stop this process (SIGSTOP) right before submitting this shop.
    pause_before_submit: str = ""
    #: How long a holder of a lease with an earlier token (a takeover) waits
    #: for the majority's journal before it replays the shop's progress.
    catch_up_s: float = 2.0
    #: Skip a shop whose last tool event by another node is younger than this.
    busy_ms: int = 1500
    #: A tool of any other MCP server that takes a knowledge-graph entity
    #: ``{"entities": [{name, entityType, observations}]}`` (the npm memory
    #: server's ``create_entities``): each audited shop is noted there.
    notes_tool: str = ""


class _Stop(Exception):
    """The shop is left: parked for the operator, abandoned, or the lease lost."""


class _Failed(Exception):
    def __init__(self, ref: str, error: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(error)
        self.ref = ref
        self.error = error
        self.data = data or {}


def escalation_id(ref: str) -> str:
    """The escalation id for the failed result ``ref`` (same on every node)."""
    return "q-" + hashlib.blake2b(ref.encode(), digest_size=5).hexdigest()


def _with_code(url: str, code: str) -> str:
    if not code:
        return url
    u = urlsplit(url)
    q = "&".join(p for p in u.query.split("&") if p and not p.startswith("code="))
    q = f"{q}&code={code}" if q else f"code={code}"
    return urlunsplit((u.scheme, u.netloc, u.path, q, u.fragment))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class AuditExecutor:
    """Works audit shops on ``node`` with ``tools`` (see the module docs)."""

    def __init__(
        self, node: Any, live: LiveView, tools: Tools, options: ExecutorOptions | None = None
    ) -> None:
        self.node = node
        self.live = live
        self.tools = tools
        self.opts = options or ExecutorOptions()
        self.me: str = node.address
        self.counters: Counter[str] = Counter()
        self._leases: LeaseClient = node.leases
        self._running: dict[str, asyncio.Task[None]] = {}
        self._cool: dict[str, float] = {}
        self._http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0))
        self._notes_lock = asyncio.Lock()

    @property
    def view(self) -> Any:
        """The audit view."""
        return self.live.view

    async def run(self, stop: asyncio.Event) -> None:
        """Work shops until ``stop`` is set."""
        try:
            while not stop.is_set():
                self._fill()
                await self.live.wait(0.25)
        finally:
            for t in list(self._running.values()):
                t.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)
            await self._http.aclose()

    def _busy_elsewhere(self, audit: Audit, shop: str) -> bool:
        steps = audit.calls.get(shop, [])
        if not steps:
            return False
        last = steps[-1]
        age_ms = _now_ms() - (last.hlc >> LOGICAL_BITS)
        return last.author != self.me and age_ms < self.opts.busy_ms

    def _fill(self) -> None:
        audit = self.view.latest()
        if audit is None or audit.finished is not None:
            return
        free = self.opts.max_concurrent - len(self._running)
        if free <= 0:
            return
        now = time.monotonic()
        order = sorted(
            self.view.workable(audit),
            key=lambda s: hashlib.blake2b(f"{self.me}/{s}".encode(), digest_size=4).digest(),
        )
        # batch order first, then a per-executor spread inside what is published
        first = {s: i // max(1, audit.batch_size) for i, s in enumerate(audit.published())}
        order.sort(key=lambda s: first.get(s, 0))
        for shop in order:
            if free <= 0:
                break
            if shop in self._running or self._cool.get(shop, 0) > now:
                continue
            if self._busy_elsewhere(audit, shop):
                continue
            self._cool[shop] = now + 0.5
            task = asyncio.get_running_loop().create_task(self._shop(audit, shop))
            self._running[shop] = task
            task.add_done_callback(self._finished(shop))
            free -= 1

    def _finished(self, shop: str) -> Any:
        def done(_task: asyncio.Task[None]) -> None:
            self._running.pop(shop, None)

        return done

    # -- one shop ----------------------------------------------------------------

    async def _shop(self, audit: Audit, shop: str) -> None:
        resource = f"audit.{audit.id}.{shop}"
        try:
            lease = await self._leases.try_acquire(resource, self.opts.lease_ttl_ms)
        except LeaseUnavailable:
            self.counters["lease_busy"] += 1
            return
        except HivemeshError as exc:
            self.counters[f"lease_error.{exc.code}"] += 1
            log.warning("%s: no lease (%s): %s", shop, exc.code, exc)
            return
        if lease.fencing_token > 1:  # an earlier holder: read what a majority holds first
            await self._catch_up(shop)
        if shop in audit.done or self.view.parked(audit, shop):  # decided while we asked
            with contextlib.suppress(HivemeshError):
                await self._leases.release(lease)
            return
        self.counters["leases"] += 1
        work = asyncio.get_running_loop().create_task(self._work(audit, shop, lease))
        renew = asyncio.get_running_loop().create_task(self._renew(lease, work))
        try:
            await work
        except _Stop as exc:
            log.info("%s: %s", shop, exc)
        except asyncio.CancelledError:
            if not renew.done():
                raise
            self.counters["lease_lost"] += 1
            log.warning("%s: lease lost, work stopped", shop)
        except Exception:  # a bug on one shop must not end the executor
            self.counters["shop_errors"] += 1
            log.exception("%s: work failed", shop)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            with contextlib.suppress(HivemeshError):
                await self._leases.release(lease)

    async def _catch_up(self, shop: str) -> None:
        """Pull what a majority of the voters holds (``sync.majority``), so
        the replay below sees the earlier holder's acknowledged steps; on a
        timeout the replay goes ahead with what is here (counted)."""
        try:
            await self.node.call(SyncMajority(pull=True, timeout_s=self.opts.catch_up_s))
        except HivemeshError as exc:
            self.counters[f"catch_up_error.{exc.code}"] += 1
            log.info("%s: catch-up before the replay failed (%s)", shop, exc.code)

    async def _renew(self, lease: Lease, work: asyncio.Task[None]) -> None:
        every = self.opts.lease_ttl_ms / 3000
        while True:
            await asyncio.sleep(every)
            try:
                lease = await self._leases.renew(lease)
            except HivemeshError:
                work.cancel()
                return

    async def _work(self, audit: Audit, shop: str, lease: Lease) -> None:
        t0 = time.monotonic()
        rp = self.view.replay(audit, shop, self.me)
        if rp.takeover(lease.fencing_token):
            self.counters["takeovers"] += 1
            await self._append(
                ev.TAKEOVER,
                {
                    "audit": audit.id,
                    "shop": shop,
                    "token": lease.fencing_token,
                    "from": rp.holders,
                    "reused": sorted(rp.pages),
                    "redo": rp.redo,
                },
            )
        answered = self.view.answer(audit, shop)
        code = answered[1].body["text"].strip() if answered is not None else ""
        if code.lower() in ("retry", "skip"):
            code = ""
        state = {"route": rp.route or audit.routes[0], "strategy": rp.strategy or "auto"}
        url: str | None = _with_code(audit.urls[shop], code)
        products: list[dict[str, Any]] = []
        blobs: list[str] = []
        page = 1
        while url is not None and page <= MAX_PAGES:
            done = rp.pages.get(page)
            if done is None:
                done = await self._page(audit, shop, lease, page, url, state)
            products.extend({**p, "blob": done.get("blob", "")} for p in done["products"])
            if done.get("blob"):
                blobs.append(str(done["blob"]))
            nxt = done.get("next")
            url = _with_code(nxt, code) if isinstance(nxt, str) and nxt else None
            page += 1
        await self._submit(audit, shop, lease, products, blobs, state["route"])
        with self.node.metrics.track_task(f"audit/{shop}") as extra:
            extra["hivemesh.audit.pages"] = page - 1
        self.counters["shops"] += 1
        log.info("%s done in %.1f s", shop, time.monotonic() - t0)

    async def _page(
        self, audit: Audit, shop: str, lease: Lease, page: int, url: str, state: dict[str, str]
    ) -> dict[str, Any]:
        html: str | None = None
        final = url
        while True:
            try:
                if html is None:  # fetch and read in one call
                    args = {"url": url, "route": state["route"], "extract": state["strategy"]}
                    found = await self._call(
                        audit, shop, lease, page, "fetch_page", {**args, "snapshot": True},
                        route=state["route"], strategy=state["strategy"], url=url,
                    )  # fmt: skip
                else:  # the page is here: read it another way
                    found = await self._call(
                        audit, shop, lease, page, "extract_prices",
                        {"html": html, "base_url": final, "strategy": state["strategy"],
                         "snapshot": True},
                        strategy=state["strategy"], url=url,
                    )  # fmt: skip
                return {
                    "products": found.get("products", []),
                    "next": found.get("next_page"),
                    "blob": found.get("blob", ""),
                }
            except _Failed as f:
                if isinstance(f.data.get("html"), str):  # fetched, but no prices read
                    html, final = f.data["html"], str(f.data.get("final_url") or url)
                fix = await self._correction(audit, shop, page, f)
                self.counters[f"fix.{fix.action}"] += 1
                if fix.action == "retry":  # a fresh fetch, read the default way again
                    html, state["strategy"] = None, "auto"
                    await asyncio.sleep(fix.backoff_ms / 1000)
                elif fix.action == "switch_route":
                    state["route"], html = fix.route, None
                elif fix.action == "other_strategy":
                    state["strategy"] = fix.strategy
                else:
                    raise _Stop(f"{fix.action}: {fix.reason}") from None

    async def _call(
        self,
        audit: Audit,
        shop: str,
        lease: Lease,
        page: int,
        tool: str,
        args: dict[str, Any],
        *,
        route: str = "",
        strategy: str = "",
        url: str = "",
    ) -> dict[str, Any]:
        name = f"{self.opts.server}.{tool}"
        base = {
            "audit": audit.id,
            "shop": shop,
            "token": lease.fencing_token,
            "page": page,
            "tool": name,
            "args": ev.args_digest(args),
        }
        await self._append(ev.CALL, {**base, "route": route, "strategy": strategy})
        t0 = time.monotonic()
        error, data = "", dict[str, Any]()
        with self.node.metrics.track_tool(name) as extra:
            try:
                res = await self.tools.call(name, args, timeout_s=self.opts.tool_timeout_s)
                if res.is_error:
                    error = res.reason or "tool_failed"
                else:
                    data = res.structured or {}
            except HivemeshError as exc:
                error = exc.code
            if error:
                extra[ATTR_ERROR_TYPE] = error
        out: dict[str, Any] = {
            **base,
            "ms": int((time.monotonic() - t0) * 1000),
            "outcome": "error" if error else "ok",
            "error": error,
            "blob": "",
            "route": route,
            "strategy": strategy,
        }
        if not error and isinstance(data.get("products"), list) and not data["products"]:
            error = "extract_failed"  # fetched, but nothing read: the HTML is in data
            out["outcome"], out["error"] = "error", error
        if not error and isinstance(data.get("snapshot"), dict):
            out["blob"] = data["blob"] = await self._blob(data.pop("snapshot"))
        if not error and isinstance(data.get("products"), list):
            out["products"] = [
                {k: p.get(k) for k in ("sku", "name", "price", "currency")}
                for p in data.get("products", [])
                if isinstance(p, dict)
            ]
            out["next"] = data.get("next_page")
            out["url"] = url
            out["strategy"] = data.get("strategy", strategy)
            data["products"] = out["products"]
        rec = await self._append(ev.RESULT, out)
        self.counters[f"tool.{tool}.{out['outcome']}"] += 1
        if error:
            raise _Failed(ev.ref_of(self.me, rec.seq), error, data)
        return data

    async def _blob(self, snap: dict[str, Any]) -> str:
        text = snap.get("html")
        if not isinstance(text, str):
            return ""
        digest: str = await self.node.put_blob(text.encode("utf-8"), mime="text/html")
        if snap.get("blob") and snap["blob"] != digest:
            self.counters["blob_digest_mismatch"] += 1
        return digest

    async def _correction(self, audit: Audit, shop: str, page: int, f: _Failed) -> Correction:
        deadline = time.monotonic() + self.opts.reflect_wait_s
        while True:
            step = self.view.correction(audit, f.ref)
            if step is not None:
                b = step.body
                if step.kind == ev.ESCALATION:
                    return Correction("escalate", reason=str(b.get("reason", "")))
                return Correction(
                    str(b.get("action")),
                    route=str(b.get("route", "")),
                    strategy=str(b.get("strategy", "")),
                    backoff_ms=int(b.get("backoff_ms", 0) or 0),
                    reason=str(b.get("reason", "")),
                )
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self.live.wait(left)
        self.counters["self_corrected"] += 1  # no reflector answered: same rules, here
        fix, question = decide(
            shop, f.error, self.view.history(audit, shop, page), audit.routes, self.opts.limits
        )
        for kind, body in correction_events(audit.id, shop, page, f.ref, f.error, fix, question):
            await self._append(kind, body)
        return fix

    async def _submit(
        self,
        audit: Audit,
        shop: str,
        lease: Lease,
        products: list[dict[str, Any]],
        blobs: list[str],
        route: str,
    ) -> None:
        if self.opts.pause_before_submit in (shop, "first") and not self.counters["paused"]:
            self.counters["paused"] += 1
            mark = self.node.config.data_dir / "paused-shop"
            mark.write_text(shop, encoding="utf-8")  # tells the test which shop
            os.kill(os.getpid(), signal.SIGSTOP)  # a process pause at the worst moment
        prices = [
            {"sku": p["sku"], "price": p["price"], "currency": p["currency"]}
            for p in products
            if p.get("sku") and p.get("price") and p.get("currency")
        ]
        body = {"shop": shop, "writer": self.me, "token": lease.fencing_token, "prices": prices}
        market = audit.market
        base = {
            "audit": audit.id,
            "shop": shop,
            "token": lease.fencing_token,
            "page": 0,
            "tool": "market.submit",
            "args": ev.args_digest(body),
        }
        await self._append(ev.CALL, {**base, "route": "", "strategy": ""})
        t0 = time.monotonic()
        error = ""
        for attempt in range(3):
            try:  # shielded: once sent, a submission's answer is what counts
                resp = await asyncio.shield(self._http.post(market, json=body))
                if resp.status_code == 409:
                    error = "stale_fencing_token"
                elif resp.status_code != 200:
                    error = "invalid_argument" if resp.status_code == 400 else "fetch_failed"
                break
            except httpx.HTTPError:
                error = "fetch_failed"
                await asyncio.sleep(0.2 * (attempt + 1))
        await self._side_result(base, t0, error)
        if error:
            self.counters[f"market.{error}"] += 1
            raise _Stop(f"market refused {shop}: {error}")
        try:
            with self.node.context(f"audit-{audit.id}") as ctx:
                ctx[shop] = {"prices": prices, "agent": self.me, "token": lease.fencing_token}
                ctx.gset("done").add(shop)
        except HivemeshError as exc:  # the journal event below still records it
            self.counters[f"ctx_error.{exc.code}"] += 1
        attempts = sum(
            1 for c in audit.calls.get(shop, []) if c.body.get("tool") != "market.submit"
        )
        if self.opts.notes_tool:
            await self._note(audit, shop, lease, prices)
        await self._append(
            ev.SHOP,
            {
                "audit": audit.id,
                "shop": shop,
                "token": lease.fencing_token,
                "products": products,
                "blobs": blobs,
                "attempts": attempts,
                "route": route,
                "market": "accepted",
            },
        )

    async def _note(
        self, audit: Audit, shop: str, lease: Lease, prices: list[dict[str, str]]
    ) -> None:
        """Note the shop in the notes tool (journaled; a failure costs only the note)."""
        name = self.opts.notes_tool
        entity = {
            "name": f"{audit.id}/{shop}",
            "entityType": "audited-shop",
            "observations": [f"{p['sku']} {p['price']} {p['currency']}" for p in prices][:200],
        }
        args = {"entities": [entity]}
        base = {
            "audit": audit.id,
            "shop": shop,
            "token": lease.fencing_token,
            "page": 0,
            "tool": name,
            "args": ev.args_digest(args),
        }
        await self._append(ev.CALL, {**base, "route": "", "strategy": ""})
        t0 = time.monotonic()
        error = ""
        with self.node.metrics.track_tool(name) as extra:
            try:  # one note at a time: a notes store may read-modify-write a file
                async with self._notes_lock:
                    res = await self.tools.call(name, args, timeout_s=self.opts.tool_timeout_s)
                error = (res.reason or "tool_failed") if res.is_error else ""
            except HivemeshError as exc:
                error = exc.code
            if error:
                extra[ATTR_ERROR_TYPE] = error
        self.counters[f"notes.{'error' if error else 'ok'}"] += 1
        await self._side_result(base, t0, error)

    async def _side_result(self, base: dict[str, Any], t0: float, error: str) -> None:
        """The ``tool.result`` of a call that is no page step (market, notes)."""
        body = {
            **base,
            "ms": int((time.monotonic() - t0) * 1000),
            "outcome": "error" if error else "ok",
            "error": error,
            "blob": "",
            "route": "",
            "strategy": "",
        }
        await self._append(ev.RESULT, body)

    async def _append(self, kind: str, body: dict[str, Any]) -> Any:
        return await self.node.append(kind, body)


def correction_events(
    audit: str, shop: str, page: int, ref: str, error: str, fix: Correction, question: str
) -> list[tuple[str, dict[str, Any]]]:
    """The events that journal ``fix`` for the failed result ``ref``."""
    body = {
        "audit": audit,
        "shop": shop,
        "page": page,
        "ref": ref,
        "after": error,
        "action": fix.action,
        "param": fix.key[1],
        "route": fix.route,
        "strategy": fix.strategy,
        "backoff_ms": fix.backoff_ms,
        "reason": fix.reason,
        "repeat": fix.repeat,
    }
    out: list[tuple[str, dict[str, Any]]] = [(ev.CORRECTION, body)]
    if fix.action == "escalate":
        esc = {
            "audit": audit,
            "id": escalation_id(ref),
            "shop": shop,
            "ref": ref,
            "question": question,
            "reason": fix.reason,
            "error": error,
        }
        out.append((ev.ESCALATION, esc))
    return out
