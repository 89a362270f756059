"""The A2A Agent Card of a node: what it offers and which roles its mesh runs.

The card names the node (its ``name`` if it holds one, else its address),
one skill to submit a goal to the leaderless planner, and one skill per
planner role live in the node's mesh, with how many agents announced it
(``plan.show``'s ``roles``). It is rebuilt for each request of the card
(:func:`refresh`), so a role that joins or leaves shows at the next read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT

from hivemesh.commands import Names, PlanShow, Status
from hivemesh.core.plan_events import ROLES

__all__ = ["ROLE_TEXT", "build_card", "refresh"]

#: What each planner role does, for the card's skills.
ROLE_TEXT: Mapping[str, str] = {
    "decomposer": "proposes splits of a goal into subgoals",
    "scorer": "votes on proposed splits (a quorum accepts one)",
    "executor": "claims leaf tasks and runs them with an LLM and tools",
    "observer": "rebuilds and shows the plan tree from the journal",
}


def build_card(url: str, *, node: str, roles: Mapping[str, int], version: str) -> AgentCard:
    """The card of ``node`` served at ``url`` with ``roles`` (role -> live agents)."""
    skills = [
        AgentSkill(
            id="goal",
            name="Plan and run a goal",
            description=(
                "Send a goal as text; the mesh's decomposers split it, its scorers vote, "
                "its executors run the leaves. The task follows the plan tree: submitted, "
                "working, input-required (a question for a human), completed with the "
                "answer as an artifact, failed or canceled."
            ),
            tags=["planning", "multi-agent", "hivemesh"],
            examples=["Plan a weekend in Porto", "Compare three vendors' prices"],
        )
    ]
    for role in ROLES:
        n = roles.get(role, 0)
        if n:
            skills.append(
                AgentSkill(
                    id=f"role.{role}",
                    name=f"{role} ({n} live)",
                    description=f"{n} agent(s) of this mesh: {ROLE_TEXT.get(role, role)}",
                    tags=["role", role],
                )
            )
    return AgentCard(
        name=f"hivemesh {node}",
        description="A node of a hivemesh swarm: a leaderless planner over a signed journal.",
        version=version,
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_CURRENT
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )


async def refresh(client: Any, url: str, version: str) -> AgentCard:
    """The current card of the node ``client`` reaches."""
    status = (await client.run(Status())).to_wire()
    address = str(status.get("address", "node"))
    names = (await client.run(Names())).to_wire()
    mine = sorted(n for n, owner in _owners(names) if owner == address)
    roles = (await client.run(PlanShow())).to_wire().get("roles") or {}
    return build_card(url, node=mine[0] if mine else address[:16], roles=roles, version=version)


def _owners(names: Any) -> list[tuple[str, str]]:
    if isinstance(names, dict):
        return [(str(k), str(v)) for k, v in names.items() if isinstance(v, str)]
    return []
