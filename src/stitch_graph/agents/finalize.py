"""Finalize: turn the run's state into a ``RunReport`` and a closing message.

The outcome is named for what was shown, never more: ``verified`` needs a correct program that
covers every op; a program that leaves declared ops to PyTorch is ``partial``; a program that
only compiled (no GPU to run it) is ``compiled_only``; a plan with nothing the agents can
generate is ``unsupported``, naming the ops.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime

from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.agents.progress import emit
from stitch_graph.agents.state import StitchState
from stitch_graph.artifacts import BestProgram, RunReport, TuningReport


def _speedups(best: BestProgram) -> str:
    timing = best.timing
    if timing is None or timing.status != "passed":
        return "timing not run"
    parts = [f"{timing.candidate_ms:.4f} ms"]
    if timing.speedup_vs_eager:
        parts.append(f"{timing.speedup_vs_eager:.2f}x vs eager ({timing.eager_ms:.4f} ms)")
    if timing.speedup_vs_compile:
        parts.append(
            f"{timing.speedup_vs_compile:.2f}x vs torch.compile ({timing.compile_ms:.4f} ms)"
        )
    return ", ".join(parts) + f" on {timing.device}"


def tuning_line(report: TuningReport) -> str:
    """One line on what autotuning did: its time and the settings it changed."""
    if report.note and not report.choices:
        return f"autotuning: {report.note}"
    changed = [f"{c.item} {c.setting}" for c in report.choices if c.tried and c.setting]
    return (
        f"autotuned in {report.seconds:.1f} s ({sum(c.tried for c in report.choices)} programs "
        f"timed, {sum(c.cached for c in report.choices)} choices from the cache)"
        + (f": {'; '.join(changed)}" if changed else "")
    )


def _seconds_by_step(state: StitchState) -> dict[str, float]:
    """Where the Verifier's time went over the whole run, summed over rounds."""
    total: dict[str, float] = {}
    for record in state.get("history", []):
        for step, seconds in record.steps.items():
            total[step] = round(total.get(step, 0.0) + seconds, 3)
    return total


def build_report(state: StitchState) -> RunReport:
    """The outcome of the run as recorded in ``state``."""
    task = state.get("task")
    name = task.name if task is not None else "unknown"
    rounds = state.get("rounds", 0)
    best: BestProgram | None = state.get("best")
    failures = state.get("failures", [])
    details: dict[str, Any] = {"failures": [f.model_dump() for f in failures]}
    plan = state.get("plan")
    if plan is not None:
        details["items"] = {i.id: i.status for i in plan.items}
        details["unsupported_ops"] = plan.unsupported_ops
    tuning = state.get("tuning")
    if tuning is not None:
        details["tuning"] = tuning.model_dump(mode="json")
    details["seconds_by_step"] = _seconds_by_step(state)
    if best is not None:
        partial = bool(best.declared_torch_ops)
        outcome = "partial" if partial else "verified"
        summary = (
            f"{name}: {'partial' if partial else 'verified'} program from round {best.round} "
            f"({_speedups(best)})"
        )
        if partial:
            summary += "; left to PyTorch (declared): " + ", ".join(best.declared_torch_ops)
        if tuning is not None:
            summary += f"; {tuning_line(tuning)}"
        return RunReport(
            task=name, outcome=outcome, rounds=rounds, best=best, summary=summary, details=details
        )
    verifier_failures = [f for f in failures if f.agent == "verifier"]
    if verifier_failures:
        summary = f"{name}: no program could be judged: {verifier_failures[-1].reason}"
        return RunReport(
            task=name, outcome="failed", rounds=rounds, summary=summary, details=details
        )
    if state.get("last_compiled") is not None:
        test = state.get("test_result")
        reason = test.reason if test is not None and test.status == "not_run" else "not verified"
        summary = f"{name}: program compiled with nvcc; correctness and timing {reason}"
        return RunReport(
            task=name, outcome="compiled_only", rounds=rounds, summary=summary, details=details
        )
    if failures:
        summary = f"{name}: no program; {failures[-1].agent} failed: {failures[-1].reason}"
        return RunReport(
            task=name, outcome="failed", rounds=rounds, summary=summary, details=details
        )
    if plan is not None and not plan.items and plan.unsupported_ops:
        summary = (
            f"{name}: unsupported: "
            f"{'; '.join(op.removeprefix('unsupported: ') for op in plan.unsupported_ops)} "
            "(nothing could be generated, so no program was submitted)"
        )
        return RunReport(
            task=name, outcome="unsupported", rounds=rounds, summary=summary, details=details
        )
    feedback = state.get("feedback")
    last = feedback.summary if feedback is not None else "no candidate was produced"
    return RunReport(
        task=name,
        outcome="no_program",
        rounds=rounds,
        summary=f"{name}: no correct program ({last})",
        details=details,
    )


def finalize_node(state: StitchState, runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Write the report and the final message a caller (or a parent graph) reads."""
    report = build_report(state)
    report.details["round_budget"] = resolve_context(runtime.context).max_rounds
    emit(get_stream_writer(), "finalize", report.outcome, summary=report.summary)
    return {"report": report, "messages": [AIMessage(content=report.summary, name="stitch_graph")]}
