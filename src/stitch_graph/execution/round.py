"""One verification round: build, check against the reference, and time one candidate.

``verify_candidate`` is the entry point that ties the pieces together: the program is built (or its
cubin reused), the reference runs once per task in a worker of its own (cached), the candidate runs
in a fresh worker, and the parent compares outputs and assembles ``TestResult`` and
``TimingResult``. Without a GPU (or without CuPy) nothing runs and both results say ``not_run`` --
never ``passed``. No module of the package imports this one back (only ``__init__`` re-exports it).
"""

from __future__ import annotations

import shutil
import time
import uuid
from typing import Any

from pydantic import BaseModel

from stitch_graph.artifacts import Candidate, CompileResult, Task, TestResult, TimingResult
from stitch_graph.execution.candidate import candidate_job, judge_candidate, prepare_for_run
from stitch_graph.execution.executor import Executor, default_executor, gpu_available
from stitch_graph.execution.settings import RunSettings

__all__ = ["VerificationOutcome", "default_executor", "verify_candidate"]


class VerificationOutcome(BaseModel):
    """Correctness and timing of one candidate, and how long verifying it took."""

    test: TestResult
    timing: TimingResult
    seconds: float = 0.0


def verify_candidate(
    task: Task,
    candidate: Candidate,
    ctx: Any = None,
    *,
    compile_result: CompileResult | None = None,
    executor: Executor | None = None,
    device: str = "cuda",
    keep_scratch: bool = False,
) -> VerificationOutcome:
    """Check and time one candidate in an isolated worker.

    Args:
        task: The problem.
        candidate: The program.
        ctx: ``StitchContext``, ``RunSettings`` or ``None`` (defaults).
        compile_result: The compile step's result; a failed one short-circuits to an error, a
            cubin or library in it is reused.
        executor: Where workers run; the process-wide ``LocalGPUExecutor`` when ``None``.
        device: ``"cuda"``; ``"cpu"`` runs host code on CPU tensors without kernels (for tests
            of the machinery; never a verdict about CUDA code).
        keep_scratch: Keep the candidate worker's scratch folder (logs, outputs).

    Returns:
        Test and timing results. Without a GPU: ``not_run`` for both.
    """
    start = time.monotonic()
    settings = RunSettings.from_context(ctx)

    def outcome(test: TestResult, timing: TimingResult) -> VerificationOutcome:
        return VerificationOutcome(test=test, timing=timing, seconds=time.monotonic() - start)

    if device != "cpu" and not gpu_available():
        return outcome(
            TestResult(status="not_run", reason="not run: no GPU"),
            TimingResult(status="not_run", reason="not run: no GPU"),
        )
    runner = executor or default_executor()
    prepared = prepare_for_run(
        task, candidate, settings, compile_result=compile_result, executor=runner, device=device
    )
    if isinstance(prepared, TestResult):
        return outcome(
            prepared, TimingResult(status="not_run", reason=f"not timed: {prepared.reason[:200]}")
        )
    built, reference = prepared
    scratch = settings.root() / "scratch" / f"{candidate.digest}-{uuid.uuid4().hex[:8]}"
    job = candidate_job(
        task.source, candidate, built, reference, settings, device=device, scratch_dir=str(scratch)
    )
    result = runner.submit(job).result()
    try:
        run = judge_candidate(result, reference, settings)
    finally:
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return outcome(run.test, run.timing)
