"""The README's Python example runs as written, and names can be waited for.

The example is taken from README.md by this test and run as a script (a
separate Python process, its own fresh data dir in a fresh working
directory, no HIVEMESH_* settings) against a real swarm shaped like the
tour's, private as nodes are by default: node ``a`` whose invite token the
script gets as its argument, node ``b`` (joined by invite too) that claimed
``planner``. The script is not changed at all.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hivemesh
from hivemesh.client.swarm import FAST_TIMINGS, LocalSwarm, wait_until
from hivemesh.errors import DeadlineExceeded, UnknownPeer

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
README = Path(__file__).resolve().parent.parent / "README.md"


def python_example() -> str:
    """The first ```python block after "From Python" in README.md."""
    text = README.read_text(encoding="utf-8")
    tail = text[text.index("From Python") :]
    match = re.search(r"```python\n(.*?)```", tail, re.S)
    assert match is not None, "no python block after 'From Python' in README.md"
    return match.group(1)


def test_the_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    code = python_example()
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    with LocalSwarm(tmp_path / "swarm", trust_mode="invite") as swarm:
        a = swarm.start("a")
        b = swarm.start("b")
        b.client.call("join", token=a.client.call("invite", ttl_s=600)["token"], timeout_s=20)
        b.client.claim_name("planner")
        token = a.client.call("invite", ttl_s=600)["token"]
        script = workdir / "example.py"
        script.write_text(code, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
        env["PYTHONPATH"] = SRC
        with subprocess.Popen(
            [sys.executable, str(script), token],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            try:
                # the planner gets the question (it resolved the name, sent, was acked) ...
                wait_until(
                    lambda: (
                        proc.poll() is not None
                        or any(m["data"] == {"ask": "next step?"} for m in b.client.inbox())
                    ),
                    60,
                    what="the planner has the question",
                )
                if proc.poll() is not None:
                    _, err = proc.communicate()
                    pytest.fail(f"the example ended early ({proc.returncode}):\n{err}")
                # ... and answers in shared context, which ends the example's loop
                b.client.ctx_set("task-42", "answer", "check the disk")
                out, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        assert f"{b.address} ctx.update" in out.splitlines()
        assert (workdir / "agent-a" / "node.key").exists()  # its own, fresh data dir
        # the example's context writes reached the swarm
        wait_until(
            lambda: a.client.ctx_get("task-42", "status")["value"] == "running",
            10,
            what="replicated",
        )


FAST = {
    "sync_interval_ms": int(FAST_TIMINGS["HIVEMESH_SYNC_INTERVAL_MS"]),
    "reconnect_min_s": 0.1,
    "reconnect_max_s": 0.5,
    "trust_mode": "open",  # loopback test nodes; the example above runs private
}


def test_wait_name_waits_for_a_name_the_node_does_not_know_yet(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
        ):
            with pytest.raises(UnknownPeer):  # what send() would meet: not claimed yet
                b.resolve("planner")
            waiting = asyncio.create_task(b.wait_name("planner", timeout_s=20))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            assert await a.claim_name("planner")
            assert await waiting == a.address
            receipt = await b.send("planner", {"ask": "next step?"}, timeout_s=10)
            assert receipt["to"] == a.address
            with pytest.raises(DeadlineExceeded, match="nobody"):
                await b.wait_name("nobody", timeout_s=0.3)
            assert await b.wait_name(a.address, timeout_s=0.1) == a.address  # an address is one

    asyncio.run(main())
