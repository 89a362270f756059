"""Prompts and JSON schemas of the planner roles.

Every system prompt starts with a tag line ``[hivemesh:<task>]`` (``decompose``,
``score``, ``execute``, ``synthesise``) so logs, stubs and scripted test
servers can tell the calls apart. User prompts carry ``Depth: d of max D``
for the same reason. Replies are JSON validated against the schemas here;
the retry loop in :mod:`hivemesh.llm.base` feeds validation errors back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hivemesh.llm.base import Message

__all__ = [
    "DECOMPOSE_TAG",
    "EXECUTE_TAG",
    "SCORE_TAG",
    "SYNTH_TAG",
    "decompose_messages",
    "decompose_schema",
    "execute_messages",
    "execute_schema",
    "score_messages",
    "score_schema",
    "synth_messages",
    "tag_of",
]

DECOMPOSE_TAG = "[hivemesh:decompose]"
SCORE_TAG = "[hivemesh:score]"
EXECUTE_TAG = "[hivemesh:execute]"
SYNTH_TAG = "[hivemesh:synthesise]"

_TITLE = {"type": "string", "minLength": 1, "maxLength": 300}
_TEXT = {"type": "string", "maxLength": 4000}
_SCORE = {"type": "integer", "minimum": 0, "maximum": 10}
#: Each input result quoted in a prompt is cut to this many characters.
_MAX_INPUT_CHARS = 4000


def tag_of(messages: Sequence[Message]) -> str:
    """The ``[hivemesh:...]`` tag of a role's conversation ("" if none)."""
    for m in messages:
        if m["role"] == "system" and m["content"].startswith("[hivemesh:"):
            return m["content"].split("]", 1)[0] + "]"
    return ""


def decompose_schema(max_subgoals: int) -> dict[str, Any]:
    """Reply schema of a decomposer call."""
    return {
        "title": "decomposition",
        "type": "object",
        "properties": {
            "atomic": {"type": "boolean"},
            "subgoals": {
                "type": "array",
                "maxItems": max_subgoals,
                "items": {
                    "type": "object",
                    "properties": {
                        "title": _TITLE,
                        "detail": _TEXT,
                        "depends_on": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                        "atomic": {"type": "boolean"},
                        "capabilities": {
                            "type": "array",
                            "maxItems": 16,
                            "items": {"type": "string", "maxLength": 40},
                        },
                    },
                    "required": ["title"],
                },
            },
        },
        "required": ["subgoals"],
    }


def decompose_messages(
    *,
    title: str,
    detail: str,
    path: Sequence[str],
    depth: int,
    max_depth: int,
    strategy: str,
    max_subgoals: int,
    notes: Sequence[str],
) -> list[Message]:
    """Ask for a split of one goal (or a verdict that it is atomic)."""
    system = (
        f"{DECOMPOSE_TAG} You are a planning agent in a team of agents. Split the goal into "
        f"2..{max_subgoals} concrete, non-overlapping subgoals that together complete it, "
        f"organised {strategy}. Mark a subgoal atomic when one agent can do it in one step. "
        "List in depends_on the 0-based indices of EARLIER subgoals whose results it needs. "
        "If the goal itself is already a single concrete step, answer "
        '{"atomic": true, "subgoals": []}. Reply with JSON only: '
        '{"atomic": false, "subgoals": [{"title": ..., "detail": ..., "depends_on": [], '
        '"atomic": true, "capabilities": []}]}'
    )
    lines = [
        f"Goal: {title}",
        f"Detail: {detail or '-'}",
        f"Within: {' > '.join(path[:-1]) or '(top level)'}",
        f"Depth: {depth} of max {max_depth}",
    ]
    if depth + 1 >= max_depth:
        lines.append("Subgoals at the next level must all be atomic.")
    if notes:
        lines.append("Earlier splits were rejected. Reviewers said:")
        lines += [f"- {n}" for n in notes[:12]]
    return [Message(role="system", content=system), Message(role="user", content="\n".join(lines))]


def score_schema(n: int) -> dict[str, Any]:
    """Reply schema of a scorer call over ``n`` proposals."""
    return {
        "title": "scores",
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "minItems": n,
                "items": {
                    "type": "object",
                    "properties": {
                        "proposal": {"type": "integer", "minimum": 0, "maximum": max(0, n - 1)},
                        "concreteness": _SCORE,
                        "non_overlap": _SCORE,
                        "completeness": _SCORE,
                        "notes": _TEXT,
                    },
                    "required": ["proposal", "concreteness", "non_overlap", "completeness"],
                },
            }
        },
        "required": ["scores"],
    }


def score_messages(
    *, title: str, path: Sequence[str], proposals: Sequence[Sequence[str]]
) -> list[Message]:
    """Ask for scores of competing proposals (each a list of subgoal lines)."""
    system = (
        f"{SCORE_TAG} You review plans. For EACH proposed split of the goal, score 0..10: "
        "concreteness (can each subgoal be acted on), non_overlap (no two subgoals do the "
        "same work), completeness (together they achieve the goal). Add short notes on what "
        "to fix. Reply with JSON only: "
        '{"scores": [{"proposal": 0, "concreteness": 7, "non_overlap": 8, '
        '"completeness": 6, "notes": "..."}]}'
    )
    parts = [f"Goal: {title}", f"Within: {' > '.join(path[:-1]) or '(top level)'}"]
    for i, subs in enumerate(proposals):
        parts.append(f"Proposal {i}:")
        parts += [f"  {line}" for line in subs]
    return [Message(role="system", content=system), Message(role="user", content="\n".join(parts))]


def execute_schema(tools: bool = False) -> dict[str, Any]:
    """Reply schema of an executor or synthesiser call (with ``tools``, a reply
    may be a tool call instead of a result)."""
    schema: dict[str, Any] = {
        "title": "execution",
        "type": "object",
        "properties": {"result": {"type": "string", "maxLength": 60000}},
        "required": ["result"],
    }
    if tools:
        schema["properties"]["tool"] = {"type": "string", "maxLength": 100}
        schema["properties"]["arguments"] = {"type": "object"}
        del schema["required"]
        schema["anyOf"] = [{"required": ["result"]}, {"required": ["tool"]}]
    return schema


def execute_messages(
    *,
    title: str,
    detail: str,
    path: Sequence[str],
    inputs: Sequence[tuple[str, str]],
    tools: Sequence[dict[str, Any]] = (),
) -> list[Message]:
    """Ask to carry out one leaf task."""
    system = (
        f"{EXECUTE_TAG} You are an agent carrying out one task of a larger plan. Do the task "
        'and reply with JSON only: {"result": "<what you found or did>"}.'
    )
    if tools:
        system += (
            ' You may instead call one tool per reply: {"tool": "<name>", "arguments": {...}}; '
            "its output is sent back to you. Tools: "
            + "; ".join(
                f"{t['name']}: {t.get('description', '')} "
                f"(arguments: {json.dumps(t.get('input_schema', {}).get('properties', {}))})"
                for t in tools
            )
        )
    lines = [f"Task: {title}", f"Detail: {detail or '-'}", f"Plan: {' > '.join(path)}"]
    if inputs:
        lines.append("Results of prerequisite tasks:")
        lines += [f"- {t}: {r[:_MAX_INPUT_CHARS]}" for t, r in inputs]
    return [Message(role="system", content=system), Message(role="user", content="\n".join(lines))]


def synth_messages(
    *, title: str, path: Sequence[str], inputs: Sequence[tuple[str, str]], final: bool
) -> list[Message]:
    """Ask to combine children's results into their parent's result."""
    what = "the final answer for the user" if final else "the result of the goal"
    system = (
        f"{SYNTH_TAG} You combine the results of subtasks into {what}. Be complete and "
        'concise; mention any subtask that failed. Reply with JSON only: {"result": "..."}'
    )
    lines = [f"Goal: {title}", f"Plan: {' > '.join(path)}", "Subtask results:"]
    lines += [f"- {t}: {r[:_MAX_INPUT_CHARS]}" for t, r in inputs]
    return [Message(role="system", content=system), Message(role="user", content="\n".join(lines))]
