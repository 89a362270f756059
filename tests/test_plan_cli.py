"""``hivemesh plan`` (in-process swarm) against a scripted LLM over real HTTP.

The default, separate node processes, is covered by tests/test_e2e_plan.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from hivemesh.roles.demo import DemoPlanner
from hivemesh.roles.run import main, parse_swarm, register
from llm_server import ScriptedServer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["plan", *argv])


def call(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(parse(*argv), env=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_without_llm_explains_and_exits_nonzero() -> None:
    code, out, err = call(["book a trip"], {})
    assert code == 2 and out == ""
    assert "HIVEMESH_LLM_BASE_URL" in err and "HIVEMESH_LLM_MODEL" in err


def test_bad_arguments_exit_nonzero(tmp_path: Path) -> None:
    env = {"HIVEMESH_LLM_BASE_URL": "http://127.0.0.1:9/v1", "HIVEMESH_LLM_MODEL": "m"}
    assert call(["x", "--swarm", "wizards=3"], env)[0] == 2
    assert call(["x", "--swarm", "scorers=0"], env)[0] == 2
    # show/cancel ask the local daemon: none running -> exit 3 (as other daemon commands)
    code, _out, err = call(["show", "abc", "--data-dir", str(tmp_path)], env)
    assert code == 3 and "daemon_not_running" in err
    assert call(["cancel", "abc", "--data-dir", str(tmp_path)], env)[0] == 3
    assert parse_swarm("scorers=5") == {"decomposers": 2, "scorers": 5, "executors": 3}
    assert parse_swarm("executors=0", allow_zero=True)["executors"] == 0


def test_plan_runs_to_a_final_answer() -> None:
    planner = DemoPlanner((2, 2))

    def respond(req: dict[str, Any]) -> Any:
        return planner(req["messages"], None)

    with ScriptedServer.in_thread(respond) as srv:
        env = {"HIVEMESH_LLM_BASE_URL": srv.base_url, "HIVEMESH_LLM_MODEL": "scripted"}
        code, out, _err = call(
            [
                "weekend",
                "in",
                "Porto",
                "--swarm",
                "decomposers=1,scorers=2,executors=2",
                "--settle-ms",
                "10",
                "--in-process",
            ],
            env,
        )
        assert code == 0, out
        assert "weekend in Porto: combined 2 results" in out
        code, out, _err = call(["trip", "--json", "--settle-ms", "10", "--in-process"], env)
        assert code == 0
        tree = json.loads(out)["tree"]
        assert tree["status"] == "done" and len(tree["children"]) == 2
        assert all(len(c["children"]) == 2 for c in tree["children"])
