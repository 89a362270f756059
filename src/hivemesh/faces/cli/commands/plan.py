"""``hivemesh plan``: the leaderless planner (see :mod:`hivemesh.roles.run`),
and ``hivemesh plan watch [GOAL]``: the live tree of the local node's plan
(:mod:`hivemesh.faces.plan_watch`).

``plan watch`` redraws the trees as they change (rich on a terminal, a
plain-text block per change otherwise) until Ctrl-C; ``--once`` prints them
once; ``--until-done`` stops when every shown goal is done, failed or
cancelled (exit 0 if all are done, 1 otherwise, 16 past ``--timeout-s``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from hivemesh.roles import run as _run

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand (with its ``watch`` action)."""
    _run.register(sub)
    p: argparse.ArgumentParser = sub.choices["plan"]
    p.description = (p.description or "") + " | plan watch [GOAL_ID] [--once | --until-done]"
    p.add_argument("--once", action="store_true", help="plan watch: print the trees once")
    p.add_argument(
        "--until-done", action="store_true", help="plan watch: stop when the goals finish"
    )
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    words: list[str] = list(args.words)
    if words[0] == "watch" and len(words) <= 2:
        return watch_main(args, words[1] if len(words) == 2 else None)
    code: int = _run.main(args)
    return code


def watch_main(args: argparse.Namespace, goal: str | None) -> int:
    """``hivemesh plan watch [GOAL]`` against the local node."""
    from hivemesh.client.aio import AsyncClient
    from hivemesh.client.cli import data_dir_of, exit_code
    from hivemesh.errors import HivemeshError
    from hivemesh.faces.plan_watch import ClientSource, TreeDisplay, watch

    display = TreeDisplay(sys.stdout)

    async def main() -> list[dict[str, Any]]:
        source = ClientSource(AsyncClient(data_dir_of(args), timeout_s=10.0), goal)
        try:
            return await watch(
                source,
                display,
                once=args.once,
                until_done=args.until_done,
                timeout_s=args.timeout_s if args.until_done else None,
            )
        finally:
            await source.aclose()

    try:
        trees = asyncio.run(main())
    except HivemeshError as exc:
        print(f"hivemesh plan watch: {exc} [{exc.code}]", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    finally:
        display.close()
    if goal is not None and not trees:  # --once, or a timeout, before the goal arrived
        print(f"hivemesh plan watch: no goal {goal!r} in this node's journal", file=sys.stderr)
        return 2
    if args.until_done and not all(t["status"] == "done" for t in trees):
        return 1
    return 0
