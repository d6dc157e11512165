"""Reference runs: outputs and eager/compile timings of the problem, in a process of its own.

Reference outputs and timings never share a process with candidate code: a candidate that patches
torch at import, or reads the reference's memory, must not be able to change what it is judged
against. A reference worker seeds before building ``Model`` and before each input draw, draws
``correctness_trials`` fresh inputs from the problem's own ``get_inputs()`` (refusing constant
draws), runs the model with TF32 off unless allowed, saves inputs, outputs and the ``state_dict``,
and times eager and ``torch.compile`` (default mode) on the same inputs; ``reduce_overhead`` and
``default_flags_eager`` in the payload (off unless asked, as for the benchmark's baselines) add
``torch.compile(mode="reduce-overhead")`` and eager under PyTorch's default precision flags, and
``timeline_iterations`` the Planner's torch.profiler timeline, taken last. The result is cached on
disk per (task digest, device, settings) so every candidate of a run is compared with the same one;
a benchmark's baseline run replaces the cached one, so its worker is the candidates' reference too.

A graph run defers the ``torch.compile`` baseline (``defer_compile``): a whole model's cold
compile takes 30-45 s, and nothing in the loop needs its time before the end. The reference
worker then times eager only, a ``warmup`` job compiles the model once beside the loop's jobs
(niced, half the CPUs, timing nothing) so Inductor's and Triton's caches are warm, and
``complete_compile_baseline`` times the compiled model from those caches when the run asks for
the figure, in a worker of its own on the GPU's slot like any timing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Task
from stitch_graph.execution._common import (
    clone_to,
    device_name,
    draw_inputs,
    init_inputs,
    load_problem,
    module_state,
    refill,
    save,
    seed_forward,
    set_tf32,
    timing_draws,
)
from stitch_graph.execution.executor import (
    Executor,
    Job,
    JobResult,
    default_executor,
    gpu_available,
    run_on,
)
from stitch_graph.execution.settings import RunSettings

__all__ = [
    "ReferenceData",
    "ReferenceFailed",
    "compile_baseline",
    "complete_compile_baseline",
    "device_label",
    "ensure_reference",
    "reference_payload",
    "run_reference_job",
    "run_warmup_job",
]

INPUTS_FILE = "inputs.pt"
OUTPUTS_FILE = "outputs.pt"
STATE_FILE = "state_dict.pt"
META_FILE = "meta.json"


class ReferenceFailed(RuntimeError):
    """The reference itself could not run; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ReferenceData:
    """A cached reference run: its folder and what the worker reported."""

    folder: Path
    meta: dict[str, Any]

    @property
    def inputs_path(self) -> Path:
        """Saved input draws (one list of forward arguments per trial)."""
        return self.folder / INPUTS_FILE

    @property
    def outputs_path(self) -> Path:
        """Saved outputs (one flat list of tensors per trial)."""
        return self.folder / OUTPUTS_FILE

    @property
    def state_path(self) -> Path:
        """Saved ``state_dict`` of the seeded ``Model``."""
        return self.folder / STATE_FILE

    def outputs(self) -> list[list[Any]]:
        """Load the reference outputs (CPU tensors)."""
        import torch

        return torch.load(self.outputs_path, map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------------
# Worker side


def run_reference_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``reference`` jobs: outputs, state, timings into ``scratch``."""
    import torch

    device = payload.get("device", "cuda")
    seed = int(payload["seed"])
    trials = int(payload["trials"])
    problem = load_problem(payload["source"], "stitch_reference_problem")
    if device != "cpu":
        set_tf32(bool(payload.get("allow_tf32", False)))
    init = init_inputs(problem, seed)
    torch.manual_seed(seed)
    model = problem["Model"](*init)
    if payload.get("compile_only"):  # a deferred torch.compile baseline: nothing to save
        draws = [draw_inputs(problem, seed + 1 + t) for t in range(trials)]
        return {"device": device_name(device), **_time_reference(model.to(device), draws, payload)}
    state = {k: v.detach().cpu().clone() for k, v in module_state(model).items()}
    model = model.to(device)
    draws = [draw_inputs(problem, seed + 1 + t) for t in range(trials)]
    from stitch_graph.execution.compare import flatten_outputs

    outputs: list[list[Any]] = []
    out_specs: list[dict[str, Any]] = []
    with torch.no_grad():
        for trial, draw in enumerate(draws):
            args = clone_to(draw, device)
            seed_forward(seed, trial)
            flat = flatten_outputs(model(*args))
            for i, value in enumerate(flat):
                if not isinstance(value, torch.Tensor):
                    msg = f"the reference's output {i} is a {type(value).__name__}, not a tensor"
                    raise TypeError(msg)
            outputs.append([v.detach().cpu().clone() for v in flat])
            if not out_specs:
                out_specs = [{"shape": list(v.shape), "dtype": str(v.dtype)} for v in flat]
    save(
        [[v.cpu() if isinstance(v, torch.Tensor) else v for v in d] for d in draws],
        scratch / INPUTS_FILE,
    )
    save(outputs, scratch / OUTPUTS_FILE)
    save(state, scratch / STATE_FILE)
    result: dict[str, Any] = {
        "device": device_name(device),
        "outputs": out_specs,
        "trials": trials,
        "init_args": [repr(a) for a in init],
    }
    if device != "cpu" and payload.get("time", True):
        result.update(_time_reference(model, draws, payload))
    iterations = int(payload.get("timeline_iterations", 0))
    if iterations > 0:
        if device == "cpu":
            result["timeline_error"] = "no timeline on the CPU"
        else:
            result.update(_timeline(model, draws[0], iterations))
    return result


def _timeline(model: Any, draw: list[Any], iterations: int) -> dict[str, Any]:
    """The Planner's per-op timeline, taken after the timings; a profiler failure is noted,
    never the end of the reference."""
    from stitch_graph.execution.timeline import forward_timeline

    try:
        return {"timeline": forward_timeline(model, clone_to(draw, "cuda"), iterations)}
    except Exception as exc:  # noqa: BLE001 - the outputs and timings stand without it
        return {"timeline_error": f"torch.profiler failed: {type(exc).__name__}: {exc}"[:300]}


def _time_reference(model: Any, draws: list[list[Any]], payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    from stitch_graph.execution.timing import make_flush_buffer, time_cuda

    runs = int(payload.get("timing_runs", 20))
    warmup = int(payload.get("warmup_runs", 5))
    args = clone_to(draws[0], "cuda")

    sources = timing_draws(draws, "cuda")

    def rotate(i: int) -> None:
        refill(args, sources[i % len(sources)])

    flush = make_flush_buffer()
    out: dict[str, Any] = {}
    with torch.no_grad():
        if not payload.get("compile_only", False):
            eager = time_cuda(
                lambda: model(*args),
                warmup=warmup,
                runs=runs,
                before_each=rotate,
                flush_buffer=flush,
            )
            out["eager_ms"] = eager["median_ms"]
            out["eager"] = eager
        if payload.get("compile", True):
            out.update(_time_compiled(model, args, rotate, flush, warmup, runs, "default"))
        if payload.get("reduce_overhead", False):
            out.update(_time_compiled(model, args, rotate, flush, warmup, runs, "reduce-overhead"))
        if payload.get("default_flags_eager", False):
            out.update(_time_default_flags(model, args, rotate, flush, warmup, runs, payload))
    return out


def run_warmup_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``warmup`` jobs: compile the reference once as its timing will, and time
    nothing, so the deferred baseline finds Inductor's and Triton's caches warm.

    It runs beside the GPU's timed job, so it yields the CPU (nice 10) and makes one forward call;
    a failure is reported, and the baseline's own compile meets it again."""
    import torch

    del scratch
    os.nice(10)
    device = payload.get("device", "cuda")
    seed = int(payload["seed"])
    problem = load_problem(payload["source"], "stitch_warmup_problem")
    set_tf32(bool(payload.get("allow_tf32", False)))
    init = init_inputs(problem, seed)
    torch.manual_seed(seed)
    model = problem["Model"](*init).to(device)
    args = clone_to(draw_inputs(problem, seed + 1), device)
    start = time.perf_counter()
    try:
        with torch.no_grad():
            torch.compile(model, mode="default")(*args)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the baseline's worker says what failed
        return {"compile_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"compile_s": round(time.perf_counter() - start, 2)}


def _time_compiled(
    model: Any, args: list[Any], rotate: Any, flush: Any, warmup: int, runs: int, mode: str
) -> dict[str, Any]:
    """``torch.compile`` in ``mode`` (``default``: ``compile_*`` keys; ``reduce-overhead``, CUDA
    graphs: ``reduce_overhead_*``), timed like the other sides; a failure is a finding, not
    fatal."""
    import torch

    from stitch_graph.execution.timing import time_cuda

    key = "compile" if mode == "default" else mode.replace("-", "_")
    try:
        compiled = torch.compile(model, mode=mode)
        stats = time_cuda(
            lambda: compiled(*args),
            warmup=max(warmup, 3),
            runs=runs,
            before_each=rotate,
            flush_buffer=flush,
        )
    except Exception as exc:  # noqa: BLE001 - a baseline that fails is a blank cell
        return {f"{key}_ms": None, f"{key}_error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    return {f"{key}_ms": stats["median_ms"], key: stats}


def _time_default_flags(
    model: Any,
    args: list[Any],
    rotate: Any,
    flush: Any,
    warmup: int,
    runs: int,
    payload: dict[str, Any],
) -> dict[str, Any]:
    """Eager under PyTorch's default precision flags (cuDNN may use TF32, matmul may not):
    what users run when they set nothing, labelled apart from the true-FP32 sides."""
    import torch

    from stitch_graph.execution.timing import time_cuda

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    try:
        stats = time_cuda(
            lambda: model(*args), warmup=warmup, runs=runs, before_each=rotate, flush_buffer=flush
        )
    finally:
        set_tf32(bool(payload.get("allow_tf32", False)))
    return {"eager_default_flags_ms": stats["median_ms"], "eager_default_flags": stats}


# ------------------------------------------------------------------------------------------
# Parent side


@functools.lru_cache(maxsize=8)
def device_label(device: str = "cuda") -> str:
    """A short name of the GPU jobs will run on (from ``nvidia-smi``; ``cpu`` for CPU)."""
    if device == "cpu":
        return "cpu"
    smi = shutil.which("nvidia-smi")
    name = "cuda"
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            name = next((ln.strip() for ln in out.splitlines() if ln.strip()), name)
        except (OSError, subprocess.SubprocessError):
            pass
    return name


def _inductor_cache_dir() -> str:
    """torch.compile's cache, shared by every run of this user (workers get a scratch TMPDIR)."""
    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit:
        return explicit
    return os.path.join(tempfile.gettempdir(), f"stitch-inductor-{os.getuid()}")


def reference_payload(task: Task, settings: RunSettings, device: str = "cuda") -> dict[str, Any]:
    """The ``reference`` job's payload for ``task`` under ``settings``."""
    return {
        "source": task.source,
        "seed": settings.seed,
        "trials": settings.trials,
        "allow_tf32": settings.allow_tf32,
        "timing_runs": settings.timing_runs,
        "warmup_runs": settings.warmup_runs,
        "device": device,
    }


def _where(task: Task, settings: RunSettings, device: str) -> tuple[Path, str]:
    """The folder that holds references and the key of ``task``'s under ``settings``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_label(device)).strip("-").lower()
    root = settings.root() / "reference"
    root.mkdir(parents=True, exist_ok=True)
    return root, f"{task.digest}-{settings.reference_digest()}-{slug}"


@contextlib.contextmanager
def _locked(root: Path, key: str) -> Iterator[None]:
    """One process at a time on one reference (runs of one user share the cache)."""
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _reference_job(payload: dict[str, Any], settings: RunSettings, scratch: Path) -> Job:
    return Job(
        kind="reference",
        payload=payload,
        # torch.compile takes a while when cold, and twice as long in two modes
        timeout_s=max(settings.timeout_s, 600.0 if payload.get("reduce_overhead") else 300.0),
        memory_limit_mb=settings.worker_memory_mb,
        scratch_dir=str(scratch),
        env={"TORCHINDUCTOR_CACHE_DIR": _inductor_cache_dir()},
    )


def ensure_reference(
    task: Task,
    settings: RunSettings,
    *,
    executor: Executor | None = None,
    device: str = "cuda",
    baselines: bool = False,
    timeline: int = 0,
    defer_compile: bool = False,
) -> ReferenceData:
    """The cached reference run of ``task``, running it in a worker first if needed.

    Args:
        task: The problem.
        settings: Trials, seed, TF32, timing runs, work folder, limits.
        executor: Where the worker runs; a one-off ``LocalGPUExecutor`` when ``None``.
        device: ``"cuda"``, or ``"cpu"`` for GPU-less tests (no timings).
        baselines: Run it now whatever is cached, also timing reduce-overhead and eager under
            PyTorch's default flags: a benchmark's baselines, timed in this run, whose worker's
            outputs then serve the candidates too (one reference worker a problem, not two).
        timeline: Forward calls to profile with torch.profiler after the timings (the
            Planner's timeline); a cached run without a timeline is then run again.
        defer_compile: Time eager only and warm torch.compile's caches beside the jobs that
            follow; ``complete_compile_baseline`` times it later (ignored without an executor,
            which would be gone by then, and with ``baselines``).

    Returns:
        The reference data.

    Raises:
        ReferenceFailed: The reference crashed, timed out or raised.
    """
    root, key = _where(task, settings, device)
    folder = root / key
    defer = defer_compile and executor is not None and not baselines and device != "cpu"
    with _locked(root, key):
        cached = None
        if not baselines and (folder / META_FILE).exists():
            cached = ReferenceData(folder, json.loads((folder / META_FILE).read_text()))
            if timeline and "timeline" not in cached.meta and "timeline_error" not in cached.meta:
                cached = None
        data = cached or _run_reference(
            task, settings, executor, device, baselines, timeline, defer
        )
    if defer and _compile_pending(data.meta) and executor is not None:
        _start_warmup(key, task, settings, executor, device)
    return data


def _run_reference(
    task: Task,
    settings: RunSettings,
    executor: Executor | None,
    device: str,
    baselines: bool,
    timeline: int,
    defer: bool,
) -> ReferenceData:
    root, key = _where(task, settings, device)
    folder = root / key
    staging = root / f"{key}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    payload = reference_payload(task, settings, device)
    if baselines:
        payload.update(reduce_overhead=True, default_flags_eager=True)
    if timeline:
        payload["timeline_iterations"] = timeline
    if defer:
        payload["compile"] = False
    result = run_on(executor, _reference_job(payload, settings, staging))
    if result.status != "ok":
        reason = result.reason or result.status
        msg = f"reference failed: {reason}"
        raise ReferenceFailed(msg)
    meta = dict(result.result)
    meta["seconds"] = result.seconds
    meta["gpu"] = result.gpu
    if defer:
        meta["compile_deferred"] = True
    staging.mkdir(parents=True, exist_ok=True)
    (staging / META_FILE).write_text(json.dumps(meta))
    for name in ("job.json", "stdout.txt", "stderr.txt", "result.json"):
        (staging / name).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return ReferenceData(folder, meta)


def _compile_pending(meta: dict[str, Any]) -> bool:
    return bool(meta.get("compile_deferred")) and "compile_ms" not in meta


_warmups: dict[str, Future[JobResult]] = {}
_warmups_lock = threading.Lock()


def _start_warmup(
    key: str, task: Task, settings: RunSettings, executor: Executor, device: str
) -> None:
    """Compile the reference once beside the loop's jobs, unless that is under way already."""
    with _warmups_lock:
        if key in _warmups:
            return
        threads = max(1, (os.cpu_count() or 2) // 2)
        job = Job(
            kind="warmup",
            payload=reference_payload(task, settings, device),
            timeout_s=600.0,
            memory_limit_mb=settings.worker_memory_mb,
            env={
                "TORCHINDUCTOR_CACHE_DIR": _inductor_cache_dir(),
                "TORCHINDUCTOR_COMPILE_THREADS": str(threads),
            },
            shares_gpu=True,
        )
        _warmups[key] = executor.submit(job)


def complete_compile_baseline(
    task: Task,
    settings: RunSettings,
    *,
    executor: Executor | None = None,
    device: str = "cuda",
) -> ReferenceData:
    """The reference with its ``torch.compile`` time, taken now where its run deferred it.

    Waits for the warm-up, then times the compiled model on the reference's draws in a worker
    of its own; the figure (or ``compile_error``) joins the cached reference, so every later ask
    finds it. A reference that timed torch.compile already is returned as it is.

    Raises:
        ReferenceFailed: No reference could be run.
    """
    root, key = _where(task, settings, device)
    with _warmups_lock:
        warming = _warmups.pop(key, None)
    warm = warming.result() if warming is not None else None
    folder = root / key
    if not (folder / META_FILE).exists():
        return ensure_reference(task, settings, executor=executor, device=device)
    with _locked(root, key):
        meta = json.loads((folder / META_FILE).read_text())
        if not _compile_pending(meta):
            return ReferenceData(folder, meta)
        scratch = root / f"{key}.compile"
        shutil.rmtree(scratch, ignore_errors=True)
        payload = {**reference_payload(task, settings, device), "compile_only": True}
        started = time.monotonic()
        result = run_on(executor, _reference_job(payload, settings, scratch))
        shutil.rmtree(scratch, ignore_errors=True)
        if result.status == "ok":
            meta.update({k: v for k, v in result.result.items() if k.startswith("compile")})
        else:
            meta.update(compile_ms=None, compile_error=f"reference failed: {result.reason}")
        meta["compile_baseline_s"] = round(time.monotonic() - started, 2)
        if warm is not None:
            meta["compile_warmup"] = {"status": warm.status, "seconds": warm.seconds, **warm.result}
        staged = folder / f"{META_FILE}.new"
        staged.write_text(json.dumps(meta))
        staged.replace(folder / META_FILE)
        return ReferenceData(folder, meta)


def compile_baseline(
    task: Task, ctx: Any = None, *, executor: Executor | None = None
) -> float | None:
    """``torch.compile``'s time of ``task`` for a run's report, ms (``None``: no GPU, or the
    compile failed): taken now where the run deferred it, else the cached figure.

    Args:
        task: The problem.
        ctx: ``StitchContext`` or ``RunSettings`` (seed, TF32, limits); defaults when ``None``.
        executor: Where the worker runs; the process-wide ``LocalGPUExecutor`` when ``None``.
    """
    if not gpu_available():
        return None
    settings = RunSettings.from_context(ctx)
    try:
        data = complete_compile_baseline(task, settings, executor=executor or default_executor())
    except ReferenceFailed:
        return None
    return data.meta.get("compile_ms")
