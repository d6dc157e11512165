"""Profiles: Nsight Compute over a candidate, and the reference's timeline from torch.profiler.

The Verifier needs two views. For a candidate, per-kernel hardware counters: ncu runs over a small
runner job that builds the candidate exactly as the candidate worker does, calls forward a few times
to warm up, and brackets the profiled calls with ``cudaProfilerStart/Stop`` (ncu runs with
``--profile-from-start off``), so set-up copies and warm-up launches are not what gets measured.
For the reference, a timeline: per-op CUDA time, launch count and share, and the host gaps between
kernels, from ``torch.profiler`` in the reference worker, after its timings (so nsys, which the
GPU machine lacks, is not needed). Both run through the executor, isolated like any candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import (
    Candidate,
    CompileResult,
    Hotspot,
    ProfileReport,
    Task,
    TestResult,
)
from stitch_graph.execution.candidate import candidate_job, prepare_candidate, prepare_for_run
from stitch_graph.execution.executor import Executor, default_executor, gpu_available, run_on
from stitch_graph.execution.reference import ReferenceFailed, ensure_reference
from stitch_graph.execution.settings import RunSettings

__all__ = [
    "DEFAULT_NCU_SECTIONS",
    "profile_candidate",
    "reference_timeline",
    "run_runner_job",
]

DEFAULT_NCU_SECTIONS: tuple[str, ...] = ("SpeedOfLight", "Occupancy", "LaunchStats")
_PROGRAM_MARK = "__stitch_program__"


# ------------------------------------------------------------------------------------------
# Worker side


def run_runner_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``runner`` jobs: warm up, then profiled forward calls."""
    import torch

    prepared = prepare_candidate(payload)
    model, args = prepared["model"], prepared["args"]
    with torch.no_grad():
        for _ in range(int(payload.get("warmup_calls", 2))):
            model(*args)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(int(payload.get("profiled_calls", 1))):
            model(*args)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return {"calls": int(payload.get("profiled_calls", 1))}


# ------------------------------------------------------------------------------------------
# Parent side


def reference_timeline(
    task: Task, ctx: Any = None, *, executor: Executor | None = None, iterations: int = 5
) -> ProfileReport:
    """Where the reference spends GPU time, per op, from torch.profiler in the reference worker.

    The timeline is taken by the run's reference worker after its outputs and timings
    (``ensure_reference(timeline=...)``), and cached with them: asking for it costs the
    Verifier's first reference run nothing extra, and a second ask costs nothing at all. Under a
    context with ``defer_compile_baseline`` (and no ``target_speedup``, which needs the figure
    every round), that worker leaves torch.compile for the run's report (``compile_baseline``).

    Args:
        task: The problem.
        ctx: ``StitchContext`` or ``RunSettings`` (seed, TF32, limits); defaults when ``None``.
        executor: Where the worker runs; the process-wide ``LocalGPUExecutor`` when ``None``.
        iterations: Profiled forward calls (after three warm-up calls).

    Returns:
        ``ProfileReport`` with ``hotspots`` sorted by CUDA time (per forward call);
        ``bottleneck`` is ``launch`` when host gaps exceed kernel time. ``not_run`` without a GPU.
    """
    if not gpu_available():
        return ProfileReport(status="not_run", source="torch.profiler", reason="not run: no GPU")
    settings = RunSettings.from_context(ctx)
    # the loop's first reference run: torch.compile's time can wait for the run's report
    defer = bool(getattr(ctx, "defer_compile_baseline", False))
    defer = defer and not getattr(ctx, "target_speedup", None)
    try:
        reference = ensure_reference(
            task,
            settings,
            executor=executor or default_executor(),
            timeline=iterations,
            defer_compile=defer,
        )
    except ReferenceFailed as exc:
        return ProfileReport(status="error", source="torch.profiler", reason=str(exc))
    data = reference.meta.get("timeline")
    if not data:
        reason = reference.meta.get("timeline_error", "the reference worker took no timeline")
        return ProfileReport(status="error", source="torch.profiler", reason=reason)
    hotspots = [Hotspot(**h) for h in data["hotspots"]]
    busy, gap = float(data["busy_us"]), float(data["gap_us"])
    bottleneck = "launch" if gap > busy else "unknown"
    reason = (
        f"per forward: {data['kernels_per_forward']:.1f} kernels, {busy:.1f} us busy, "
        f"{gap:.1f} us host gaps between kernels, {data['span_us']:.1f} us first-to-last"
    )
    headroom = gap / (busy + gap) if busy + gap > 0 else 0.0
    return ProfileReport(
        status="passed",
        source="torch.profiler",
        reason=reason,
        hotspots=hotspots,
        bottleneck=bottleneck,
        headroom=headroom,
    )


def profile_candidate(
    task: Task,
    candidate: Candidate,
    ctx: Any = None,
    *,
    compile_result: CompileResult | None = None,
    sections: Sequence[str] = DEFAULT_NCU_SECTIONS,
    kernel_filter: str | None = None,
    launch_count: int | None = 8,
    launch_skip: int = 0,
    executor: Executor | None = None,
) -> ProfileReport:
    """Profile the candidate's kernels with Nsight Compute.

    Args:
        task: The problem (its inputs are the reference's first draw).
        candidate: The program.
        ctx: ``StitchContext`` or ``RunSettings``.
        compile_result: The compile step's result (its cubin or library is reused).
        sections: ncu sections to collect.
        kernel_filter: ncu kernel filter (regex); ``None``: every kernel of the profiled calls.
        launch_count: Launches to profile at most (``None``: all in the profiled calls).
        launch_skip: Launches inside the profiled range to skip first.
        executor: Where the runner job runs.

    Returns:
        ncu's report (``not_run`` without a GPU or without ncu).
    """
    if not gpu_available():
        return ProfileReport(status="not_run", source="ncu", reason="not run: no GPU")
    from stitch_graph.toolchain.ncu import (
        find_ncu,
        ncu_command,
        parse_ncu_csv,
        parse_ncu_rules,
        summarize_profile,
    )

    ncu = find_ncu()
    if ncu is None:
        return ProfileReport(status="not_run", source="ncu", reason="not run: ncu not found")
    settings = RunSettings.from_context(ctx)
    prepared = prepare_for_run(
        task, candidate, settings, compile_result=compile_result, executor=executor
    )
    if isinstance(prepared, TestResult):
        return ProfileReport(status="error", source="ncu", reason=prepared.reason)
    built, reference = prepared
    job = candidate_job(task.source, candidate, built, reference, settings, time_it=False)
    job.kind = "runner"
    job.payload.update({"warmup_calls": 2, "profiled_calls": 1})
    argv = ncu_command(
        [_PROGRAM_MARK],
        sections=sections,
        kernel_filter=kernel_filter,
        launch_skip=launch_skip,
        launch_count=launch_count,
        extra=["--profile-from-start", "off"],
        ncu=ncu,
    )
    job.command_prefix = argv[: argv.index(_PROGRAM_MARK)]
    job.timeout_s = max(settings.timeout_s, 300.0)
    result = run_on(executor, job)
    stdout = Path(result.stdout_path).read_text(errors="replace") if result.stdout_path else ""
    text = stdout + "\n" + result.stderr_tail
    if "ERR_NVGPUCTRPERM" in text:
        return ProfileReport(
            status="not_run",
            source="ncu",
            reason="ncu may not read GPU counters here (ERR_NVGPUCTRPERM)",
        )
    kernels = parse_ncu_csv(stdout)
    if result.status != "ok" or not kernels:
        why = result.reason or "no kernels were profiled"
        return ProfileReport(
            status="error", source="ncu", reason=f"ncu run failed: {why}", kernels=kernels
        )
    return summarize_profile(kernels, rules=parse_ncu_rules(stdout))
