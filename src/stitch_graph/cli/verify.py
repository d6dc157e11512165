"""``stitch-graph verify PROBLEM.py CANDIDATE...``: the Verifier's protocol for any KernelBench
candidate.

The candidate is a ``ModelNew`` file written anywhere (CuPy raw kernels, ``load_inline``, a ctypes
library built with nvcc) or a candidate folder in the project's own layout. The static hack checks
run first; what they refuse never runs. On a GPU the candidate then runs in an isolated worker:
FP32 correctness on fresh draws, the dynamic checks (poisoned outputs, aliasing, work escaping the
timed stream) and timing against eager and ``torch.compile`` in the same run. Without a GPU the
verdict is the static one, and it says that the rest needs a GPU.

Exit status: 0 accepted, 1 rejected (a hack or a wrong result), 2 bad input; with several
candidates, the worst of theirs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitch_graph.artifacts import Candidate, HackReport, Task, TestResult, TimingResult

__all__ = ["Verdict", "add_parser", "cmd_verify", "verify_files"]

EXIT = {"accepted": 0, "rejected": 1, "bad_input": 2}


class Verdict(BaseModel):
    """What ``verify`` found, as printed with ``--json``."""

    verdict: Literal["accepted", "rejected", "bad_input"]
    exit_code: int
    problem: str = ""
    candidate: str = ""
    form: str = ""
    reasons: list[str] = Field(default_factory=list)
    static: dict[str, Any] = Field(default_factory=dict)
    gpu: bool = False
    test: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    rubric: dict[str, Any] | None = None
    seconds: dict[str, float] = Field(default_factory=dict)
    note: str = ""


def _bad_input(reason: str, problem: str, candidate: str) -> Verdict:
    return Verdict(
        verdict="bad_input",
        exit_code=EXIT["bad_input"],
        problem=problem,
        candidate=candidate,
        reasons=[reason],
    )


def _static(report: HackReport) -> dict[str, Any]:
    return {
        "rejected": report.rejected,
        "rules": report.rules,
        "findings": [f.model_dump() for f in report.findings],
        "declared_uses": report.declared_uses,
    }


def _rubric(task: Task, candidate: Candidate, report: HackReport, test: Any, timing: Any) -> dict:
    from stitch_graph.reward.judges import RubricSample, RuleBasedJudge

    sample = RubricSample(
        task_source=task.source, candidate=candidate, hack_report=report, test=test, timing=timing
    )
    judgement = RuleBasedJudge().judge(sample)
    return {"judge": judgement.judge, **judgement.scores(), "mean": judgement.mean}


def _dynamic_reasons(test: TestResult, timing: TimingResult) -> list[str]:
    """Why a run rejects the candidate (empty: it passed)."""
    reasons: list[str] = []
    if test.status != "passed":
        side = " (the reference failed)" if test.reference_failed else ""
        reasons.append(f"correctness {test.status}{side}: {test.reason}")
    elif timing.status == "failed":
        reasons.append(f"timing failed: {timing.reason}")
    elif timing.status == "error":
        reasons.append(f"timing error: {timing.reason}")
    return reasons


def verify_files(
    problem: str | Path,
    candidate_path: str | Path,
    *,
    settings: Any = None,
    executor: Any = None,
    gpu: bool | None = None,
) -> Verdict:
    """Apply the Verifier's protocol to a problem file and a candidate file or folder.

    Args:
        problem: A KernelBench problem file (``Model``, ``get_inputs``, ``get_init_inputs``).
        candidate_path: A ``ModelNew`` ``.py`` file, or a candidate folder (``host.py``,
            ``candidate.json``, ``kernel.cu``).
        settings: ``RunSettings`` (tolerances, timing runs, timeouts); defaults when None.
        executor: Where the candidate runs; the process-wide GPU executor when None.
        gpu: Whether to run on the GPU; found out when None.

    Returns:
        The :class:`Verdict`.
    """
    from stitch_graph.checks import check_candidate
    from stitch_graph.execution import gpu_available
    from stitch_graph.execution.external import CandidateInputError, read_candidate
    from stitch_graph.task import TaskLoadError, load_task

    shown_problem, shown_candidate = str(problem), str(candidate_path)
    if not Path(problem).is_file():
        reason = f"no problem file at {problem}: pass a KernelBench problem .py file"
        return _bad_input(reason, shown_problem, shown_candidate)
    try:
        task = load_task(str(problem))
    except TaskLoadError as exc:
        return _bad_input(f"the problem does not load: {exc}", shown_problem, shown_candidate)
    try:
        candidate = read_candidate(candidate_path, task)
    except CandidateInputError as exc:
        return _bad_input(str(exc), shown_problem, shown_candidate)

    start = time.monotonic()
    report = check_candidate(candidate, reference_source=task.source)
    seconds = {"static": time.monotonic() - start}
    base = {
        "problem": shown_problem,
        "candidate": shown_candidate,
        "form": candidate.form,
        "static": _static(report),
    }
    if report.rejected:
        reasons = [
            f"{f.rule}: {f.detail}" + (f" (line {f.line})" if f.line else "")
            for f in report.findings
        ]
        return Verdict(
            verdict="rejected",
            exit_code=EXIT["rejected"],
            reasons=reasons,
            rubric=_rubric(task, candidate, report, None, None),
            seconds=seconds,
            note="refused by the static checks; nothing ran",
            **base,
        )
    on_gpu = gpu_available() if gpu is None else gpu
    if not on_gpu:
        return Verdict(
            verdict="accepted",
            exit_code=EXIT["accepted"],
            rubric=_rubric(task, candidate, report, None, None),
            seconds=seconds,
            note="static checks clean; correctness, the dynamic checks and timing need a GPU "
            "and did not run here",
            **base,
        )
    from stitch_graph.execution import verify_candidate
    from stitch_graph.execution.settings import RunSettings

    outcome = verify_candidate(
        task, candidate, RunSettings.from_context(settings), executor=executor
    )
    seconds["verify"] = outcome.seconds
    reasons = _dynamic_reasons(outcome.test, outcome.timing)
    verdict = "rejected" if reasons else "accepted"
    if outcome.test.reference_failed:
        verdict = "bad_input"
    return Verdict(
        verdict=verdict,
        exit_code=EXIT[verdict],
        reasons=reasons,
        gpu=True,
        test=outcome.test.model_dump(),
        timing=outcome.timing.model_dump(),
        rubric=_rubric(task, candidate, report, outcome.test, outcome.timing),
        seconds=seconds,
        **base,
    )


def _speedup(timing: dict[str, Any]) -> str:
    parts = []
    candidate_ms = timing.get("candidate_ms")
    if candidate_ms:
        parts.append(f"{candidate_ms:.4f} ms")
        for key, label in (("eager_ms", "eager"), ("compile_ms", "torch.compile")):
            if timing.get(key):
                parts.append(f"{timing[key] / candidate_ms:.2f}x {label}")
    return ", ".join(parts) or timing.get("reason", "")


def render(verdict: Verdict) -> str:
    """The verdict as text for a person."""
    head = verdict.verdict.upper().replace("_", " ")
    if verdict.verdict == "accepted" and not verdict.gpu:
        head += " (static checks only)"
    lines = [f"{head}: {verdict.candidate} against {verdict.problem}"]
    if verdict.form:
        lines.append(f"  form: {verdict.form}")
    static = verdict.static
    if static:
        found = len(static.get("findings", []))
        lines.append(f"  static checks: {'clean' if not found else f'{found} finding(s)'}")
        if static.get("declared_uses"):
            lines.append(f"  left to PyTorch (declared): {', '.join(static['declared_uses'])}")
    if verdict.test is not None:
        test = verdict.test
        lines.append(f"  correctness: {test['status']}: {test['reason']}")
    if verdict.timing is not None and verdict.timing.get("status") == "passed":
        lines.append(f"  timing: {_speedup(verdict.timing)}")
    elif verdict.timing is not None:
        lines.append(f"  timing: {verdict.timing['status']}: {verdict.timing.get('reason', '')}")
    for reason in verdict.reasons:
        lines.append(f"  - {reason}")
    if verdict.rubric:
        grades = ", ".join(
            f"{k} {v}" for k, v in verdict.rubric.items() if k not in {"judge", "mean"}
        )
        lines.append(f"  rubric ({verdict.rubric['judge']}, 1-5): {grades}")
    if verdict.note:
        lines.append(f"  {verdict.note}")
    return "\n".join(lines)


def prebuild_files(pairs: list[tuple[Path, Path]], settings: Any, *, jobs: int) -> int:
    """Build, side by side, the ``load_inline`` extensions of the (problem, candidate) files
    that the static checks accept, before they are verified one at a time; a refused or
    unreadable file is left to its verdict and nothing of it runs here. Returns how many were
    built."""
    from stitch_graph.checks import check_candidate
    from stitch_graph.execution.external import CandidateInputError, read_candidate
    from stitch_graph.execution.prebuild import builds_extensions, prebuild_external

    sources: dict[Path, str] = {}
    accepted = []
    for problem, path in pairs:
        try:
            candidate = read_candidate(path)
            if problem not in sources:
                sources[problem] = problem.read_text()
        except (CandidateInputError, OSError, UnicodeDecodeError):
            continue
        if builds_extensions(candidate):
            if not check_candidate(candidate, reference_source=sources[problem]).rejected:
                accepted.append(candidate)
    return len(prebuild_external(accepted, settings, jobs=jobs)) if accepted else 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check a KernelBench candidate: static hack checks, then on a GPU correctness, dynamic
    checks and timing against eager and torch.compile. Exit 0 accepted, 1 rejected, 2 bad
    input."""
    from stitch_graph.execution.settings import RunSettings

    settings = RunSettings(
        atol=args.atol,
        rtol=args.rtol,
        timeout_s=args.timeout,
        gpu_arch=args.arch,
        work_dir=args.work_dir,
    )
    gpu = False if args.static_only else None
    if len(args.candidates) > 1 and not args.static_only:
        from stitch_graph.execution import gpu_available

        if gpu_available():  # load_inline builds side by side, then each run only loads
            pairs = [(Path(args.problem), Path(c)) for c in args.candidates]
            prebuild_files(pairs, settings, jobs=len(pairs))
    verdicts = []
    for candidate in args.candidates:
        # one process-wide executor serves them all: the reference runs once (and is cached
        # on disk), and each next worker is started while the current one runs
        verdict = verify_files(args.problem, candidate, settings=settings, gpu=gpu)
        verdicts.append(verdict)
        if not args.json:
            stream = sys.stderr if verdict.verdict == "bad_input" else sys.stdout
            print(render(verdict), file=stream)
    if args.json:
        dumped = [v.model_dump() for v in verdicts]
        print(json.dumps(dumped[0] if len(dumped) == 1 else dumped, indent=2, default=str))
    return max(v.exit_code for v in verdicts)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``verify`` on the ``stitch-graph`` sub-command parsers."""
    parser = sub.add_parser(
        "verify",
        help="check any KernelBench ModelNew (CuPy, load_inline, ctypes, project forms)",
        description=cmd_verify.__doc__,
    )
    parser.add_argument("problem", help="KernelBench problem file (Model, get_inputs, ...)")
    parser.add_argument(
        "candidates",
        nargs="+",
        metavar="CANDIDATE",
        help="ModelNew .py file, candidate folder or run folder; several share one reference "
        "run and warm workers",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--static-only", action="store_true", help="skip the GPU even if present")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per worker (load_inline builds)"
    )
    parser.add_argument("--arch", default="sm_90a", help="nvcc architecture of project forms")
    parser.add_argument(
        "--work-dir", help="builds, caches and the reference run (default: a temp folder)"
    )
    parser.set_defaults(func=cmd_verify)
    return parser
