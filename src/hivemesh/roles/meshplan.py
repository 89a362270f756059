"""``hivemesh plan`` over real node processes.

Theory of operation
-------------------
The CLI is a client, never a node: it talks to one node through its control
socket (:class:`~hivemesh.client.blocking.Client`) and only starts processes.

* **Local swarm** (default): under a temporary root it starts an observer
  agent (``hivemesh agent --role observer``, the node the CLI talks to), then
  the decomposers, scorers and executors as separate ``hivemesh agent``
  processes bootstrapping from it, all on loopback
  (:class:`~hivemesh.client.swarm.LocalSwarm`: every child dies with the
  CLI). Decomposers get different strategies.
* **--mesh**: the node is the running local daemon (``--data-dir``); agents
  started for the run (``--swarm``, zero of each allowed: the mesh may
  already run agents) bootstrap from its endpoint -- or, when the mesh is
  private (``invite`` trust, the default), are private too and each joins it
  with a single-use invite from that node.

Then it waits until the node holds every started agent's feed (their
``plan.hello`` is in), creates the goal with ``plan.goal``, and polls
``plan.show`` (4 per second) to draw the tree live until the root is done,
failed or cancelled, or the timeout. Every wait has a deadline; the started
processes are stopped (SIGTERM, then SIGKILL) on every exit path.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hivemesh.client.blocking import Client
from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.errors import DeadlineExceeded
from hivemesh.llm import LLMConfig
from hivemesh.llm.config import ENV as LLM_ENV

__all__ = ["STRATEGIES", "TERMINAL", "drive", "llm_env", "mesh_endpoint", "started_swarm"]

STRATEGIES = ("by activity", "by place", "by day", "by dependency order")
TERMINAL = ("done", "failed", "cancelled")


def llm_env(cfg: LLMConfig) -> dict[str, str]:
    """``HIVEMESH_LLM_*`` variables that make an agent use ``cfg``."""
    values = {
        "base_url": cfg.base_url,
        "model": cfg.model,
        "api_key": cfg.api_key,
        "timeout_s": str(cfg.timeout_s),
        "max_attempts": str(cfg.max_attempts),
        "json_mode": "1" if cfg.json_mode else "0",
        "gguf_path": cfg.gguf_path,
    }
    return {LLM_ENV[k]: v for k, v in values.items() if v}


def mesh_endpoint(client: Client) -> str:
    """A ``host:port`` of the daemon behind ``client`` that local agents can dial."""
    host, _, port = str(client.status()["listen"]).rpartition(":")
    if host in ("0.0.0.0", "", "::", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"


def _agent_specs(counts: Mapping[str, int]) -> list[tuple[str, list[str]]]:
    specs: list[tuple[str, list[str]]] = []
    for i in range(counts.get("decomposers", 0)):
        strategy = STRATEGIES[i % len(STRATEGIES)]
        specs.append((f"decomposer{i}", ["--role", "decomposer", "--strategy", strategy]))
    for i in range(counts.get("scorers", 0)):
        specs.append((f"scorer{i}", ["--role", "scorer"]))
    for i in range(counts.get("executors", 0)):
        specs.append((f"executor{i}", ["--role", "executor"]))
    return specs


@contextlib.contextmanager
def started_swarm(
    counts: Mapping[str, int],
    env: Mapping[str, str],
    *,
    mesh: str | None = None,
    root: Path | None = None,
) -> Iterator[tuple[LocalSwarm, Client]]:
    """Start the agents (and, without ``mesh``, an observer seed); yields the
    swarm and a client of the node the CLI should talk to. ``mesh`` is the
    data dir of a running daemon to join instead."""
    tmp = None if root is not None else Path(tempfile.mkdtemp(prefix="hivemesh-plan-"))
    base = root if root is not None else tmp
    assert base is not None
    client = Client(mesh, timeout_s=10.0) if mesh is not None else None
    private = client is not None and client.call("trust.list")["mode"] == "invite"
    swarm = LocalSwarm(base, env=env, trust_mode="invite" if private else "open")
    try:
        if client is None:
            seed = swarm.start("observer", command=("agent",), extra_args=["--role", "observer"])
            client, endpoint = seed.client, seed.endpoint
        else:
            endpoint = mesh_endpoint(client)
        # sequential, from this thread: a child's PR_SET_PDEATHSIG fires when the
        # *thread* that started it exits, so no worker threads here
        for label, args in _agent_specs(counts):
            if not private:
                swarm.start(label, bootstrap=[endpoint], command=("agent",), extra_args=args)
                continue
            agent = swarm.start(label, command=("agent",), extra_args=args)
            token = client.call("invite", ttl_s=600)["token"]
            agent.client.call("join", token=token, timeout_s=20.0)
        wanted = {n.address for n in swarm.running()}

        def holds_all() -> bool:
            vv = client.status()["journal"]["version_vector"]
            return wanted <= set(vv)

        wait_until(holds_all, 30, what="the node holds every agent's feed")
        yield swarm, client
    finally:
        swarm.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def drive(
    client: Client,
    goal_args: Mapping[str, Any],
    *,
    timeout_s: float,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    interval_s: float = 0.25,
) -> tuple[str, dict[str, Any], bool]:
    """Create the goal through ``client`` and poll until it ends;
    ``(goal id, last plan.show answer, finished)``."""
    gid: str = client.call("plan.goal", **goal_args)["goal"]
    deadline = time.monotonic() + timeout_s
    shown: dict[str, Any] = {}
    while True:
        with contextlib.suppress(DeadlineExceeded):  # a busy node: ask again
            shown = client.call("plan.show", goal=gid)
        if shown and on_update is not None:
            on_update(shown["tree"])
        if shown and shown["tree"]["status"] in TERMINAL:
            return gid, shown, True
        if time.monotonic() >= deadline:
            return gid, shown, False
        time.sleep(interval_s)
