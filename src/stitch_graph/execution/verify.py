"""The Verifier's entry point: build, check against the reference, and time one candidate.

``verify_candidate`` ties the pieces together: the program is built (or its cubin reused), the
reference runs once per task in a worker of its own (cached), the candidate runs in a fresh worker,
and the parent compares outputs and assembles ``TestResult`` and ``TimingResult``. Without a GPU
(or without CuPy) nothing runs and both results say ``not_run`` -- never ``passed``.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel

from stitch_graph.artifacts import Candidate, CompileResult, Task, TestResult, TimingResult
from stitch_graph.execution.executor import Executor, LocalGPUExecutor
from stitch_graph.execution.forms import BuildError, BuiltProgram, prepare_program
from stitch_graph.execution.reference import ReferenceData, ReferenceFailed, ensure_reference
from stitch_graph.execution.settings import RunSettings

__all__ = [
    "VerificationOutcome",
    "default_executor",
    "gpu_available",
    "prepare_for_run",
    "verify_candidate",
]


class VerificationOutcome(BaseModel):
    """Correctness and timing of one candidate, and how long verifying it took."""

    test: TestResult
    timing: TimingResult
    seconds: float = 0.0


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """Whether candidates can run here: CUDA visible to torch and CuPy installed."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU
        return False


_default: LocalGPUExecutor | None = None
_default_lock = threading.Lock()


def default_executor() -> LocalGPUExecutor:
    """A process-wide ``LocalGPUExecutor``, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = LocalGPUExecutor()
        return _default


def prepare_for_run(
    task: Task,
    candidate: Candidate,
    settings: RunSettings,
    *,
    compile_result: CompileResult | None = None,
    executor: Executor | None = None,
    device: str = "cuda",
) -> tuple[BuiltProgram, ReferenceData] | str:
    """Build the candidate and make sure the reference run exists.

    Returns:
        ``(built, reference)``, or a reason string (``"compile failed: ..."`` or
        ``"reference failed: ..."``) when either cannot be had.
    """
    if compile_result is not None and not compile_result.ok:
        first = compile_result.errors[0].message if compile_result.errors else compile_result.log
        return f"compile failed: {first[:500]}"
    try:
        built = prepare_program(
            candidate,
            build_root=settings.root() / "builds",
            compile_result=compile_result,
            arch=settings.gpu_arch,
            timeout_s=settings.timeout_s,
        )
    except BuildError as exc:
        return f"compile failed: {exc}"
    try:
        reference = ensure_reference(task, settings, executor=executor, device=device)
    except ReferenceFailed as exc:
        return exc.reason
    return built, reference


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
    prepared = prepare_for_run(task, candidate, settings, compile_result=compile_result,
                               executor=runner, device=device)
    if isinstance(prepared, str):
        return outcome(
            TestResult(status="error", reason=prepared, atol=settings.atol, rtol=settings.rtol),
            TimingResult(status="not_run", reason=f"not timed: {prepared[:200]}"),
        )
    built, reference = prepared
    from stitch_graph.execution.candidate import candidate_job, judge_candidate

    scratch = settings.root() / "scratch" / f"{candidate.digest}-{uuid.uuid4().hex[:8]}"
    job = candidate_job(task.source, candidate, built, reference, settings, device=device,
                        scratch_dir=str(scratch))
    result = runner.submit(job).result()
    try:
        run = judge_candidate(result, reference, settings)
    finally:
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return outcome(run.test, run.timing)
