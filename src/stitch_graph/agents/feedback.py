"""What the Verifier tells the Coder when a candidate fails: refusals, compile and test errors.

Each finding becomes a ``FeedbackItem`` the Coder can act on, with advice from the knowledge
index where it has some (compile errors here, profiles in ``analysis``).
"""

from __future__ import annotations

from typing import Any

from stitch_graph.agents.context import StitchContext
from stitch_graph.artifacts import CompileResult, Feedback, FeedbackItem, HackReport, TestResult

__all__ = ["compile_feedback", "hack_feedback", "knowledge_items", "test_feedback"]


def knowledge_items(kind: str, subject: Any, ctx: StitchContext) -> list[FeedbackItem]:
    """Advice from the knowledge index for a compile result (``kind="compile"``) or a profile."""
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


def hack_feedback(hacks: HackReport) -> Feedback:
    """Feedback for a candidate the static checks refuse: each finding to remove."""
    return Feedback(
        target="coder",
        category="hack",
        summary="rejected by static checks: " + ", ".join(f.rule for f in hacks.findings),
        items=[
            FeedbackItem(action=f"remove {f.rule}", detail=f.detail, source="hack-check")
            for f in hacks.findings
        ],
    )


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
    items += knowledge_items("compile", result, ctx)
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
        if check.unjoined:
            problems.append("output still being written on another stream when forward returned")
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
