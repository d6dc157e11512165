"""The Verifier: compiles, checks, times and profiles a candidate, then routes the loop.

The checks are never left to a model: static hack checks, the real nvcc, isolated correctness
and timing runs. What a model may add is the analysis of a correct program (through the graph's
``verifier_tools`` node: ncu, the reference timeline, the knowledge index). Its verdict is a
``Feedback`` whose ``target`` the graph's router follows: compile errors, wrong results and hacks
go to the Coder, a bottleneck with headroom to the Planner, a finished or spent run to finalize.
"""

from __future__ import annotations

import time
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
from stitch_graph.agents.llm import resolve_model
from stitch_graph.agents.progress import emit
from stitch_graph.agents.tool_loop import agent_turn
from stitch_graph.agents.tools import verifier_tools
from stitch_graph.artifacts import (
    AgentFailure,
    BestProgram,
    Candidate,
    CompileResult,
    Feedback,
    FeedbackItem,
    Plan,
    ProfileReport,
    RoundRecord,
    Task,
    TestResult,
    TimingResult,
)

REFERENCE_FAILED = "reference failed"


class AnalysisDraft(BaseModel):
    """What a model Verifier answers with after analysing a correct candidate."""

    summary: str
    items: list[FeedbackItem] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Checks


def compile_candidate(candidate: Candidate, ctx: StitchContext) -> CompileResult:
    """Build the candidate with the real nvcc in the form it declares."""
    from stitch_graph.toolchain.nvcc import nvcc_compile

    work_dir = f"{ctx.work_dir}/builds" if ctx.work_dir else None
    if candidate.form == "nvcc_shared":
        return nvcc_compile(
            candidate.kernel_source,
            arch=ctx.gpu_arch,
            mode="shared",
            host_cpp=candidate.host_cpp,
            link_libraries=candidate.link_libraries,
            work_dir=work_dir,
        )
    return nvcc_compile(candidate.kernel_source, arch=ctx.gpu_arch, work_dir=work_dir)


def _knowledge_items(kind: str, subject: Any, ctx: StitchContext) -> list[FeedbackItem]:
    if not ctx.use_knowledge:
        return []
    try:
        from stitch_graph.knowledge import advice_for_compile, advice_for_profile
    except ImportError:  # pragma: no cover - the index is part of the package
        return []
    try:
        if kind == "compile":
            return advice_for_compile(subject)
        return advice_for_profile(subject)
    except Exception:  # advice is a bonus; a broken index must not stop verification
        return []


def compile_feedback(result: CompileResult, ctx: StitchContext) -> Feedback:
    """Feedback for a failed build: every error with its line, plus advice."""
    items = [
        FeedbackItem(
            action="fix compile error",
            detail=f"{d.file}:{d.line}: {d.message}" if d.line else d.message,
            source="nvcc",
        )
        for d in (result.errors or result.diagnostics)[:20]
    ]
    if not items:
        items = [FeedbackItem(action="fix build", detail=result.log[-2000:], source="nvcc")]
    items += _knowledge_items("compile", result, ctx)
    return Feedback(
        target="coder",
        category="compile_error",
        summary=f"nvcc failed with {len(result.errors)} error(s)",
        items=items,
    )


def test_feedback(test: TestResult) -> Feedback:
    """Feedback for a candidate that ran wrong or crashed."""
    items = [FeedbackItem(action="fix", detail=test.reason, source="harness")]
    for check in test.outputs:
        problems = []
        if not check.shape_ok:
            problems.append("wrong shape")
        if not check.dtype_ok:
            problems.append("wrong dtype")
        if check.unwritten:
            problems.append("elements left unwritten")
        if check.aliases_input:
            problems.append("output aliases an input")
        if not check.nonfinite_ok:
            problems.append("NaN/Inf where the reference has none")
        if check.mismatch_fraction > 0:
            problems.append(
                f"{check.mismatch_fraction:.2%} of elements differ (max abs {check.max_abs_error:.3g},"
                f" max rel {check.max_rel_error:.3g})"
            )
        if problems:
            detail = f"output {check.index}: " + "; ".join(problems)
            items.append(FeedbackItem(action="fix output", detail=detail, source="harness"))
    category = "wrong_result" if test.status == "failed" else "runtime_error"
    return Feedback(target="coder", category=category, summary=test.reason, items=items)


# --------------------------------------------------------------------------------------------
# Bookkeeping


def _mark(plan: Plan, item_id: str | None, status: str, note: str = "") -> Plan:
    items = [
        i.model_copy(update={"status": status, "note": note or i.note}) if i.id == item_id else i
        for i in plan.items
    ]
    return plan.model_copy(update={"items": items})


def _is_better(new: BestProgram, old: BestProgram | None) -> bool:
    if old is None:
        return True
    if len(new.declared_torch_ops) != len(old.declared_torch_ops):
        return len(new.declared_torch_ops) < len(old.declared_torch_ops)
    new_ms = new.timing.candidate_ms if new.timing else None
    old_ms = old.timing.candidate_ms if old.timing else None
    if new_ms is None or old_ms is None:
        return new_ms is not None or old_ms is None
    return new_ms < old_ms


def budget_spent(state: dict[str, Any], ctx: StitchContext, rounds: int) -> str | None:
    """Why the run must stop now, or None."""
    if rounds >= ctx.max_rounds:
        return f"round budget spent ({rounds}/{ctx.max_rounds})"
    started = state.get("started_at")
    if started is not None and time.time() - started >= ctx.wall_time_s:
        return f"wall-time budget spent ({ctx.wall_time_s:.0f} s)"
    return None


def _after_failure(
    plan: Plan, item_id: str | None, attempts: int, feedback: Feedback, ctx: StitchContext
) -> tuple[Plan, Feedback, int]:
    """Retry the item with the Coder, or give it up and move on once its retries are spent."""
    if attempts < ctx.max_retries_per_item:
        return plan, feedback, attempts
    plan = _mark(plan, item_id, "failed", note=feedback.summary)
    summary = f"{item_id} given up after {attempts} attempts: {feedback.summary}"
    if plan.next_pending() is None:
        return plan, Feedback(target="finalize", category=feedback.category, summary=summary), 0
    return plan, Feedback(target="coder", category="item_done", summary=summary), 0


# --------------------------------------------------------------------------------------------
# The node


def _analysis_step(
    model: Any, state: dict[str, Any], ctx: StitchContext
) -> tuple[dict[str, Any], AnalysisDraft | None]:
    """One step of the model's analysis: a tool call to run, or its findings."""

    def start() -> list[AnyMessage]:
        request = prompts.verifier_request(
            state["task"],
            state["candidate"],
            state["compile_result"],
            state["test_result"],
            state.get("timing"),
        )
        return [SystemMessage(content=prompts.VERIFIER_SYSTEM), HumanMessage(content=request)]

    turn = agent_turn(
        model,
        agent="verifier",
        history=state.get("verifier_messages"),
        start=start,
        tools=verifier_tools(),
        schema=AnalysisDraft,
        ctx=ctx,
        closing="analysis done",
    )
    update: dict[str, Any] = {
        "verifier_messages": turn.messages,
        "verifier_status": "tools" if turn.calls_tools else "done",
    }
    if turn.failure is not None:
        update["failures"] = [*state.get("failures", []), turn.failure]
    return update, turn.answer


def candidate_runner(ctx: StitchContext) -> Any:
    """Where candidates run: the context's executor, else the local GPU worker pool."""
    if ctx.executor is not None:
        return ctx.executor
    from stitch_graph import execution

    return execution


def _profile(task: Task, candidate: Candidate, ctx: StitchContext) -> ProfileReport:
    if not ctx.profile:
        return ProfileReport(status="not_run", reason="profiling disabled in the run settings")
    return candidate_runner(ctx).profile_candidate(task, candidate, ctx)


def _route_correct(
    state: dict[str, Any],
    ctx: StitchContext,
    plan: Plan,
    rounds: int,
    timing: TimingResult | None,
    profile: ProfileReport | None,
    extra_items: list[FeedbackItem],
    summary: str,
) -> Feedback:
    """Where a correct (or compiled-but-unverifiable) candidate sends the loop next."""
    if plan.next_pending() is not None:
        return Feedback(target="coder", category="item_done", summary=summary)
    spent = budget_spent(state, ctx, rounds)
    if spent:
        return Feedback(target="finalize", category="done", summary=f"{summary}; {spent}")
    speedup = timing.speedup_vs_compile if timing else None
    if ctx.target_speedup and speedup and speedup >= ctx.target_speedup:
        return Feedback(
            target="finalize",
            category="done",
            summary=f"target met: {speedup:.2f}x vs torch.compile",
        )
    alternative = _convolution_alternative(state.get("candidate"), timing)
    if alternative and state.get("replans", 0) < ctx.max_replans:
        return Feedback(
            target="planner",
            category="bottleneck",
            summary=f"{summary}; {alternative.action}",
            items=[alternative, *extra_items],
        )
    if profile is None or profile.status != "passed":
        return Feedback(target="finalize", category="done", summary=summary)
    if state.get("replans", 0) >= ctx.max_replans:
        return Feedback(target="finalize", category="done", summary=f"{summary}; re-plans spent")
    if profile.headroom < ctx.min_headroom:
        return Feedback(
            target="finalize",
            category="done",
            summary=f"{summary}; {profile.bottleneck}-bound with ~{profile.headroom:.0%} headroom",
        )
    items = _knowledge_items("profile", profile, ctx) + extra_items
    return Feedback(
        target="planner",
        category="bottleneck",
        summary=f"{profile.bottleneck}-bound, ~{profile.headroom:.0%} headroom",
        items=items,
    )


def _convolution_alternative(
    candidate: Candidate | None, timing: TimingResult | None
) -> FeedbackItem | None:
    """One try of the generated convolution when the cuDNN one leaves the program slower than
    eager: cuDNN's heuristic pick is not always its fastest kernel, and the best program is kept
    either way."""
    speedup = timing.speedup_vs_eager if timing else None
    if candidate is None or speedup is None or speedup >= 1.0:
        return None
    if "KERNELS.conv(" not in candidate.host_source and (
        "KERNELS.conv_transpose(" not in candidate.host_source
    ):
        return None
    return FeedbackItem(
        action="try the generated convolution (im2col + cuBLAS) instead of cuDNN",
        detail=f"{speedup:.2f}x vs eager with cuDNN convolutions",
        source="timing",
    )


def verifier_node(state: dict[str, Any], runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Verify the current candidate and decide who acts next."""
    ctx = resolve_context(runtime.context)
    writer = get_stream_writer()
    task: Task = state["task"]
    plan: Plan = state["plan"]
    candidate: Candidate = state["candidate"]
    model = resolve_model(ctx.verifier_model)
    if state.get("verifier_status") == "tools":
        update, draft = _analysis_step(model, state, ctx)
        if update.get("verifier_status") == "tools":
            return update
        extra = draft.items if draft else []
        feedback = _route_correct(
            state,
            ctx,
            plan,
            state.get("rounds", 0),
            state.get("timing"),
            state.get("profile"),
            extra,
            draft.summary if draft else "analysis unavailable",
        )
        record = state["history"][-1].model_copy(
            update={"feedback": feedback.category, "summary": feedback.summary}
        )
        return {**update, "feedback": feedback, "history": [record]}

    started = time.time()
    rounds = state.get("rounds", 0) + 1
    item_id = candidate.item_id
    attempts = state.get("item_attempts", 0) + 1
    update: dict[str, Any] = {"rounds": rounds, "verified_digest": candidate.digest}
    record = RoundRecord(
        round=rounds, item_id=item_id, candidate_digest=candidate.digest, author=candidate.author
    )
    emit(writer, "verifier", "checking", round=rounds, item=item_id)

    from stitch_graph.checks.hacks import check_candidate

    hacks = check_candidate(candidate, reference_source=task.source)
    update["hack_report"] = hacks
    feedback: Feedback | None = None
    test = timing = profile = None
    if hacks.rejected:
        feedback = Feedback(
            target="coder",
            category="hack",
            summary="rejected by static checks: " + ", ".join(f.rule for f in hacks.findings),
            items=[
                FeedbackItem(action=f"remove {f.rule}", detail=f.detail, source="hack-check")
                for f in hacks.findings
            ],
        )
    else:
        emit(writer, "verifier", "compiling")
        compiled = compile_candidate(candidate, ctx)
        update["compile_result"] = compiled
        record.compiled = compiled.ok
        if not compiled.ok:
            feedback = compile_feedback(compiled, ctx)
        else:
            update["last_compiled"] = candidate
            emit(writer, "verifier", "testing")
            outcome = candidate_runner(ctx).verify_candidate(
                task, candidate, ctx, compile_result=compiled
            )
            test, timing = outcome.test, outcome.timing
            update["test_result"], update["timing"] = test, timing
            record.test = test.status
            if timing is not None:
                record.speedup_vs_eager = timing.speedup_vs_eager
                record.speedup_vs_compile = timing.speedup_vs_compile
            if test.status in ("failed", "error"):
                feedback = test_feedback(test)
            if test.status == "error" and test.reason.startswith(REFERENCE_FAILED):
                # no program can be judged against a reference that does not run: stop here
                failure = AgentFailure(agent="verifier", reason=test.reason)
                update["failures"] = [*state.get("failures", []), failure]
                feedback = Feedback(
                    target="finalize", category="runtime_error", summary=test.reason
                )

    if feedback is not None:
        plan, feedback, attempts = _after_failure(plan, item_id, attempts, feedback, ctx)
        spent = budget_spent(state, ctx, rounds)
        if spent and feedback.target != "finalize":
            feedback = Feedback(
                target="finalize",
                category=feedback.category,
                summary=f"{feedback.summary}; {spent}",
                items=feedback.items,
            )
        update["item_attempts"] = attempts
    else:
        unverified = test is not None and test.status == "not_run"
        note = "compiled; correctness not run: no GPU" if unverified else "verified"
        plan = _mark(plan, item_id, "done", note=note)
        update["item_attempts"] = 0
        if not unverified:
            best = BestProgram(
                round=rounds,
                candidate=candidate,
                test=test,
                timing=timing,
                covered_ops=[op for i in plan.items if i.status == "done" for op in i.ops],
                declared_torch_ops=candidate.declared_torch_ops,
            )
            if _is_better(best, state.get("best")):
                update["best"] = best
            if plan.next_pending() is None and budget_spent(state, ctx, rounds) is None:
                emit(writer, "verifier", "profiling")
                profile = _profile(task, candidate, ctx)
                update["profile"] = profile
        summary = "all items done" if plan.next_pending() is None else f"{item_id} done"
        if unverified:
            summary += " (compiled only: correctness and timing need a GPU)"
        if model is not None and not unverified and plan.next_pending() is None:
            state_now = {**state, **update, "plan": plan}
            analysis, draft = _analysis_step(model, state_now, ctx)
            update.update(analysis)
            if analysis.get("verifier_status") == "tools":
                update["plan"] = plan
                record.summary = "analysing"
                record.seconds = time.time() - started
                update["history"] = [record]
                return update
            extra = draft.items if draft else []
        else:
            extra = []
        feedback = _route_correct(state, ctx, plan, rounds, timing, profile, extra, summary)
    update["plan"] = plan
    update["feedback"] = feedback
    update.setdefault("verifier_status", "done")
    record.feedback = feedback.category
    record.summary = feedback.summary
    record.seconds = time.time() - started
    update["history"] = [record]
    emit(
        writer,
        "verifier",
        "verdict",
        round=rounds,
        category=feedback.category,
        target=feedback.target,
        summary=feedback.summary,
    )
    return update
