"""The Verifier: compiles, checks, times and profiles a candidate, then routes the loop.

The checks are never left to a model: static hack checks, the real nvcc, isolated correctness
and timing runs. What a model may add is the analysis of a correct program (through the graph's
``verifier_tools`` node: ncu, the reference timeline, the knowledge index). Its verdict is a
``Feedback`` whose ``target`` the graph's router follows: compile errors, wrong results and hacks
go to the Coder, a bottleneck with headroom to the Planner, a finished or spent run to finalize.

``verifier_node`` runs one round as a sequence of steps, each a function below: open the round,
hack checks, compile, test, then either settle the failure or accept the candidate (best program,
profile, analysis, route), and close the round.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime

from stitch_graph.agents.analysis import (
    analysis_step,
    budget_spent,
    candidate_runner,
    profile_program,
    replan_ruled_out,
    route_correct,
)
from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.agents.feedback import compile_feedback, hack_feedback, test_feedback
from stitch_graph.agents.llm import resolve_model
from stitch_graph.agents.progress import emit
from stitch_graph.agents.state import StitchState
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

__all__ = ["compile_candidate", "verifier_node"]


# --------------------------------------------------------------------------------------------
# Checks


def compile_candidate(candidate: Candidate, ctx: StitchContext) -> CompileResult:
    """Build the candidate with the real nvcc in the form it declares; kernels alone, when
    there are many, in parts at once (``runtime.split``), as the worker's NVRTC builds them."""
    from stitch_graph.runtime.split import default_parts, split_kernels
    from stitch_graph.toolchain.nvcc import KERNEL_FILE, nvcc_compile, nvcc_compile_parts

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
    parts = split_kernels(candidate.kernel_source, default_parts(), line_file=KERNEL_FILE)
    if len(parts) > 1:
        return nvcc_compile_parts(parts, arch=ctx.gpu_arch, work_dir=work_dir)
    return nvcc_compile(candidate.kernel_source, arch=ctx.gpu_arch, work_dir=work_dir)


# --------------------------------------------------------------------------------------------
# Bookkeeping


def _mark(plan: Plan, item_id: str | None, status: str, note: str = "") -> Plan:
    """A copy of ``plan`` with item ``item_id`` set to ``status`` (and ``note``, if given)."""
    items = [
        i.model_copy(update={"status": status, "note": note or i.note}) if i.id == item_id else i
        for i in plan.items
    ]
    return plan.model_copy(update={"items": items})


def _is_better(new: BestProgram, old: BestProgram | None) -> bool:
    """Whether ``new`` beats ``old``: fewer ops left to PyTorch first, then the faster time."""
    if old is None:
        return True
    if len(new.declared_torch_ops) != len(old.declared_torch_ops):
        return len(new.declared_torch_ops) < len(old.declared_torch_ops)
    new_ms = new.timing.candidate_ms if new.timing else None
    old_ms = old.timing.candidate_ms if old.timing else None
    if new_ms is None or old_ms is None:
        return new_ms is not None or old_ms is None
    return new_ms < old_ms


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
# The steps of one round


@dataclass
class _Round:
    """One round in progress: its inputs, what the steps found so far, and the state update."""

    state: StitchState
    ctx: StitchContext
    writer: Any
    task: Task
    candidate: Candidate
    plan: Plan
    rounds: int
    attempts: int
    record: RoundRecord
    started: float
    update: dict[str, Any] = field(default_factory=dict)
    compiled: CompileResult | None = None
    test: TestResult | None = None
    timing: TimingResult | None = None
    profile: ProfileReport | None = None

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Add the seconds of the enclosed step to the round's record."""
        start = time.time()
        try:
            yield
        finally:
            steps = self.record.steps
            steps[step] = steps.get(step, 0.0) + time.time() - start


def _open_round(state: StitchState, ctx: StitchContext) -> _Round:
    """Count the round and the item's attempt, and start the round's record."""
    candidate = state["candidate"]
    rounds = state.get("rounds", 0) + 1
    current = _Round(
        state=state,
        ctx=ctx,
        writer=get_stream_writer(),
        task=state["task"],
        candidate=candidate,
        plan=state["plan"],
        rounds=rounds,
        attempts=state.get("item_attempts", 0) + 1,
        record=RoundRecord(
            round=rounds,
            item_id=candidate.item_id,
            candidate_digest=candidate.digest,
            author=candidate.author,
        ),
        started=time.time(),
        update={"rounds": rounds, "verified_digest": candidate.digest},
    )
    emit(current.writer, "verifier", "checking", round=rounds, item=candidate.item_id)
    return current


def _check_hacks(current: _Round) -> Feedback | None:
    """Run the static hack checks; a refused candidate goes back to the Coder unbuilt."""
    from stitch_graph.checks import check_candidate

    hacks = check_candidate(current.candidate, reference_source=current.task.source)
    current.update["hack_report"] = hacks
    return hack_feedback(hacks) if hacks.rejected else None


def _compile(current: _Round) -> Feedback | None:
    """Build the candidate with nvcc; compile errors go back to the Coder."""
    emit(current.writer, "verifier", "compiling")
    compiled = compile_candidate(current.candidate, current.ctx)
    current.compiled = compiled
    current.update["compile_result"] = compiled
    current.record.compiled = compiled.ok
    if not compiled.ok:
        return compile_feedback(compiled, current.ctx)
    current.update["last_compiled"] = current.candidate
    return None


def _test(current: _Round) -> Feedback | None:
    """Check and time the built candidate against the reference in an isolated worker."""
    emit(current.writer, "verifier", "testing")
    outcome = candidate_runner(current.ctx).verify_candidate(
        current.task, current.candidate, current.ctx, compile_result=current.compiled
    )
    test, timing = outcome.test, outcome.timing
    current.test, current.timing = test, timing
    current.update["test_result"], current.update["timing"] = test, timing
    current.record.test = test.status
    if timing is not None:
        current.record.speedup_vs_eager = timing.speedup_vs_eager
        current.record.speedup_vs_compile = timing.speedup_vs_compile
    if test.reference_failed:
        return _reference_failed(current, test)
    if test.status in ("failed", "error"):
        return test_feedback(test)
    return None


def _reference_failed(current: _Round, test: TestResult) -> Feedback:
    """Stop the run: no program can be judged against a reference that does not run."""
    failure = AgentFailure(agent="verifier", reason=test.reason)
    current.update["failures"] = [*current.state.get("failures", []), failure]
    return Feedback(target="finalize", category="runtime_error", summary=test.reason)


def _settle_failure(current: _Round, feedback: Feedback) -> Feedback:
    """Retry or give up the item, and stop instead when the budget is spent."""
    plan, feedback, attempts = _after_failure(
        current.plan, current.candidate.item_id, current.attempts, feedback, current.ctx
    )
    current.plan = plan
    current.update["item_attempts"] = attempts
    spent = budget_spent(current.state, current.ctx, current.rounds)
    if spent and feedback.target != "finalize":
        return Feedback(
            target="finalize",
            category=feedback.category,
            summary=f"{feedback.summary}; {spent}",
            items=feedback.items,
        )
    return feedback


def _accept(current: _Round) -> bool:
    """Mark the item done and keep the program if it is the best; whether it was verified."""
    verified = not (current.test is not None and current.test.status == "not_run")
    note = "verified" if verified else "compiled; correctness not run: no GPU"
    plan = current.plan
    for item_id in current.candidate.completes:
        plan = _mark(plan, item_id, "done", note=note)
    current.plan = plan
    current.update["item_attempts"] = 0
    if verified:
        best = BestProgram(
            round=current.rounds,
            candidate=current.candidate,
            test=current.test,
            timing=current.timing,
            covered_ops=[op for i in plan.items if i.status == "done" for op in i.ops],
            declared_torch_ops=current.candidate.declared_torch_ops,
        )
        if _is_better(best, current.state.get("best")):
            current.update["best"] = best
    return verified


def _profile_finished(current: _Round, model: Any) -> None:
    """Profile the program once every item is done and the budget still allows more work."""
    if current.plan.next_pending() is not None:
        return
    if budget_spent(current.state, current.ctx, current.rounds) is not None:
        return
    unused = None if model is not None else _profile_unused(current)
    if unused is not None:
        current.profile = ProfileReport(status="not_run", source="ncu", reason=unused)
        current.update["profile"] = current.profile
        return
    emit(current.writer, "verifier", "profiling")
    current.profile = profile_program(current.task, current.candidate, current.ctx)
    current.update["profile"] = current.profile


def _profile_unused(current: _Round) -> str | None:
    """Why no profile of this round could change where the rule-based loop goes, or None.

    A profile serves the tuning (once a run) and the decision to re-plan; once tuning is done
    and no re-plan may follow, ncu would cost its 10-19 s a round for nothing.
    """
    if current.state.get("tuning") is None:
        return None
    ruled_out = replan_ruled_out(current.state, current.ctx, current.timing)
    return f"not profiled: {ruled_out}" if ruled_out is not None else None


def _tune(current: _Round) -> Feedback | None:
    """Autotune a finished rule-generated program once per run; when timing found faster
    settings, hand them to the Coder, which re-emits the program for the next round to verify.

    The tuning worker times each kernel's settings on the task's real inputs and checks each
    against the reference first; the next round still judges the tuned program in full, and the
    best program is kept either way.
    """
    ctx, state, plan = current.ctx, current.state, current.plan
    runner = candidate_runner(ctx)
    tune = getattr(runner, "tune_candidate", None)
    if (
        not ctx.autotune
        or tune is None
        or state.get("tuning") is not None
        or plan.next_pending() is not None
        or current.candidate.author != "rules"
        or budget_spent(state, ctx, current.rounds + 1) is not None
    ):
        return None
    from stitch_graph.codegen import Tuning

    memory = dict(state.get("coder_memory") or {})
    tuning = Tuning.model_validate(memory["tuning"]) if "tuning" in memory else Tuning()
    emit(current.writer, "verifier", "tuning", budget_s=ctx.tune_budget_s)
    bottleneck = current.profile.bottleneck if current.profile is not None else None
    tuned, report = tune(
        current.task, plan, tuning, ctx, bottleneck=bottleneck, budget_s=ctx.tune_budget_s
    )
    current.update["tuning"] = report
    emit(current.writer, "verifier", "tuned", seconds=report.seconds, note=report.note)
    if tuned is None or tuned == tuning:
        return None
    current.update["coder_memory"] = {**memory, "tuning": tuned.model_dump()}
    current.plan = _mark(plan, current.candidate.item_id, "pending", "re-emit with tuned settings")
    changed = [f"{c.item}: {c.setting}" for c in report.choices if c.tried and c.setting]
    speedup = f", {report.speedup:.2f}x in the tuner's timing" if report.speedup else ""
    return Feedback(
        target="coder",
        category="tuned",
        summary=f"autotuned in {report.seconds:.1f} s{speedup}: {'; '.join(changed) or 'settings'}",
    )


def _progress_summary(current: _Round, verified: bool) -> str:
    """One line on how far the plan has come with this candidate."""
    item_id = current.candidate.item_id
    summary = "all items done" if current.plan.next_pending() is None else f"{item_id} done"
    if not verified:
        summary += " (compiled only: correctness and timing need a GPU)"
    return summary


def _analyse(model: Any, current: _Round) -> list[FeedbackItem] | None:
    """The model's analysis of the finished program: its items, or None while it calls tools."""
    if model is None or current.plan.next_pending() is not None:
        return []
    state_now = cast(StitchState, {**current.state, **current.update, "plan": current.plan})
    analysis, draft = analysis_step(model, state_now, current.ctx)
    current.update.update(analysis)
    if analysis.get("verifier_status") == "tools":
        return None
    return draft.items if draft else []


def _pause_for_tools(current: _Round) -> dict[str, Any]:
    """The update that sends the Verifier to its tool node mid-analysis, the round still open."""
    current.update["plan"] = current.plan
    current.record.summary = "analysing"
    current.record.seconds = time.time() - current.started
    current.update["history"] = [current.record]
    return current.update


def _close_round(current: _Round, feedback: Feedback) -> dict[str, Any]:
    """Record the verdict in the round's record and the state update, and announce it."""
    update = current.update
    update["plan"] = current.plan
    update["feedback"] = feedback
    update.setdefault("verifier_status", "done")
    current.record.feedback = feedback.category
    current.record.summary = feedback.summary
    current.record.seconds = time.time() - current.started
    update["history"] = [current.record]
    emit(
        current.writer,
        "verifier",
        "verdict",
        round=current.rounds,
        category=feedback.category,
        target=feedback.target,
        summary=feedback.summary,
    )
    return update


def _resume_analysis(model: Any, state: StitchState, ctx: StitchContext) -> dict[str, Any]:
    """Continue the model's analysis after its tools ran, and route once it has answered."""
    update, draft = analysis_step(model, state, ctx)
    if update.get("verifier_status") == "tools":
        return update
    feedback = route_correct(
        state,
        ctx,
        state["plan"],
        state.get("rounds", 0),
        state.get("timing"),
        state.get("profile"),
        draft.items if draft else [],
        draft.summary if draft else "analysis unavailable",
    )
    record = state["history"][-1].model_copy(
        update={"feedback": feedback.category, "summary": feedback.summary}
    )
    return {**update, "feedback": feedback, "history": [record]}


# --------------------------------------------------------------------------------------------
# The node


def verifier_node(state: StitchState, runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Verify the current candidate and decide who acts next."""
    ctx = resolve_context(runtime.context)
    model = resolve_model(ctx.verifier_model)
    if state.get("verifier_status") == "tools":
        return _resume_analysis(model, state, ctx)
    current = _open_round(state, ctx)
    with current.timed("checks"):
        failed = _check_hacks(current)
    if failed is None:
        with current.timed("build"):
            failed = _compile(current)
    if failed is None:
        with current.timed("test"):
            failed = _test(current)
    if failed is not None:
        return _close_round(current, _settle_failure(current, failed))
    verified = _accept(current)
    if verified:
        with current.timed("profile"):
            _profile_finished(current, model)
        with current.timed("tuning"):
            tuned = _tune(current)
        if tuned is not None:
            return _close_round(current, tuned)
    summary = _progress_summary(current, verified)
    extra = _analyse(model, current) if verified else []
    if extra is None:
        return _pause_for_tools(current)
    feedback = route_correct(
        state, ctx, current.plan, current.rounds, current.timing, current.profile, extra, summary
    )
    return _close_round(current, feedback)
