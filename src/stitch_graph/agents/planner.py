"""The Planner: profiles the reference and writes the to-do list the Coder works through.

Two brains write the same ``Plan``: a chat model (structured output) or the rule-based planner
backed by ``codegen`` (capture the reference as a graph, group ops into kernels). A re-plan is
asked for by the Verifier when a correct program still has a bottleneck with headroom.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime
from pydantic import BaseModel, Field

from stitch_graph.agents import prompts
from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.agents.llm import model_label, resolve_model, structured_call
from stitch_graph.agents.progress import emit
from stitch_graph.agents.state import StitchState
from stitch_graph.artifacts import (
    AgentFailure,
    Feedback,
    HostPlan,
    Plan,
    ProfileReport,
    Task,
    TodoItem,
)


class TodoDraft(BaseModel):
    """One item of a model-written plan."""

    kernel: str
    ops: list[str] = Field(default_factory=list)
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    fusion: str = ""
    constraints: list[str] = Field(default_factory=list)
    kind: str = "other"


class PlanDraft(BaseModel):
    """What a model Planner answers with."""

    summary: str
    items: list[TodoDraft]
    host: HostPlan = Field(default_factory=HostPlan)
    unsupported_ops: list[str] = Field(default_factory=list)


_KINDS = {"pointwise", "reduction", "norm", "gemm", "conv", "host", "other"}


def plan_from_draft(draft: PlanDraft, *, revision: int, author: str) -> Plan:
    """Turn a model's draft into a ``Plan`` with stable item ids."""
    items = [
        TodoItem(
            id=f"k{i + 1}",
            kernel=d.kernel,
            ops=d.ops,
            shapes=d.shapes,
            fusion=d.fusion,
            constraints=d.constraints,
            kind=d.kind if d.kind in _KINDS else "other",
        )
        for i, d in enumerate(draft.items)
    ]
    return Plan(
        summary=draft.summary,
        items=items,
        host=draft.host,
        unsupported_ops=draft.unsupported_ops,
        revision=revision,
        author=author,
    )


def rule_plan(
    task: Task,
    *,
    previous: Plan | None,
    feedback: Feedback | None,
    profile: ProfileReport | None,
) -> Plan:
    """The rule-based plan: codegen's fusion schedule, or a revision of the previous plan."""
    from stitch_graph.agents.program_cache import program_ir
    from stitch_graph.codegen import plan_program

    hotspots = profile.hotspots if profile is not None else []
    if previous is None:
        return plan_program(program_ir(task), hotspots=hotspots)
    return revise_plan(previous, feedback)


def revise_plan(plan: Plan, feedback: Feedback | None) -> Plan:
    """Re-open every item with the Verifier's findings as constraints for the next pass."""
    findings = [f"{i.action}: {i.detail}".strip(": ") for i in (feedback.items if feedback else [])]
    items = [
        item.model_copy(
            update={
                "status": "pending",
                "constraints": list(dict.fromkeys([*item.constraints, *findings])),
            }
        )
        for item in plan.items
    ]
    host = plan.host
    if feedback is not None and any("graph" in f.lower() for f in findings):
        host = host.model_copy(update={"cuda_graph": True})
    summary = plan.summary
    if feedback is not None:
        summary = f"{plan.summary} | revision {plan.revision + 1}: {feedback.summary}"
    return plan.model_copy(
        update={"items": items, "host": host, "revision": plan.revision + 1, "summary": summary}
    )


def graph_ops(task: Task) -> list[str] | None:
    """The reference's captured ops as ``name = op(shape)`` lines, or None if it cannot be traced."""
    from stitch_graph.agents.program_cache import program_ir

    try:
        ir = program_ir(task)
    except Exception:  # a model Planner can still plan from the source alone
        return None
    return [f"{n.name} = {n.op}{list(n.shape)}" for n in ir.nodes]


def _reference_profile(task: Task, ctx: StitchContext) -> ProfileReport:
    """Time the reference op by op where a GPU is present; say why not otherwise.

    It runs where the Verifier's candidates run (the context's executor), as part of the run's
    reference worker, whose outputs and timings the Verifier then finds cached.
    """
    try:
        from stitch_graph.execution import gpu_available, reference_timeline
    except ImportError as exc:  # pragma: no cover - execution is part of the package
        return ProfileReport(status="not_run", reason=f"execution unavailable: {exc}")
    if not gpu_available():
        return ProfileReport(status="not_run", reason="not run: no GPU", source="torch.profiler")
    timeline = getattr(ctx.executor, "reference_timeline", None)
    return timeline(task, ctx) if timeline is not None else reference_timeline(task, ctx)


def planner_node(state: StitchState, runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Write the plan (first visit) or revise it (after a bottleneck report)."""
    ctx = resolve_context(runtime.context)
    writer = get_stream_writer()
    update: dict[str, Any] = {}
    task: Task | None = state.get("task")
    if task is None:
        from stitch_graph.agents.task_input import task_from_input

        task, failure = task_from_input(state)
        if task is None:
            emit(writer, "planner", "failed", detail=failure.reason)
            return {"failures": [*state.get("failures", []), failure]}
        update["task"] = task
    if "started_at" not in state:
        update["started_at"] = time.time()
    previous: Plan | None = state.get("plan")
    feedback = state.get("feedback") if previous is not None else None
    profile = state.get("reference_profile")
    if profile is None:
        emit(writer, "planner", "profiling reference")
        profile = _reference_profile(task, ctx)
        update["reference_profile"] = profile
    model = resolve_model(ctx.planner_model)
    emit(
        writer,
        "planner",
        "planning" if previous is None else "re-planning",
        model=model_label(model),
    )
    if model is None:
        try:
            plan = rule_plan(task, previous=previous, feedback=feedback, profile=profile)
        except Exception as exc:  # the reference may use constructs the tracer cannot follow
            failure = AgentFailure(agent="planner", reason=f"rule-based planning failed: {exc}")
            emit(writer, "planner", "failed", detail=failure.reason)
            return {**update, "failures": [*state.get("failures", []), failure]}
    else:
        request = prompts.planner_request(
            task, previous=previous, feedback=feedback, profile=profile, graph_ops=graph_ops(task)
        )
        draft, failure = structured_call(
            model,
            PlanDraft,
            [SystemMessage(content=prompts.PLANNER_SYSTEM), HumanMessage(content=request)],
            agent="planner",
            method=ctx.structured_output_method,
            retries=ctx.model_retries,
        )
        if draft is None:
            emit(writer, "planner", "failed", detail=failure.reason)
            return {**update, "failures": [*state.get("failures", []), failure]}
        revision = previous.revision + 1 if previous is not None else 0
        plan = plan_from_draft(draft, revision=revision, author=model_label(model))
    if previous is not None:
        update["replans"] = state.get("replans", 0) + 1
    emit(writer, "planner", "plan ready", items=len(plan.items), revision=plan.revision)
    return {**update, "plan": plan, "item_attempts": 0}
