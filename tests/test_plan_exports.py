"""The planner's public surface changes only on purpose (httpx style)."""

from __future__ import annotations

import hivemesh.core.plan as plan
import hivemesh.core.plan_events as plan_events
import hivemesh.llm as llm
import hivemesh.roles as roles

EXPECTED = {
    llm: [
        "HOW_TO_CONFIGURE",
        "FixedLatencyLLM",
        "LLMConfig",
        "LLMProvider",
        "LLMResult",
        "LlamaCppProvider",
        "Message",
        "OpenAICompatProvider",
        "RetryPolicy",
        "ScriptedLLM",
        "UsageHook",
        "extract_json",
        "provider_from_config",
    ],
    roles: [
        "Action",
        "Decomposer",
        "Emit",
        "Executor",
        "Job",
        "LocalJournal",
        "LocalSwarm",
        "MCPToolBox",
        "Observer",
        "Role",
        "RoleDriver",
        "Scorer",
        "ToolBox",
        "failure_events",
    ],
    plan: ["NodeState", "PlanView", "TaskInfo"],
}


def test_exported_members() -> None:
    for mod, names in EXPECTED.items():
        assert sorted(mod.__all__) == sorted(names), mod.__name__
        for name in names:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_plan_event_kinds_are_namespaced() -> None:
    ours = plan_events.ALL_KINDS - {plan_events.KIND_MEMBER_DOWN}
    assert all(k.startswith("plan.") for k in ours)
    # plus the witnesses that order claims and results (core.witness)
    assert plan.PlanView.kinds == plan_events.ALL_KINDS | {"witness"}
