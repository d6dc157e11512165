"""Finalize: turn the run's state into a ``RunReport`` and a closing message.

The outcome is named for what was shown, never more: ``verified`` needs a correct program that
covers every op; a program that leaves declared ops to PyTorch is ``partial``; a program that
only compiled (no GPU to run it) is ``compiled_only``; a plan with nothing the agents can
generate is ``unsupported``, naming the ops. A partial program says so in its summary whatever
its outcome, with each op left to PyTorch and how often the host code calls it.

The closing message is the sub-agent contract: its text is the summary for people and models,
and ``additional_kwargs["stitch_result"]`` (also the output state's ``result``) holds the same
facts as plain data, so a supervisor reads the outcome, the program's files, correctness,
speedups and the ops left to PyTorch without parsing prose.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime

from stitch_graph.agents.analysis import candidate_runner
from stitch_graph.agents.context import StitchContext, resolve_context
from stitch_graph.agents.progress import emit
from stitch_graph.agents.run_folder import program_of, write_run
from stitch_graph.agents.state import StitchState
from stitch_graph.artifacts import BestProgram, Candidate, RunReport, TuningReport

GRAPH_NAME = "stitch_graph"
"""The compiled graph's default name, which the closing message carries as its ``name``."""

RESULT_KEY = "stitch_result"
"""The key of the structured result in the closing message's ``additional_kwargs``."""


def _normal(name: str) -> str:
    """An op or call name without its module prefix, dots as underscores: ``linalg_inv``."""
    for prefix in ("torch.nn.functional.", "torch.", "F."):
        name = name.removeprefix(prefix)
    return name.replace(".", "_")


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts)) if parts else None


def torch_call_sites(host_source: str, declared: list[str]) -> dict[str, int]:
    """How often the host code calls each op it declares as left to PyTorch.

    One op may be called from several places (a generated program calls ``torch.linalg.inv``
    once per use in the reference), and may be declared under two names (``linalg_inv`` and
    ``inv``); a call counts once, for the first declared name it matches. The source is parsed,
    never run. A declared op whose call was not found counts 0.
    """
    counts = dict.fromkeys(declared, 0)
    wanted = {name: _normal(name) for name in declared}
    matched: set[str] = set()
    try:
        tree = ast.parse(host_source)
    except SyntaxError:
        return counts
    for node in ast.walk(tree):
        dotted = _dotted(node.func) if isinstance(node, ast.Call) else None
        if dotted is None:
            continue
        names = {_normal(dotted), dotted.rsplit(".", 1)[-1]}
        hits = [name for name, normal in wanted.items() if normal in names]
        if hits:
            counts[hits[0]] += 1
            matched.update(hits)
    return {name: n for name, n in counts.items() if n or name not in matched}


def _left_text(left: dict[str, int]) -> str:
    def sites(n: int) -> str:
        return f"{n} call site{'s' if n != 1 else ''}" if n else "call not found"

    return ", ".join(f"{op} ({sites(n)})" for op, n in left.items())


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
            left = torch_call_sites(best.candidate.host_source, best.declared_torch_ops)
            details["ops_left_to_pytorch"] = left
            summary += f"; left to PyTorch (declared): {_left_text(left)}"
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
    compiled: Candidate | None = state.get("last_compiled")
    if compiled is not None:
        test = state.get("test_result")
        reason = test.reason if test is not None and test.status == "not_run" else "not verified"
        what = "program"
        if compiled.declared_torch_ops:
            left = torch_call_sites(compiled.host_source, compiled.declared_torch_ops)
            details["ops_left_to_pytorch"] = left
            what = f"partial program (left to PyTorch, declared: {_left_text(left)})"
        summary = f"{name}: {what} compiled with nvcc; correctness and timing {reason}"
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


def build_result(
    state: StitchState, report: RunReport, files: dict[str, Path] | None = None
) -> dict[str, Any]:
    """The run's outcome as plain JSON data: what a supervisor reads instead of the summary.

    Args:
        state: The run's state (the program is taken from it when no correct one exists).
        report: The run's report.
        files: The run folder's files, when one was written.

    Returns:
        ``graph``, ``task``, ``outcome``, ``partial``, ``summary``, ``rounds``, ``correctness``
        (``correct`` is None when it could not be run), ``timing``, ``speedup_vs_eager``,
        ``speedup_vs_compile``, ``ops_left_to_pytorch`` (op to call sites), ``run_dir``,
        ``files`` (name to path) and ``program`` (its sources, or None).
    """
    values = {**state, "report": report}
    program = program_of(values)
    best = report.best
    test = best.test if best is not None else state.get("test_result")
    timing = best.timing if best is not None else None
    left = report.details.get("ops_left_to_pytorch") or {}
    correctness = None
    if test is not None:
        correct = None if test.status == "not_run" else test.status == "passed"
        correctness = {
            "status": test.status,
            "correct": correct,
            "trials": test.trials,
            "atol": test.atol,
            "rtol": test.rtol,
            "reason": test.reason,
        }
    timed = timing is not None and timing.status == "passed"
    files = files or {}
    return {
        "graph": GRAPH_NAME,
        "task": report.task,
        "outcome": report.outcome,
        "partial": bool(left),
        "summary": report.summary,
        "rounds": report.rounds,
        "correctness": correctness,
        "timing": timing.model_dump(mode="json") if timing is not None else None,
        "speedup_vs_eager": timing.speedup_vs_eager if timed else None,
        "speedup_vs_compile": timing.speedup_vs_compile if timed else None,
        "ops_left_to_pytorch": left,
        "run_dir": str(Path(next(iter(files.values()))).resolve().parent) if files else None,
        "files": {name: str(Path(path).resolve()) for name, path in files.items()},
        "program": program.model_dump(
            mode="json", include={"kernel_source", "host_source", "host_cpp", "form"}
        )
        if program is not None
        else None,
    }


def with_compile_baseline(best: BestProgram | None, task: Any, ctx: StitchContext) -> Any:
    """The best program with torch.compile's time, where the run deferred that baseline to
    its report (``StitchContext.defer_compile_baseline``); ``None`` when nothing changes."""
    timing = best.timing if best is not None else None
    if best is None or timing is None or timing.status != "passed" or timing.compile_ms:
        return None
    complete = getattr(candidate_runner(ctx), "compile_baseline", None)
    compile_ms = complete(task, ctx) if complete is not None and task is not None else None
    if not compile_ms:
        return None
    return best.model_copy(update={"timing": timing.model_copy(update={"compile_ms": compile_ms})})


def finalize_node(state: StitchState, runtime: Runtime[StitchContext]) -> dict[str, Any]:
    """Write the report, the structured result and the closing message a caller reads.

    With ``StitchContext.run_dir`` set, the run folder is written here too, so the result can
    name the program's files. A torch.compile time the run deferred is taken first, so the
    report compares the program with it.
    """
    ctx = resolve_context(runtime.context)
    started = time.monotonic()
    best = with_compile_baseline(state.get("best"), state.get("task"), ctx)
    if best is not None:
        state = {**state, "best": best}
    report = build_report(state)
    if best is not None:
        spent = report.details["seconds_by_step"]
        spent["compile_baseline"] = round(time.monotonic() - started, 3)
    report.details["round_budget"] = ctx.max_rounds
    files = write_run({**state, "report": report}, ctx.run_dir) if ctx.run_dir else None
    result = build_result(state, report, files)
    emit(get_stream_writer(), "finalize", report.outcome, summary=report.summary)
    message = AIMessage(
        content=report.summary, name=GRAPH_NAME, additional_kwargs={RESULT_KEY: result}
    )
    update: dict[str, Any] = {"report": report, "result": result, "messages": [message]}
    if best is not None:
        update["best"] = best
    return update
