"""What follows a correct candidate: profiling, a model's analysis, and where the loop goes next.

The Verifier's checks decide whether a candidate is correct; this module decides what to do with
one that is. Profiles and knowledge advice turn into ``FeedbackItem`` s, a model Verifier may add
its own after calling tools (ncu, the reference timeline, the knowledge index), and
``route_correct`` sends the loop to the Coder (items left), the Planner (a bottleneck with
headroom) or finalize (target met, budget spent, nothing left to gain).
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from stitch_graph.agents import prompts
from stitch_graph.agents.context import StitchContext
from stitch_graph.agents.feedback import knowledge_items
from stitch_graph.agents.state import StitchState
from stitch_graph.agents.tool_loop import agent_turn
from stitch_graph.agents.tools import verifier_tools
from stitch_graph.artifacts import (
    Candidate,
    Feedback,
    FeedbackItem,
    Plan,
    ProfileReport,
    Task,
    TimingResult,
)

__all__ = [
    "AnalysisDraft",
    "analysis_step",
    "budget_spent",
    "candidate_runner",
    "profile_program",
    "replan_gain",
    "replan_ruled_out",
    "route_correct",
]


class AnalysisDraft(BaseModel):
    """What a model Verifier answers with after analysing a correct candidate."""

    summary: str
    items: list[FeedbackItem] = Field(default_factory=list)


def candidate_runner(ctx: StitchContext) -> Any:
    """Where candidates run: the context's executor, else the local GPU worker pool."""
    if ctx.executor is not None:
        return ctx.executor
    from stitch_graph import execution

    return execution


def profile_program(task: Task, candidate: Candidate, ctx: StitchContext) -> ProfileReport:
    """The candidate's kernel profile, unless the run settings turn profiling off."""
    if not ctx.profile:
        return ProfileReport(status="not_run", reason="profiling disabled in the run settings")
    return candidate_runner(ctx).profile_candidate(task, candidate, ctx)


def budget_spent(state: StitchState, ctx: StitchContext, rounds: int) -> str | None:
    """Why the run must stop now, or None."""
    if rounds >= ctx.max_rounds:
        return f"round budget spent ({rounds}/{ctx.max_rounds})"
    started = state.get("started_at")
    if started is not None and time.time() - started >= ctx.wall_time_s:
        return f"wall-time budget spent ({ctx.wall_time_s:.0f} s)"
    return None


def analysis_step(
    model: Any, state: StitchState, ctx: StitchContext
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


def route_correct(
    state: StitchState,
    ctx: StitchContext,
    plan: Plan,
    rounds: int,
    timing: TimingResult | None,
    profile: ProfileReport | None,
    extra_items: list[FeedbackItem],
    summary: str,
) -> Feedback:
    """Where a correct (or compiled-but-unverifiable) candidate sends the loop next.

    A spent budget ends the run even with items left: the best correct program so far (partial,
    its missing items declared to PyTorch) is what the run returns, and the summary says so.
    """
    spent = budget_spent(state, ctx, rounds)
    left = [i.id for i in plan.items if i.status == "pending"]
    if spent and left:
        spent += f"; {len(left)} item(s) not generated: {', '.join(left)}"
        return Feedback(target="finalize", category="done", summary=f"{summary}; {spent}")
    if spent:
        # every item is done: the budget only rules out tuning and re-planning
        note = f"no rounds left to tune or re-plan ({rounds} of {ctx.max_rounds} used)"
        if spent.startswith("wall-time"):
            note = f"no time left to tune or re-plan (wall time of {ctx.wall_time_s:.0f} s used)"
        return Feedback(target="finalize", category="done", summary=f"{summary}; {note}")
    if left:
        return Feedback(target="coder", category="item_done", summary=summary)
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
        why = f"; {profile.reason}" if profile is not None and profile.reason else ""
        return Feedback(target="finalize", category="done", summary=f"{summary}{why}")
    ruled_out = replan_ruled_out(state, ctx, timing)
    if ruled_out is not None:
        return Feedback(target="finalize", category="done", summary=f"{summary}; {ruled_out}")
    if profile.headroom < ctx.min_headroom:
        return Feedback(
            target="finalize",
            category="done",
            summary=f"{summary}; {profile.bottleneck}-bound with ~{profile.headroom:.0%} headroom",
        )
    items = knowledge_items("profile", profile, ctx) + extra_items
    return Feedback(
        target="planner",
        category="bottleneck",
        summary=f"{profile.bottleneck}-bound, ~{profile.headroom:.0%} headroom",
        items=items,
    )


def replan_ruled_out(
    state: StitchState, ctx: StitchContext, timing: TimingResult | None
) -> str | None:
    """Why no further re-plan may follow this round (re-plans spent, or the last one gained
    under ``min_replan_gain``), or None."""
    if state.get("replans", 0) >= ctx.max_replans:
        return "re-plans spent"
    gain = replan_gain(state.get("history", []), timing)
    if gain is not None and gain < 1.0 + ctx.min_replan_gain:
        return f"the last re-plan gained {gain:.3f}x, so no further re-plan"
    return None


def replan_gain(history: list[Any], timing: TimingResult | None) -> float | None:
    """How much faster the best program got with the last re-plan: the best speedup since the
    last round that sent the loop to the Planner (this round's included) over the best before
    it; None before any re-plan.

    A re-plan whose rounds found nothing faster is a sign that the next one will not either:
    after autotuning has timed each kernel's space, a rule-based revision moves knobs the tuner
    already timed (MobileNetV1 and EfficientNetMBConv spent two 13 s rounds on that).
    """
    cut = max((i for i, r in enumerate(history) if r.feedback == "bottleneck"), default=None)
    if cut is None:
        return None

    def best(records: list[Any]) -> float | None:
        values = [r.speedup_vs_eager for r in records if r.test == "passed" and r.speedup_vs_eager]
        return max(values) if values else None

    before = best(history[: cut + 1])
    since = [best(history[cut + 1 :]), timing.speedup_vs_eager if timing else None]
    after = max((v for v in since if v), default=None)
    return after / before if before and after else None


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
