"""``hivemesh plan``: run a goal through a swarm of roles and show the tree live.

By default the swarm is separate node processes on loopback, or agents that
join the running local daemon's mesh with ``--mesh``
(:mod:`hivemesh.roles.meshplan`); ``--in-process`` runs the same roles in this
process over a :class:`~hivemesh.roles.local.LocalJournal` (:func:`run_plan`,
also what ``hivemesh bench plan`` uses). ``plan show GOAL_ID`` and ``plan
cancel GOAL_ID`` ask the local daemon (``--data-dir``), whose journal holds
the plan events.

Wiring: a CLI module ``faces/cli/commands/plan.py`` containing
``from hivemesh.roles.run import register`` makes this ``hivemesh plan``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from hivemesh.client.blocking import Client
from hivemesh.client.cli import add_common, data_dir_of, error_json, exit_code, wants_json
from hivemesh.commands import PlanCancel, PlanShow
from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import KIND_GOAL, goal_body, goal_id
from hivemesh.errors import ConfigError, HivemeshError
from hivemesh.llm import LLMConfig, LLMProvider, provider_from_config
from hivemesh.llm.errors import LLMNotConfigured
from hivemesh.roles.decomposer import Decomposer
from hivemesh.roles.executor import Executor
from hivemesh.roles.local import LocalJournal, author_key
from hivemesh.roles.observer import render_rich, render_text
from hivemesh.roles.scorer import Scorer
from hivemesh.roles.swarm import LocalSwarm

__all__ = [
    "UsageTotals",
    "main",
    "parse_swarm",
    "register",
    "run_on_nodes",
    "run_plan",
    "show_or_cancel",
]

_STRATEGIES = ("by activity", "by place", "by day", "by dependency order")
_ROLES = ("decomposers", "scorers", "executors")


def parse_swarm(spec: str, *, allow_zero: bool = False) -> dict[str, int]:
    """``"decomposers=2,scorers=3,executors=3"`` -> counts (missing keys default;
    ``allow_zero`` when agents already in the mesh may do the work)."""
    out = {"decomposers": 2, "scorers": 3, "executors": 3}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, val = part.partition("=")
        if key not in _ROLES or not val.isdigit():
            raise ConfigError(f"bad --swarm entry {part!r}; want e.g. decomposers=2,scorers=3")
        out[key] = int(val)
    if not allow_zero and min(out.values()) < 1:
        raise ConfigError("a swarm needs at least one decomposer, scorer and executor")
    return out


class UsageTotals:
    """An ``on_usage`` hook that sums calls, tokens and failures."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed = 0
        self.input_tokens = 0
        self.output_tokens = 0

    def __call__(self, model: str, tin: int, tout: int, latency_ms: float, ok: bool) -> None:
        self.calls += 1
        self.failed += 0 if ok else 1
        self.input_tokens += tin
        self.output_tokens += tout


async def run_plan(
    goal: str,
    llm: LLMProvider,
    *,
    swarm: Mapping[str, int] | None = None,
    quorum: str = "majority",
    quorum_value: float = 0,
    max_depth: int = 3,
    settle_ms: int = 50,
    timeout_s: float = 900.0,
    on_update: Callable[[PlanView, str], None] | None = None,
) -> tuple[PlanView, str, bool]:
    """Plan and execute ``goal`` in-process; ``(view, goal id, finished)``."""
    counts = dict(swarm or parse_swarm(""))
    journal = LocalJournal(lambda: int(time.time() * 1000))
    sw = LocalSwarm(journal)
    run_id = secrets.token_hex(4)
    for i in range(counts["decomposers"]):
        strategy = _STRATEGIES[i % len(_STRATEGIES)]
        sw.add(Decomposer(author_key(f"{run_id}/d{i}"), llm, strategy=strategy))
    for i in range(counts["scorers"]):
        sw.add(Scorer(author_key(f"{run_id}/s{i}"), llm))
    for i in range(counts["executors"]):
        sw.add(Executor(author_key(f"{run_id}/e{i}"), llm))
    sw.step()  # everyone says hello before the goal exists
    me = author_key(f"{run_id}/cli")
    nonce = secrets.token_bytes(16)
    body = goal_body(
        goal[:300],
        nonce,
        detail=goal[300:4000],
        quorum=quorum,
        quorum_value=quorum_value,
        scorers=counts["scorers"],
        max_depth=max_depth,
        settle_ms=settle_ms,
    )
    journal.append(me, KIND_GOAL, body)
    gid = goal_id(me, nonce)
    last = [0.0]

    def done() -> bool:
        if on_update is not None and time.monotonic() - last[0] > 0.25:
            last[0] = time.monotonic()
            on_update(sw.view, gid)
        n = sw.view.node(gid)
        return n is not None and n.status in ("done", "failed", "cancelled")

    try:
        ok = await sw.run_until(done, timeout_s)
    finally:
        await sw.aclose()
    if on_update is not None:
        on_update(sw.view, gid)
    return sw.view, gid, ok


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "plan",
        help="plan and run a goal with a swarm of agents",
        description='hivemesh plan "GOAL" | plan show GOAL_ID [--json] | plan cancel GOAL_ID',
    )
    p.add_argument("words", nargs="+", metavar="GOAL", help='the goal, or "show ID" / "cancel ID"')
    p.add_argument("--swarm", default="", help="decomposers=2,scorers=3,executors=3")
    p.add_argument(
        "--mesh", action="store_true", help="join the running local daemon's mesh (--data-dir)"
    )
    p.add_argument(
        "--in-process", action="store_true", help="run the roles in this process (no nodes)"
    )
    add_common(p)  # --data-dir: the local daemon; --json: the final tree as JSON
    p.add_argument("--quorum", default="majority", choices=["count", "majority", "fraction"])
    p.add_argument("--quorum-value", type=float, default=0)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--settle-ms", type=int, default=None, help="default 200 (50 in-process)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--base-url", default="", help="OpenAI-compatible base URL (overrides env)")
    p.add_argument("--model", default="", help="model name (overrides env)")
    p.set_defaults(func=main)


def main(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``hivemesh plan``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    words: list[str] = list(args.words)
    if words[0] in ("show", "cancel") and len(words) == 2:
        return show_or_cancel(args, words[0], words[1], out=out, err=err)
    try:
        swarm = parse_swarm(args.swarm, allow_zero=args.mesh)
        cfg = LLMConfig.resolve(
            None, os.environ if env is None else env, base_url=args.base_url, model=args.model
        )
    except LLMNotConfigured as exc:
        print(str(exc), file=err)
        return 2
    except ConfigError as exc:
        print(f"hivemesh plan: {exc}", file=err)
        return 2
    goal = " ".join(words)
    if not args.in_process:
        return run_on_nodes(args, goal, swarm, cfg, out=out, err=err)
    usage = UsageTotals()
    llm = provider_from_config(cfg, on_usage=usage)
    live = _LiveDisplay(out) if not wants_json(args) else None
    try:
        view, gid, ok = asyncio.run(
            _run_and_close(
                goal,
                llm,
                swarm=swarm,
                quorum=args.quorum,
                quorum_value=args.quorum_value,
                max_depth=args.max_depth,
                settle_ms=50 if args.settle_ms is None else args.settle_ms,
                timeout_s=args.timeout_s,
                on_update=live.update if live else None,
            )
        )
    finally:
        if live is not None:
            live.stop()
    tree = view.tree(gid) or {}
    if wants_json(args):
        print(json.dumps({"goal": gid, "tree": tree}, sort_keys=True), file=out)
    else:
        if live is None or not live.rich:
            print(render_text(tree), file=out)
        print(f"\ngoal {gid}: {tree.get('status')}", file=out)
        print(
            f"LLM calls {usage.calls} ({usage.failed} failed), tokens in "
            f"{usage.input_tokens} out {usage.output_tokens}",
            file=out,
        )
        answer = view.final_answer(gid)
        print("\n" + (answer if answer is not None else "(no final answer)"), file=out)
    return 0 if ok and view.final_answer(gid) is not None else 1


def _client(args: argparse.Namespace) -> Client:
    return Client(data_dir_of(args), timeout_s=10.0)


def show_or_cancel(
    args: argparse.Namespace, what: str, gid: str, *, out: TextIO, err: TextIO
) -> int:
    """``plan show GOAL_ID`` / ``plan cancel GOAL_ID`` against the local daemon.
    Exit codes as the other daemon commands: 1 failed, 3 no daemon."""
    client = _client(args)
    try:
        if what == "cancel":
            request = PlanCancel(goal=gid, reason="cancelled from the CLI")
            res = client.run(request).to_wire()
            print(json.dumps(res) if wants_json(args) else f"cancelled {gid}", file=out)
            return 0
        shown = client.run(PlanShow(goal=gid)).to_wire()
    except HivemeshError as exc:
        if wants_json(args):  # the one error shape and exit code of every command
            print(json.dumps(error_json(exc), sort_keys=True), file=out)
        else:
            print(f"hivemesh plan {what}: {exc} [{exc.code}]", file=err)
        return exit_code(exc)
    if wants_json(args):
        print(json.dumps(shown, sort_keys=True), file=out)
    else:
        print(render_text(shown["tree"]), file=out)
        answer = shown["answer"]
        print("\n" + (answer if answer is not None else "(no final answer yet)"), file=out)
    return 0


def run_on_nodes(
    args: argparse.Namespace,
    goal: str,
    swarm: Mapping[str, int],
    cfg: LLMConfig,
    *,
    out: TextIO,
    err: TextIO,
) -> int:
    """Run ``goal`` on a swarm of node processes (see :mod:`hivemesh.roles.meshplan`)."""
    from hivemesh.roles.meshplan import drive, llm_env, started_swarm

    goal_args = {
        "title": goal[:300],
        "detail": goal[300:4000],
        "quorum": args.quorum,
        "quorum_value": args.quorum_value,
        "scorers": max(1, swarm["scorers"]),
        "max_depth": args.max_depth,
        "settle_ms": 200 if args.settle_ms is None else args.settle_ms,
    }
    live = _LiveDisplay(out) if not wants_json(args) else None
    try:
        mesh = str(data_dir_of(args)) if args.mesh else None
        with started_swarm(swarm, llm_env(cfg), mesh=mesh) as (_procs, client):
            gid, shown, ok = drive(
                client,
                goal_args,
                timeout_s=args.timeout_s,
                on_update=live.update_tree if live else None,
            )
    except HivemeshError as exc:
        print(f"hivemesh plan: {exc} [{exc.code}]", file=err)
        return exit_code(exc)
    finally:
        if live is not None:
            live.stop()
    tree = shown.get("tree") or {}
    answer = shown.get("answer")
    if wants_json(args):
        doc = {"goal": gid, "tree": tree, "answer": answer, "digest": shown.get("digest")}
        print(json.dumps(doc, sort_keys=True), file=out)
    else:
        if live is None or not live.rich:
            print(render_text(tree), file=out)
        print(f"\ngoal {gid}: {tree.get('status')}", file=out)
        print("\n" + (answer if answer is not None else "(no final answer)"), file=out)
    return 0 if ok and answer is not None else 1


async def _run_and_close(goal: str, llm: LLMProvider, **kw: Any) -> tuple[PlanView, str, bool]:
    try:
        return await run_plan(goal, llm, **kw)
    finally:
        close = getattr(llm, "aclose", None)
        if close is not None:
            await close()


class _LiveDisplay:
    """A rich Live tree on a terminal; nothing otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.rich = out.isatty()
        self._live: Any = None
        if self.rich:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=out), refresh_per_second=4)
            self._live.start()

    def update(self, view: PlanView, gid: str) -> None:
        self.update_tree(view.tree(gid))

    def update_tree(self, tree: dict[str, Any] | None) -> None:
        if self._live is not None and tree is not None:
            self._live.update(render_rich(tree))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
