"""One problem's row: the baselines timed in a reference worker, and what the run or verdict found.

The baselines are timed in one reference worker per problem, before its run (that worker is then
the run's reference), with the Verifier's timing rules (CUDA events, warm-up, flushed L2, inputs
refilled in place, median of the runs): eager,
``torch.compile`` default and reduce-overhead in true FP32 (TF32 off, as the candidate is judged),
and eager again under PyTorch's default precision flags (cuDNN may use TF32), labelled apart,
because that is what users get when they set nothing. The candidate's own time comes from its
worker in the run. Without a GPU nothing is timed and the row says ``compiled_only``.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.artifacts import RoundRecord, RunReport, Task
from stitch_graph.bench.suite import BASELINES, group_of, speedup
from stitch_graph.execution.executor import Executor
from stitch_graph.execution.reference import ReferenceFailed, ensure_reference
from stitch_graph.execution.settings import RunSettings

__all__ = ["add_speedups", "row_from_report", "row_from_verdict", "time_baselines"]


def time_baselines(
    task: Task, settings: RunSettings, *, executor: Executor | None = None, timeline: int = 0
) -> dict[str, Any]:
    """Eager (FP32 and default flags), torch.compile and reduce-overhead times of ``task``.

    They are timed now, in the Verifier's reference worker, which then stands as the run's
    reference: the candidate or graph run that follows compares with its outputs instead of
    starting a second worker that would time eager and ``torch.compile`` again.

    Args:
        task: The problem.
        settings: Seed, trials, timing runs and limits (TF32 as the candidate is judged).
        executor: Where the reference worker runs; a private local one when None.
        timeline: Forward calls the same worker then profiles for the Planner (a graph run's),
            so that the Planner's timeline starts no second reference worker.

    Returns:
        ``<baseline>_ms`` for each baseline (None where it failed), errors, and
        ``baseline_seconds``; ``baseline_error`` when the worker itself failed.
    """
    try:
        meta = ensure_reference(
            task, settings, executor=executor, baselines=True, timeline=timeline
        ).meta
    except ReferenceFailed as exc:
        return {"baseline_error": exc.reason}
    out: dict[str, Any] = {"baseline_seconds": round(meta["seconds"], 2)}
    for baseline in BASELINES:
        out[f"{baseline}_ms"] = meta.get(f"{baseline}_ms")
        if meta.get(f"{baseline}_error"):
            out[f"{baseline}_error"] = meta[f"{baseline}_error"][:300]
    if meta.get("gpu") is not None:
        out["baseline_gpu"] = meta["gpu"]
    return out


def add_speedups(row: dict[str, Any]) -> dict[str, Any]:
    """``vs_<baseline>`` for every baseline timed in ``row`` (in place; returns the row)."""
    for baseline in BASELINES:
        row[f"vs_{baseline}"] = speedup(row, baseline)
    return row


def _time_spent(history: list[RoundRecord], report: RunReport) -> dict[str, float]:
    """The Verifier's seconds by step over the rounds, and the report's deferred baseline."""
    spent: dict[str, float] = {}
    for record in history:
        for step, seconds in record.steps.items():
            spent[step] = round(spent.get(step, 0.0) + seconds, 3)
    baseline = (report.details.get("seconds_by_step") or {}).get("compile_baseline")
    if baseline is not None:
        spent["compile_baseline"] = baseline
    return spent


def _best_per_round(history: list[RoundRecord]) -> list[float | None]:
    """Best speedup against eager reached by the end of each round (None until one is timed)."""
    best: float | None = None
    curve: list[float | None] = []
    for record in history:
        if record.test == "passed" and record.speedup_vs_eager:
            best = max(best or 0.0, record.speedup_vs_eager)
        curve.append(best)
    return curve


def row_from_report(
    problem: str,
    report: RunReport,
    history: list[RoundRecord],
    *,
    seconds: float,
    host: str,
) -> dict[str, Any]:
    """The row of one graph run (before its baselines are added).

    Args:
        problem: The problem's path relative to the suite.
        report: The run's report.
        history: The run's rounds (from its final state).
        seconds: Wall time of the run.
        host: Where it ran.

    Returns:
        The row.
    """
    row: dict[str, Any] = {
        "problem": problem,
        "group": group_of(problem),
        "mode": "graph",
        "outcome": report.outcome,
        "correct": None,
        "rounds": report.rounds,
        "seconds": round(seconds, 2),
        "host": host,
        "summary": report.summary[:500],
        "time_spent": _time_spent(history, report),
        "best_per_round": _best_per_round(history),
    }
    best = report.best
    if best is not None and best.test.status != "not_run":
        row["correct"] = best.test.status == "passed"
    if best is not None:
        row["declared_torch_ops"] = list(best.declared_torch_ops)
        timing = best.timing
        if timing is not None and timing.status == "passed":
            row.update(
                candidate_ms=timing.candidate_ms,
                verifier_eager_ms=timing.eager_ms,
                verifier_compile_ms=timing.compile_ms,
                device=timing.device,
            )
    return row


def row_from_verdict(
    problem: str, verdict: dict[str, Any], *, seconds: float, host: str
) -> dict[str, Any]:
    """The row of one candidate checked with the ``verify`` protocol (a ``Verdict`` dump)."""
    test, timing = verdict.get("test") or {}, verdict.get("timing") or {}
    if not verdict.get("gpu") and verdict.get("verdict") == "accepted":
        outcome = "compiled_only"  # static checks only: nothing ran
    else:
        outcome = verdict.get("verdict", "error")
    row: dict[str, Any] = {
        "problem": problem,
        "group": group_of(problem),
        "mode": "candidates",
        "outcome": outcome,
        "correct": (test.get("status") == "passed") if test else None,
        "rounds": 1,
        "seconds": round(seconds, 2),
        "host": host,
        "candidate": verdict.get("candidate", ""),
        "reasons": list(verdict.get("reasons", []))[:5],
        "declared_torch_ops": list((verdict.get("static") or {}).get("declared_uses", [])),
        "time_spent": {k: round(v, 3) for k, v in (verdict.get("seconds") or {}).items()},
    }
    if timing.get("status") == "passed":
        row.update(
            candidate_ms=timing.get("candidate_ms"),
            verifier_eager_ms=timing.get("eager_ms"),
            verifier_compile_ms=timing.get("compile_ms"),
            device=timing.get("device", ""),
        )
        row["best_per_round"] = [
            timing["eager_ms"] / timing["candidate_ms"]
            if timing.get("eager_ms") and timing.get("candidate_ms")
            else None
        ]
    return row
