"""A deterministic stand-in for a model that plans, for benchmarks and tests.

:class:`DemoPlanner` answers the four role prompts (recognised by their
``[hivemesh:...]`` tag) with valid JSON: a goal at depth ``d`` splits into
``fanout[d]`` subgoals (the last level atomic), every proposal scores 8/10,
execution echoes the task, synthesis joins the children. ``chain=True``
makes each subgoal depend on the previous one (a sequential plan).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hivemesh.llm.base import Message
from hivemesh.roles.prompts import DECOMPOSE_TAG, EXECUTE_TAG, SCORE_TAG, SYNTH_TAG, tag_of

__all__ = ["DemoPlanner"]

_DEPTH = re.compile(r"^Depth: (\d+) of max (\d+)$", re.M)
_FIELD = re.compile(r"^(Goal|Task): (.*)$", re.M)
_PROPOSAL = re.compile(r"^Proposal (\d+):$", re.M)


class DemoPlanner:
    """A responder ``(messages, schema) -> reply`` (see :mod:`hivemesh.llm.stub`)."""

    def __init__(self, fanout: Sequence[int] = (5, 8), *, chain: bool = False) -> None:
        self.fanout = tuple(fanout)
        self.chain = chain
        self.calls: dict[str, int] = {}

    def __call__(self, messages: Sequence[Message], schema: dict[str, Any] | None) -> Any:
        tag = tag_of(messages)
        self.calls[tag] = self.calls.get(tag, 0) + 1
        user = messages[1]["content"] if len(messages) > 1 else ""
        m = _FIELD.search(user)
        title = m.group(2) if m else "goal"
        if tag == DECOMPOSE_TAG:
            d = _DEPTH.search(user)
            depth = int(d.group(1)) if d else 0
            max_depth = int(d.group(2)) if d else len(self.fanout)
            if depth >= len(self.fanout):
                return {"atomic": True, "subgoals": []}
            last = depth + 1 >= min(len(self.fanout), max_depth)
            return {
                "atomic": False,
                "subgoals": [
                    {
                        "title": f"{title} / part {i + 1}",
                        "detail": f"step {i + 1} of {title}",
                        "depends_on": [i - 1] if self.chain and i else [],
                        "atomic": last,
                    }
                    for i in range(self.fanout[depth])
                ],
            }
        if tag == SCORE_TAG:
            n = len(_PROPOSAL.findall(user))
            return {
                "scores": [
                    {
                        "proposal": i,
                        "concreteness": 8,
                        "non_overlap": 8,
                        "completeness": 8,
                        "notes": "fine",
                    }
                    for i in range(n)
                ]
            }
        if tag == EXECUTE_TAG:
            return {"result": f"done: {title}"}
        if tag == SYNTH_TAG:
            n = user.count("\n- ")
            return {"result": f"{title}: combined {n} results"}
        return {"result": "?"}
