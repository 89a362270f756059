"""LangGraph on a real swarm: graphs in separate processes, each on its own node.

One ``hivemesh up`` daemon (n0) and worker processes (``tests/lg_worker.py``),
each running a LangGraph graph on an in-process :class:`hivemesh.Node`, all
on loopback; the lease voters are the three nodes.

* A graph runs in worker A; A is killed with SIGKILL in the middle of a
  step; worker B, on its own node, resumes the thread from the last
  checkpoint and finishes it.
* A writer frozen (SIGSTOP) past its lease wakes up after another took the
  thread over and finished: its late write is refused (`checkpoint_conflict`).
* Two workers start the same thread at the same moment: with the mesh
  checkpointer exactly one finishes and the other gets
  ``checkpoint_conflict``, and the chain has no fork. The same race with the
  fencing taken out (``--naive``) forks: both succeed, the view finds two
  children of one parent -- the same check fails.

Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.graph")

from hivemesh.client.swarm import LocalSwarm

pytestmark = pytest.mark.timeout(180)

WORKER = str(Path(__file__).with_name("lg_worker.py"))
STEPS = [f"s{i}" for i in range(1, 7)]


class Worker:
    """One ``lg_worker.py`` process: commands in on stdin, JSON lines out."""

    def __init__(self, swarm: LocalSwarm, label: str, *, peers: int, naive: bool = False) -> None:
        self.label = label
        data = swarm.root / label
        data.mkdir(mode=0o700)
        args = [sys.executable, WORKER, str(data), swarm.nodes["n0"].endpoint, str(peers)]
        self.log = open(data.parent / f"{label}.log", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [*args, *(["--naive"] if naive else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=swarm.env,
            start_new_session=True,
        )
        self._buf = b""
        self.lines: list[dict[str, Any]] = []

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def next(self, ev: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next line whose ``ev`` is ``ev`` (or ``error``), within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while True:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                doc = json.loads(raw)
                self.lines.append(doc)
                if doc["ev"] in (ev, "error"):
                    return doc
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                pytest.fail(f"{self.label}: no {ev!r} in {timeout_s}s; got {self.lines[-5:]}")
            poller = select.poll()
            poller.register(self.proc.stdout, select.POLLIN)
            if poller.poll(left * 1000):
                self._buf += os.read(self.proc.stdout.fileno(), 65536)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.log.close()


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path) as s:
        s.start("n0")
        yield s


@pytest.fixture
def workers(swarm: LocalSwarm) -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for w in made:
        w.close()


def start_pair(swarm: LocalSwarm, workers: list[Worker], naive: bool = False) -> list[Worker]:
    pair = [Worker(swarm, f"w{i}", peers=2, naive=naive) for i in (1, 2)]
    workers.extend(pair)
    ready = [w.next("ready") for w in pair]
    assert ready[0]["voters"] == ready[1]["voters"] and len(ready[0]["voters"]) == 3
    return pair


def silent_forks(outcomes: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
    """Violations of "two writers never both succeed from the same head"."""
    problems = []
    done = [o for o in outcomes if o["ev"] == "done"]
    if len(done) > 1:
        problems.append(f"{len(done)} concurrent writers of one thread all succeeded")
    if report["forks"]:
        problems.append(f"the chain forked: {report['forks']}")
    return problems


def test_killed_writer_resumed_on_another_node(swarm: LocalSwarm, workers: list[Worker]) -> None:
    a, b = start_pair(swarm, workers)
    a.send("run job-1")
    for step in ("s1", "s2", "s3", "s4"):
        assert a.next("running")["step"] == step
    # A is inside s4: s1..s3 are confirmed checkpoints (durability="sync")
    a.kill()
    t0 = time.monotonic()
    b.send("resume job-1")
    first = b.next("running", timeout_s=30)
    assert first["step"] == "s4", first  # from the last checkpoint, not from the start
    done = b.next("done", timeout_s=30)
    assert done["ev"] == "done", done
    resumed_s = time.monotonic() - t0
    state = done["state"]
    assert state["steps"] == STEPS  # every step once, in order
    assert set(state["by"][:3]) == {a_addr(a)} and set(state["by"][3:]) == {a_addr(b)}
    ran_by_b = [d["step"] for d in b.lines if d["ev"] == "running"]
    assert ran_by_b == ["s4", "s5", "s6"]
    report = (b.send("report job-1"), b.next("report"))[1]
    assert report["forks"] == []
    holders = {c[2] for c in report["checkpoints"]}
    assert len(holders) == 2  # the chain runs through A's checkpoints into B's
    print(f"resumed and finished on the other node in {resumed_s:.1f}s")


def test_paused_writer_wakes_up_to_a_conflict(swarm: LocalSwarm, workers: list[Worker]) -> None:
    """The case fencing tokens exist for: a writer paused past its lease."""
    a, b = start_pair(swarm, workers)
    a.send("run job-p")
    for step in ("s1", "s2", "s3"):
        assert a.next("running")["step"] == step
    os.killpg(a.proc.pid, signal.SIGSTOP)  # A (and its node) freeze inside s3
    try:
        b.send("resume job-p")  # waits for A's lease to expire, then takes over
        assert b.next("running", timeout_s=30)["step"] == "s3"
        done = b.next("done", timeout_s=30)
        assert done["ev"] == "done" and done["state"]["steps"] == STEPS, done
    finally:
        os.killpg(a.proc.pid, signal.SIGCONT)
    late = a.next("done", timeout_s=60)  # A finishes s3 and tries to store it
    assert late["ev"] == "error" and late["code"] == "checkpoint_conflict", late
    report = (b.send("report job-p"), b.next("report"))[1]
    assert report["forks"] == []
    head = report["checkpoints"][0]
    assert head[2] == holder(b)  # the head is the new writer's, whatever A did


def a_addr(w: Worker) -> str:
    return str(next(d for d in w.lines if d["ev"] == "ready")["address"])


def holder(w: Worker) -> str:
    return str(next(d for d in w.lines if d["ev"] == "ready")["holder"])


def race(swarm: LocalSwarm, workers: list[Worker], naive: bool) -> list[str]:
    a, b = start_pair(swarm, workers, naive=naive)
    a.send("race job-race")
    b.send("race job-race")
    outcomes = [a.next("done", 60), b.next("done", 60)]
    report = (a.send("report job-race"), a.next("report"))[1]
    if not naive:
        codes = sorted(o.get("code", "ok") for o in outcomes)
        assert codes == ["checkpoint_conflict", "ok"], outcomes
        winner = next(o for o in outcomes if o["ev"] == "done")
        assert winner["state"]["steps"] == STEPS
    return silent_forks(outcomes, report)


def test_concurrent_writers_one_conflict_never_a_fork(
    swarm: LocalSwarm, workers: list[Worker]
) -> None:
    assert race(swarm, workers, naive=False) == []


def test_the_same_race_forks_a_naive_saver(swarm: LocalSwarm, workers: list[Worker]) -> None:
    problems = race(swarm, workers, naive=True)
    # the check that the mesh saver passes fails here: both succeeded, the chain forked
    assert any("all succeeded" in p for p in problems), problems
    assert any("forked" in p for p in problems), problems
