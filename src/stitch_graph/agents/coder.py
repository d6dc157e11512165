"""The Coder: writes the program one to-do item at a time.

The model brain drafts with tools (it may compile a draft with ``nvcc_compile`` through the
graph's ``coder_tools`` node before handing it over) and answers with a structured program. The
rule-based brain emits code from the plan with ``codegen`` and turns the Verifier's feedback into
tuning changes, so repeated rounds really change the program.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import (
    AnyMessage,
    HumanMessage,
    SystemMessage,
)
from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime
from pydantic import BaseModel, Field

from stitch_graph.agents import prompts
from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.agents.llm import model_label, resolve_model
from stitch_graph.agents.progress import emit
from stitch_graph.agents.state import StitchState
from stitch_graph.agents.tool_loop import agent_turn
from stitch_graph.agents.tools import coder_tools
from stitch_graph.artifacts import AgentFailure, Candidate, Feedback, Plan, Task, TodoItem


class CandidateDraft(BaseModel):
    """What a model Coder answers with: the whole program after this item."""

    kernel_source: str = Field(description='CUDA C++ with extern "C" __global__ kernels.')
    host_source: str = Field(description="Python module defining class ModelNew.")
    declared_torch_ops: list[str] = Field(default_factory=list)
    notes: str = ""


def current_item(plan: Plan | None) -> TodoItem | None:
    """The item the Coder works on now: the first pending one."""
    return plan.next_pending() if plan is not None else None


def _feedback_for_coder(state: StitchState) -> Feedback | None:
    feedback: Feedback | None = state.get("feedback")
    if feedback is None or feedback.category == "item_done":
        return None
    return feedback


def rule_candidate(
    task: Task, plan: Plan, item: TodoItem, state: StitchState
) -> tuple[Candidate, dict]:
    """Emit the program with the rule-based generator, applying feedback.

    The first program holds every pending item at once, so a model whose items all generate
    cleanly is verified in one round; once such a program fails, the Coder goes item by item
    (through ``item``), so each failure is found where it is.
    """
    from stitch_graph.agents.program_cache import program_ir
    from stitch_graph.codegen import Tuning, apply_feedback, emit_candidate

    memory = dict(state.get("coder_memory") or {})
    tuning = Tuning.model_validate(memory["tuning"]) if "tuning" in memory else Tuning()
    feedback = state.get("feedback")
    if feedback is not None and feedback.category in (
        "bottleneck",
        "wrong_result",
        "runtime_error",
    ):
        if memory.get("applied_feedback") != id_of(feedback):
            tuning = apply_feedback(tuning, plan, feedback)
            memory["applied_feedback"] = id_of(feedback)
    failed_batch = memory.get("batch") and feedback is not None and feedback.category in (
        "compile_error", "wrong_result", "runtime_error", "hack"
    )
    if failed_batch:
        memory["stepwise"] = True
    pending = [i.id for i in plan.items if i.status == "pending"]
    ir = program_ir(task, exact_order=plan.exact_order)
    batch = not memory.get("stepwise") and len(pending) > 1
    memory["batch"] = batch
    if batch:  # the whole program at once; a failure sends the Coder item by item
        whole = plan.model_copy(
            update={
                "items": [
                    i.model_copy(update={"status": "done"}) if i.status == "pending" else i
                    for i in plan.items
                ]
            }
        )
        candidate = emit_candidate(ir, whole, through=pending[-1], tuning=tuning)
        candidate = candidate.model_copy(update={"item_id": pending[-1], "item_ids": pending})
    else:
        candidate = emit_candidate(ir, plan, through=item.id, tuning=tuning)
    memory["tuning"] = tuning.model_dump()
    return candidate, memory


def plan_the_generator_follows(task: Task, plan: Plan) -> Plan:
    """``plan`` if the generator can follow it, else the generator's own schedule.

    A model Planner may name ops in words the rule-based generator cannot map onto the captured
    program; the Coder then works from its own fusion schedule instead of failing every item.
    """
    from stitch_graph.agents.program_cache import program_ir
    from stitch_graph.codegen import groups_from_plan, plan_program

    ir = program_ir(task, exact_order=plan.exact_order)
    try:
        groups_from_plan(ir, plan)
        return plan
    except ValueError:
        own = plan_program(ir)
    return own.model_copy(
        update={
            "summary": f"{own.summary} (rule-based schedule: the plan by {plan.author} names ops "
            "the generator cannot map)",
            "revision": plan.revision,
            "hotspots": plan.hotspots,
        }
    )


def exact_order_plan(task: Task, plan: Plan, feedback: Feedback | None) -> Plan | None:
    """After a wrong result from a program whose capture reordered a sum's terms (a GEMM's
    summed features as a summed weight, say), the plan of the program that keeps the
    reference's order: such a result may miss the tolerance by rounding alone. ``None`` where
    that does not apply."""
    from stitch_graph.agents.program_cache import program_ir
    from stitch_graph.codegen import plan_program

    if feedback is None or feedback.category != "wrong_result" or plan.exact_order:
        return None
    reordered = program_ir(task).reordered
    if not reordered:
        return None
    exact = plan_program(program_ir(task, exact_order=True), hotspots=plan.hotspots)
    summary = (
        f"{exact.summary} | revision {plan.revision + 1}: the result missed the tolerance; "
        f"sums keep the reference's order (left out: {', '.join(reordered)})"
    )
    return exact.model_copy(update={"revision": plan.revision + 1, "summary": summary})


def rule_step(
    task: Task, plan: Plan, item: TodoItem, state: StitchState, writer: Any
) -> dict[str, Any]:
    """One rule-based step; an item the generator cannot change is given up, not retried."""
    failures = list(state.get("failures", []))
    feedback = state.get("feedback")
    exact = exact_order_plan(task, plan, feedback)
    if exact is not None:  # a new program: the old plan's knobs and batching do not apply
        emit(writer, "coder", "summing in the reference's order", items=len(exact.items))
        plan, item = exact, exact.next_pending()
        state = {**state, "coder_memory": {"applied_feedback": id_of(feedback)}}
    followed = plan_the_generator_follows(task, plan)
    if followed is not plan:
        emit(writer, "coder", "using the generator's own schedule", items=len(followed.items))
        plan, item = followed, followed.next_pending()
    while item is not None:
        try:
            candidate, memory = rule_candidate(task, plan, item, state)
        except Exception as exc:  # an op the generator mis-handles is a recorded failure
            reason = f"rule-based coder failed on {item.id}: {exc}"
        else:
            if candidate.digest != state.get("verified_digest"):
                emit(writer, "coder", "candidate ready", digest=candidate.digest)
                return {
                    "candidate": candidate,
                    "coder_memory": memory,
                    "coder_status": "submitted",
                    "plan": plan,
                }
            feedback = state.get("feedback")
            reason = (
                f"rule-based coder has no other program for {item.id} after "
                f"{feedback.category if feedback else 'the last verdict'}"
            )
        failures.append(AgentFailure(agent="coder", reason=reason))
        emit(writer, "coder", "gave up item", item=item.id, detail=reason)
        items = [
            i.model_copy(update={"status": "failed", "note": reason}) if i.id == item.id else i
            for i in plan.items
        ]
        plan = plan.model_copy(update={"items": items})
        item = plan.next_pending()
    return {"failures": failures, "coder_status": "failed", "plan": plan}


def id_of(feedback: Feedback) -> str:
    """A stable identity of a feedback object (feedback is applied once)."""
    return str(hash(feedback.model_dump_json()))


def model_candidate(
    model: Any,
    task: Task,
    plan: Plan,
    item: TodoItem,
    state: StitchState,
    ctx: StitchContext,
) -> dict[str, Any]:
    """One step of the model Coder: a tool call to run, or the finished program."""

    def start() -> list[AnyMessage]:
        request = prompts.coder_request(
            task, plan, item, previous=state.get("candidate"), feedback=_feedback_for_coder(state)
        )
        return [SystemMessage(content=prompts.CODER_SYSTEM), HumanMessage(content=request)]

    turn = agent_turn(
        model,
        agent="coder",
        history=state.get("coder_messages"),
        start=start,
        tools=coder_tools(),
        schema=CandidateDraft,
        ctx=ctx,
        closing="program handed to the Verifier",
    )
    if turn.calls_tools:
        return {"coder_messages": turn.messages, "coder_status": "tools"}
    if turn.answer is None:
        return {
            "coder_messages": turn.messages,
            "failures": [*state.get("failures", []), turn.failure],
            "coder_status": "failed",
        }
    draft = turn.answer
    candidate = Candidate(
        kernel_source=draft.kernel_source,
        host_source=draft.host_source,
        declared_torch_ops=draft.declared_torch_ops,
        notes=draft.notes,
        item_id=item.id,
        author=model_label(model),
    )
    return {"coder_messages": turn.messages, "candidate": candidate, "coder_status": "submitted"}


def coder_node(state: StitchState, runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Write (or fix, or tune) the program for the current to-do item."""
    ctx = resolve_context(runtime.context)
    writer = get_stream_writer()
    task: Task = state["task"]
    plan: Plan = state["plan"]
    item = current_item(plan)
    if item is None:
        failure = AgentFailure(agent="coder", reason="no pending to-do item")
        return {"failures": [*state.get("failures", []), failure], "coder_status": "failed"}
    model = resolve_model(ctx.coder_model)
    emit(writer, "coder", "writing", item=item.id, kernel=item.kernel, model=model_label(model))
    if model is None:
        return rule_step(task, plan, item, state, writer)
    update = model_candidate(model, task, plan, item, state, ctx)
    if "candidate" in update:
        emit(writer, "coder", "candidate ready", digest=update["candidate"].digest)
    elif update.get("failures"):
        emit(writer, "coder", "failed", detail=update["failures"][-1].reason)
    else:
        emit(writer, "coder", "calling tools")
    return update
