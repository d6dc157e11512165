"""Candidate runs: load a candidate in a worker of its own, check it against the reference, time it.

The worker seeds exactly as the reference worker did, builds ``ModelNew(*init)``, copies in the
reference's parameters where names and shapes match, and runs every trial on the reference's saved
input draws. Inputs are refilled in place before each call (so a cache keyed by pointer misses).
Each trial runs twice: once after NaN-poisoning the allocator's free blocks and once after
zero-poisoning them; an element that is NaN only in the first run was never written. In the
first run the current stream is held busy while forward is called and the outputs are copied on
it as the call returns; an output whose copy differs from its value after a sync was still being
written on a stream forward did not join back. The RNG is seeded before each forward as the
reference worker seeded it. Outputs are checked for sharing memory with inputs, then saved; the
parent compares them with the reference outputs, which the candidate's process never loads. The
candidate is timed in the same worker.

On the parent side, ``prepare_for_run`` builds the program and makes sure the reference run exists,
``candidate_job`` describes the worker's job and ``judge_candidate`` turns its result into verdicts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import (
    Candidate,
    CompileResult,
    OutputCheck,
    Task,
    TestResult,
    TimingResult,
)
from stitch_graph.execution._common import (
    clone_to,
    describe_exception,
    device_name,
    init_inputs,
    load_module_state,
    load_problem,
    refill,
    save,
    seed_forward,
    set_tf32,
    timing_draws,
)
from stitch_graph.execution.compare import (
    aliases_any,
    compare_output,
    flatten_outputs,
    merge_checks,
    summarize_checks,
)
from stitch_graph.execution.executor import Executor, Job, JobResult
from stitch_graph.execution.forms import BuildError, BuiltProgram, load_model_class, prepare_program
from stitch_graph.execution.reference import ReferenceData, ReferenceFailed, ensure_reference
from stitch_graph.execution.settings import RunSettings
from stitch_graph.execution.timing import escaped, time_cuda

__all__ = [
    "CandidateRun",
    "candidate_job",
    "judge_candidate",
    "prepare_candidate",
    "prepare_for_run",
    "run_candidate_job",
]

CANDIDATE_OUTPUTS = "candidate_outputs.pt"


# ------------------------------------------------------------------------------------------
# Worker side


def _load_matching_state(model: Any, state_path: str) -> dict[str, Any]:
    """Copy the reference's parameters and buffers into ``model`` where names and shapes match."""
    import torch

    reference = torch.load(state_path, map_location="cpu", weights_only=True)
    loaded = load_module_state(model, reference)
    return {"loaded": len(loaded), "skipped": sorted(set(reference) - set(loaded))[:20]}


def _poison(specs: list[dict[str, Any]], byte: int) -> None:
    """Fill cached free blocks of the outputs' sizes with ``byte`` (0xFF is NaN in float types)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = []
    for spec in specs:
        dtype = getattr(torch, spec["dtype"].replace("torch.", ""))
        blocks.append(torch.empty(spec["shape"], dtype=dtype, device="cuda"))
    for b in blocks:
        if b.numel():
            b.view(torch.uint8).fill_(byte)
    del blocks  # back to the caching allocator, poisoned; the candidate's torch.empty gets them


_HOLD_CYCLES = 2_000_000  # about a millisecond of a spinning kernel at H100/H200 clocks


def _hold_current_stream() -> None:
    """Keep the current stream busy while forward is called, so that work it launches on other
    streams (after joining this one) is still running when the snapshot queued behind the hold
    copies the outputs: an output forward did not join back then differs from its final value."""
    import torch

    torch.cuda._sleep(_HOLD_CYCLES)


def _differs(snapshot: Any, value: Any) -> bool:
    """Whether the copy taken as forward returned differs from the value after a sync (NaN
    equal to NaN: poisoned memory that no one writes is the same in both)."""
    import torch

    if not isinstance(snapshot, torch.Tensor) or snapshot.shape != value.shape:
        return False
    differ = snapshot != value
    if snapshot.is_floating_point() or snapshot.is_complex():
        differ &= ~(torch.isnan(snapshot) & torch.isnan(value))
    return bool(differ.any().item())


def _call(model: Any, args: list[Any]) -> list[Any]:
    import torch

    with torch.no_grad():
        return flatten_outputs(model(*args))


def prepare_candidate(payload: dict[str, Any]) -> dict[str, Any]:
    """Load and construct the candidate as a worker does; returns its parts by name.

    Keys: ``model``, ``args`` (device inputs of the first draw), ``draws`` (CPU draws),
    ``state_info``, ``phases``, ``candidate``, ``built``, ``cuda``.
    """
    import torch

    device = payload.get("device", "cuda")
    seed = int(payload["seed"])
    candidate = Candidate.model_validate(payload["candidate"])
    built = BuiltProgram.model_validate(payload["built"])
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    problem = load_problem(payload["source"], "stitch_candidate_problem")
    if device != "cpu":
        set_tf32(bool(payload.get("allow_tf32", False)))
        torch.cuda.init()
    model_cls = load_model_class(
        candidate, built.build_dir, built.artifact, device=device, arch=built.arch or None
    )
    phases["load_s"] = time.perf_counter() - t0
    init = init_inputs(problem, seed)
    torch.manual_seed(seed)
    model = model_cls(*init)
    state_info: dict[str, Any] = {"loaded": 0, "skipped": []}
    if isinstance(model, torch.nn.Module):
        state_info = _load_matching_state(model, payload["state_path"])
        model = model.to(device)
    draws = torch.load(payload["inputs_path"], map_location="cpu", weights_only=True)
    return {
        "model": model,
        "args": clone_to(draws[0], device),
        "draws": draws,
        "state_info": state_info,
        "phases": phases,
        "candidate": candidate,
        "built": built,
        "cuda": device != "cpu",
        "device": device,
    }


def run_candidate_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``candidate`` jobs."""
    import torch

    prepared = prepare_candidate(payload)
    model, args, draws = prepared["model"], prepared["args"], prepared["draws"]
    candidate, built, cuda = prepared["candidate"], prepared["built"], prepared["cuda"]
    timings = prepared["phases"]
    specs: list[dict[str, Any]] = payload.get("output_specs", [])
    t1 = time.perf_counter()
    _call(model, args)  # first call: lazy set-up, kernel loading
    if cuda:
        torch.cuda.synchronize()
    trials: list[dict[str, Any]] = []
    saved: list[list[Any]] = []
    seed = int(payload["seed"])
    for trial, draw in enumerate(draws):
        refill(args, draw)
        snapshot: list[Any] = []
        if cuda:
            _poison(specs, 0xFF)
            _hold_current_stream()
        seed_forward(seed, trial)
        first = _call(model, args)
        if cuda:
            # copied on the current stream as the call returns: what a caller would read
            snapshot = [v.clone() if isinstance(v, torch.Tensor) else None for v in first]
            torch.cuda.synchronize()
        info = []
        for i, value in enumerate(first):
            is_tensor = isinstance(value, torch.Tensor)
            info.append(
                {
                    "is_tensor": is_tensor,
                    "shape": list(value.shape) if is_tensor else None,
                    "dtype": str(value.dtype) if is_tensor else type(value).__name__,
                    "aliases_input": aliases_any(value, args),
                    "unwritten": False,
                    "unjoined": _differs(snapshot[i], value) if snapshot else False,
                }
            )
        del snapshot
        kept = [v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v for v in first]
        if cuda:
            nan_first = [
                torch.isnan(v).cpu()
                if isinstance(v, torch.Tensor) and v.is_floating_point()
                else None
                for v in first
            ]
            del first
            refill(args, draw)
            _poison(specs, 0x00)
            seed_forward(seed, trial)
            second = _call(model, args)
            torch.cuda.synchronize()
            for i, (mask, value) in enumerate(zip(nan_first, second, strict=False)):
                if mask is None or not isinstance(value, torch.Tensor):
                    continue
                if value.shape == mask.shape:
                    only_poisoned = mask & ~torch.isnan(value).cpu()
                    info[i]["unwritten"] = bool(only_poisoned.any().item())
            del second
        trials.append({"outputs": info})
        saved.append(kept)
    save(saved, scratch / CANDIDATE_OUTPUTS)
    timings["trials_s"] = time.perf_counter() - t1
    result: dict[str, Any] = {
        "device": device_name(prepared["device"]),
        "trials": trials,
        "outputs_file": CANDIDATE_OUTPUTS,
        "state_dict": prepared["state_info"],
        "used_cubin": bool(built.cubin_path) and candidate.form == "nvrtc",
        "phases": timings,
    }
    if cuda and payload.get("time", True):
        t2 = time.perf_counter()
        try:
            sources = timing_draws(draws, "cuda")

            def rotate(i: int) -> None:
                refill(args, sources[i % len(sources)])

            with torch.no_grad():
                stats = time_cuda(
                    lambda: model(*args),
                    warmup=int(payload["warmup_runs"]),
                    runs=int(payload["timing_runs"]),
                    before_each=rotate,
                )
            result["timing"] = stats
        except Exception as exc:  # noqa: BLE001 - reported as a timing error
            result["timing_error"] = describe_exception(exc)
        timings["timing_s"] = time.perf_counter() - t2
    return result


# ------------------------------------------------------------------------------------------
# Parent side


class CandidateRun:
    """The judged outcome of one candidate job."""

    def __init__(self, test: TestResult, timing: TimingResult, job: JobResult) -> None:
        self.test = test
        self.timing = timing
        self.job = job


def prepare_for_run(
    task: Task,
    candidate: Candidate,
    settings: RunSettings,
    *,
    compile_result: CompileResult | None = None,
    executor: Executor | None = None,
    device: str = "cuda",
) -> tuple[BuiltProgram, ReferenceData] | TestResult:
    """Build the candidate and make sure the reference run exists.

    Returns:
        ``(built, reference)``, or the ``error`` test result of a candidate that cannot be run:
        its reason starts with ``"compile failed: "`` or ``"reference failed: "``, and
        ``failed_side`` is ``"reference"`` when the reference is what failed.
    """
    tolerances = {"atol": settings.atol, "rtol": settings.rtol}
    if compile_result is not None and not compile_result.ok:
        first = compile_result.errors[0].message if compile_result.errors else compile_result.log
        return TestResult(status="error", reason=f"compile failed: {first[:500]}", **tolerances)
    try:
        built = prepare_program(
            candidate,
            build_root=settings.root() / "builds",
            compile_result=compile_result,
            arch=settings.gpu_arch,
            timeout_s=settings.timeout_s,
        )
    except BuildError as exc:
        return TestResult(status="error", reason=f"compile failed: {exc}", **tolerances)
    try:
        reference = ensure_reference(task, settings, executor=executor, device=device)
    except ReferenceFailed as exc:
        return TestResult(status="error", reason=exc.reason, failed_side="reference", **tolerances)
    return built, reference


def candidate_job(
    task_source: str,
    candidate: Candidate,
    built: BuiltProgram,
    reference: ReferenceData,
    settings: RunSettings,
    *,
    device: str = "cuda",
    time_it: bool = True,
    scratch_dir: str | None = None,
) -> Job:
    """The ``candidate`` job for one candidate against one reference run."""
    return Job(
        kind="candidate",
        payload={
            "source": task_source,
            "candidate": candidate.model_dump(),
            "built": built.model_dump(),
            "inputs_path": str(reference.inputs_path),
            "state_path": str(reference.state_path),
            "output_specs": reference.meta.get("outputs", []),
            "seed": settings.seed,
            "allow_tf32": settings.allow_tf32,
            "timing_runs": settings.timing_runs,
            "warmup_runs": settings.warmup_runs,
            "device": device,
            "time": time_it,
        },
        timeout_s=settings.timeout_s,
        memory_limit_mb=settings.worker_memory_mb,
        scratch_dir=scratch_dir,
        env={"CUPY_CACHE_DIR": str(settings.root() / "cupy-cache")},
    )


def _error_reason(job: JobResult) -> str:
    if job.status == "error":
        return job.reason or "the candidate raised"
    return job.reason or job.status


def judge_candidate(
    job: JobResult, reference: ReferenceData, settings: RunSettings
) -> CandidateRun:
    """Turn a finished candidate job into ``TestResult`` and ``TimingResult``.

    Args:
        job: The candidate job's result.
        reference: The reference run it was checked against.
        settings: Tolerances.

    Returns:
        The judged run.
    """
    import torch

    atol, rtol = settings.atol, settings.rtol
    base = {"atol": atol, "rtol": rtol}
    device = job.result.get("device") or reference.meta.get("device", "")
    not_timed = TimingResult(
        status="not_run", reason="not timed: candidate is not correct", device=device
    )
    if job.status != "ok":
        test = TestResult(status="error", reason=_error_reason(job), **base)
        return CandidateRun(test, not_timed, job)
    outputs_path = Path(job.scratch_dir) / job.result.get("outputs_file", CANDIDATE_OUTPUTS)
    try:
        produced = torch.load(outputs_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a missing or forged file is an error result
        test = TestResult(status="error", reason=f"candidate outputs unreadable: {exc}", **base)
        return CandidateRun(test, not_timed, job)
    expected = reference.outputs()
    trial_info = job.result.get("trials", [])
    if len(produced) != len(expected) or len(trial_info) != len(expected):
        test = TestResult(
            status="error", reason="candidate ran a different number of trials", **base
        )
        return CandidateRun(test, not_timed, job)
    per_output: dict[int, list[OutputCheck]] = {}
    count_reason = ""
    for outs, refs, info in zip(produced, expected, trial_info, strict=True):
        if len(outs) != len(refs) and not count_reason:
            count_reason = f"candidate returned {len(outs)} outputs, the reference {len(refs)}"
        for i, ref in enumerate(refs):
            out = outs[i] if i < len(outs) else None
            check = compare_output(i, out, ref, atol=atol, rtol=rtol)
            meta = info["outputs"][i] if i < len(info["outputs"]) else {}
            check.aliases_input = bool(meta.get("aliases_input", False))
            check.unwritten = bool(meta.get("unwritten", False))
            check.unjoined = bool(meta.get("unjoined", False))
            per_output.setdefault(i, []).append(check)
    checks = [merge_checks(per_output[i]) for i in sorted(per_output)]
    reason = count_reason or summarize_checks(checks, atol=atol, rtol=rtol)
    trials = len(expected)
    if reason:
        test = TestResult(status="failed", reason=reason, trials=trials, outputs=checks, **base)
        return CandidateRun(test, not_timed, job)
    test = TestResult(
        status="passed",
        reason=f"all outputs match on {trials} trials",
        trials=trials,
        outputs=checks,
        **base,
    )
    stats = job.result.get("timing")
    if stats and escaped(stats):
        timing = TimingResult(
            status="failed",
            device=device,
            reason=f"{stats['escaped_ms']:.3f} ms of work ran outside the timed stream "
            f"(timed {stats['median_ms']:.3f} ms): join side streams to the current stream",
        )
    elif stats:
        timing = TimingResult(
            status="passed",
            device=device,
            runs=int(stats["runs"]),
            candidate_ms=float(stats["median_ms"]),
            eager_ms=reference.meta.get("eager_ms"),
            compile_ms=reference.meta.get("compile_ms"),
        )
    elif job.result.get("timing_error"):
        timing = TimingResult(
            status="error",
            device=device,
            reason=job.result["timing_error"].get("reason", "timing failed"),
        )
    else:
        timing = TimingResult(status="not_run", device=device, reason="timing not requested")
    return CandidateRun(test, timing, job)
