"""Where jobs run: the ``Executor`` protocol and a local executor with one job per GPU at a time.

A job is a JSON-describable request (reference run, candidate run, timeline, ...) that a worker
process executes (``python -m stitch_graph.execution.worker JOB.json``). Executors only schedule and
isolate; they know nothing about what a job does. ``LocalGPUExecutor`` keeps one job per visible GPU
and pins each job to its GPU with ``CUDA_VISIBLE_DEVICES``, so timings never share a device; a job
marked ``shares_gpu`` (nearly all CPU work, such as torch.compile's cold compile) runs beside them
instead of waiting for the slot. A distributed executor implements the same two methods and ships
the job file instead of running it.

Every job still gets a fresh process, but with ``prestart`` (the default) it need not wait for that
process to import torch: while a job runs, the executor starts the next worker of the same GPU slot
(``stitch_graph.execution.prestart``), and the next job with the same environment is handed to it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from stitch_graph.execution.isolation import ProcessOutcome, start_isolated, watch_isolated
from stitch_graph.execution.prestart import WarmWorker, WarmWorkerPool

__all__ = [
    "Executor",
    "Job",
    "JobKind",
    "JobResult",
    "LocalGPUExecutor",
    "default_executor",
    "gpu_available",
    "job_environment",
    "run_job",
    "run_on",
    "visible_gpus",
]

JobKind = Literal["reference", "candidate", "runner", "probe", "tune", "build", "warmup"]
JobStatus = Literal["ok", "error", "timeout", "crashed", "memory"]

RESULT_FILE = "result.json"
JOB_FILE = "job.json"


class Job(BaseModel):
    """One unit of isolated work.

    Attributes:
        kind: What the worker does (see ``stitch_graph.execution.worker``).
        payload: Kind-specific, JSON-safe arguments.
        timeout_s: Wall-clock limit of the worker.
        memory_limit_mb: Resident-memory limit of the worker's process group.
        scratch_dir: The worker's own folder; a fresh one under the temp dir when empty.
        command_prefix: Wraps the worker command, e.g. a profiler's argv.
        env: Extra environment variables (scrubbed like the rest).
        shares_gpu: Run beside the GPU's one job instead of waiting for its slot: for work that
            is nearly all CPU, whose few GPU calls cannot hold up a timing for long. Executors
            that cannot tell may run it like any other job.
    """

    kind: JobKind
    payload: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = 120.0
    memory_limit_mb: int | None = 16384
    scratch_dir: str | None = None
    command_prefix: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    shares_gpu: bool = False


class JobResult(BaseModel):
    """What came back from a job.

    ``status`` is ``ok`` when the worker finished and wrote a result (which may itself describe a
    Python-level failure in ``result["error"]``); otherwise the process was killed or crashed and
    ``reason`` says how. ``seconds`` counts from the moment the worker was given the job;
    ``warm_start`` says whether that worker was pre-started (its imports already done, or under
    way) rather than started for the job.
    """

    status: JobStatus
    reason: str = ""
    result: dict[str, Any] = Field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_path: str = ""
    scratch_dir: str = ""
    gpu: str | None = None
    warm_start: bool = False
    worker_pid: int | None = None


def _worker_argv(job_path: Path) -> list[str]:
    """``python -m stitch_graph.execution.worker JOB`` with fault tracebacks on."""
    return [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "stitch_graph.execution.worker",
        str(job_path),
    ]


def _python_path() -> str:
    """PYTHONPATH that lets the worker import this package even when it is not installed."""
    here = str(Path(__file__).resolve().parents[2])
    current = os.environ.get("PYTHONPATH", "")
    return here if not current else f"{here}{os.pathsep}{current}"


def _crash_reason(stderr: str, returncode: int | None, signal_name: str | None) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    how = f"killed by {signal_name}" if signal_name else f"exited with status {returncode}"
    fatal = next((ln for ln in lines if "Fatal Python error" in ln), None)
    detail = fatal or (lines[-1] if lines else "")
    return f"worker crashed ({how})" + (f": {detail}" if detail else "")


def job_environment(job: Job, gpu: str | None = None) -> dict[str, str]:
    """The environment of ``job``'s worker before scrubbing, less the scratch-folder TMPDIR.

    A cold worker also gets ``TMPDIR`` set to its scratch folder unless the environment names one;
    a pre-started worker, which cannot know its scratch folder in advance, sets it on hand-over.

    Args:
        job: The job (its ``env`` is applied over ours).
        gpu: Value of ``CUDA_VISIBLE_DEVICES``; ``None`` keeps the parent's.

    Returns:
        The environment.
    """
    env = dict(os.environ)
    env.update(job.env)
    env["PYTHONPATH"] = _python_path()
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _run_warm(
    worker: WarmWorker,
    pool: WarmWorkerPool,
    job_path: Path,
    env: dict[str, str],
    watch: dict[str, Any],
) -> ProcessOutcome | None:
    """Hand the job to a pre-started worker, pre-start the next one, and watch it like a cold one.

    The worker's first act on hand-over is to create ``stdout.txt`` and ``stderr.txt`` in the
    scratch folder; a worker that ends without them died before it took the job (e.g. killed just
    as it was handed over), so no part of the job ran.

    Args:
        worker: The idle worker taken from ``pool`` for this job.
        pool: Where the next worker of the slot is started.
        job_path: Absolute path of the job file.
        env: The job's environment (``job_environment``), for the next worker.
        watch: Keyword arguments of ``watch_isolated`` except ``start``.

    Returns:
        The outcome, or ``None`` when the worker never took the job: start it cold instead.
    """
    stdout_path, stderr_path = Path(watch["stdout_path"]), Path(watch["stderr_path"])
    stdout_path.unlink(missing_ok=True)
    stderr_path.unlink(missing_ok=True)
    start = time.monotonic()
    if not worker.hand_over(job_path):
        worker.discard()
        return None
    pool.prepare(worker.slot, env)  # the next job's worker imports while this one runs
    outcome = watch_isolated(worker.proc, start=start, **watch)
    worker.remove_folder()
    taken = stderr_path.exists() or outcome.timed_out or outcome.memory_exceeded
    return outcome if taken else None


def run_job(job: Job, *, gpu: str | None = None, warm: WarmWorkerPool | None = None) -> JobResult:
    """Run ``job`` in a fresh isolated worker process and wait for it.

    Args:
        job: The job.
        gpu: Value of ``CUDA_VISIBLE_DEVICES`` for the worker; ``None`` keeps the parent's.
        warm: Pre-started workers. The job goes to the slot's idle worker when that one is alive
            and has the job's environment (else it starts cold), and the slot's next worker is
            started while this job runs. Jobs with a ``command_prefix`` always start cold.

    Returns:
        The job's result; never raises for anything the worker does.
    """
    scratch = Path(job.scratch_dir or tempfile.mkdtemp(prefix=f"stitch-{job.kind}-"))
    scratch.mkdir(parents=True, exist_ok=True)
    job_path = scratch.absolute() / JOB_FILE  # the worker runs elsewhere until it has the job
    result_path = scratch / RESULT_FILE
    stdout_path = scratch / "stdout.txt"
    stderr_path = scratch / "stderr.txt"
    result_path.unlink(missing_ok=True)
    job_path.write_text(job.model_dump_json())
    env = job_environment(job, gpu)
    pool = warm if not job.command_prefix else None
    watch = {
        "timeout_s": job.timeout_s,
        "memory_limit_mb": job.memory_limit_mb,
        "stdout_path": str(stdout_path),
        "stderr_path": str(stderr_path),
    }
    worker = pool.take(gpu, env) if pool is not None else None
    outcome: ProcessOutcome | None = None
    if worker is not None and pool is not None:
        outcome = _run_warm(worker, pool, job_path, env, watch)
        if outcome is None:
            worker = None
    if outcome is None:
        cold_env = dict(env)
        cold_env.setdefault("TMPDIR", str(scratch))
        argv = [*job.command_prefix, *_worker_argv(job_path)]
        start = time.monotonic()
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = start_isolated(argv, cwd=scratch, env=cold_env, stdout=out, stderr=err)
        if pool is not None:
            pool.prepare(gpu, env)  # the next job's worker imports while this one runs
        outcome = watch_isolated(proc, start=start, **watch)
        pid = proc.pid
    else:
        pid = worker.pid if worker is not None else None
    common = {
        "returncode": outcome.returncode,
        "seconds": outcome.seconds,
        "peak_rss_mb": outcome.peak_rss_mb,
        "stdout_tail": outcome.tail("stdout", 3000),
        "stderr_tail": outcome.tail("stderr"),
        "stdout_path": outcome.stdout_path,
        "scratch_dir": str(scratch),
        "gpu": gpu,
        "warm_start": worker is not None,
        "worker_pid": pid,
    }
    if outcome.timed_out:
        reason = f"timeout: worker ran past {job.timeout_s:g} s and was killed (hang?)"
        return JobResult(status="timeout", reason=reason, **common)
    if outcome.memory_exceeded:
        reason = (
            f"memory limit: worker's resident memory passed {job.memory_limit_mb} MiB "
            "and it was killed"
        )
        return JobResult(status="memory", reason=reason, **common)
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError) as exc:
            reason = f"worker wrote an unreadable result ({type(exc).__name__}: {exc})"
            return JobResult(status="crashed", reason=reason, **common)
        status: JobStatus = "error" if result.get("error") else "ok"
        reason = result.get("error", {}).get("reason", "") if status == "error" else ""
        if outcome.returncode not in (0, None) and status == "ok":
            status = "crashed"
            reason = _crash_reason(common["stderr_tail"], outcome.returncode, outcome.signal_name)
        return JobResult(status=status, reason=reason, result=result, **common)
    reason = _crash_reason(common["stderr_tail"], outcome.returncode, outcome.signal_name)
    return JobResult(status="crashed", reason=reason, **common)


@runtime_checkable
class Executor(Protocol):
    """Runs jobs somewhere and hands back futures."""

    def submit(self, job: Job) -> Future[JobResult]:
        """Queue ``job``; the future resolves to its ``JobResult``."""
        ...

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for running ones."""
        ...


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


def visible_gpus() -> list[str]:
    """Ids of the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(out.splitlines()) if ln.startswith("GPU ")]


class LocalGPUExecutor:
    """Runs jobs on this machine, one at a time per visible GPU, each in a fresh worker.

    Args:
        max_workers: Concurrent jobs; defaults to the number of visible GPUs (at least one).
        gpus: GPU ids to use; defaults to ``visible_gpus()``. With none, jobs keep the parent's
            ``CUDA_VISIBLE_DEVICES`` and run one at a time.
        prestart: While a job runs, start the next worker of its GPU slot so the next job skips
            the imports (still one fresh process per job). Off for one-off executors, where the
            extra process would only be killed again.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        gpus: list[str] | None = None,
        prestart: bool = True,
    ) -> None:
        self.gpus = list(gpus) if gpus is not None else visible_gpus()
        slots = self.gpus or [None]
        if max_workers is not None:
            slots = slots[: max(1, max_workers)]
        self._free: queue.Queue[str | None] = queue.Queue()
        for slot in slots:
            self._free.put(slot)
        self._pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="stitch-job")
        self._beside = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="stitch-side")
        self._lock = threading.Lock()
        self._closed = False
        self.instance = uuid.uuid4().hex[:8]
        self.warm: WarmWorkerPool | None = WarmWorkerPool() if prestart else None

    def submit(self, job: Job) -> Future[JobResult]:
        """Queue ``job``; it runs when a GPU is free (at once, on the first GPU, when it
        ``shares_gpu``; such a job never takes a pre-started worker)."""
        with self._lock:
            if self._closed:
                msg = "LocalGPUExecutor is shut down; create a new one"
                raise RuntimeError(msg)
            if job.shares_gpu:
                gpu = self.gpus[0] if self.gpus else None
                return self._beside.submit(run_job, job, gpu=gpu)
            return self._pool.submit(self._run, job)

    def _run(self, job: Job) -> JobResult:
        gpu = self._free.get()
        try:
            return run_job(job, gpu=gpu, warm=self.warm)
        finally:
            self._free.put(gpu)

    def shutdown(self) -> None:
        """Wait for queued jobs, kill the idle pre-started workers and stop."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._beside.shutdown(wait=True)
        if self.warm is not None:
            self.warm.close()

    def __enter__(self) -> LocalGPUExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


_default: LocalGPUExecutor | None = None
_default_lock = threading.Lock()


def default_executor() -> LocalGPUExecutor:
    """A process-wide ``LocalGPUExecutor``, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = LocalGPUExecutor()
        return _default


def run_on(executor: Executor | None, job: Job) -> JobResult:
    """Run ``job`` on ``executor`` and wait; with ``None``, on a private one-worker executor
    that is shut down afterwards (no pre-started worker is left behind)."""
    runner = executor or LocalGPUExecutor(max_workers=1, prestart=False)
    try:
        return runner.submit(job).result()
    finally:
        if executor is None:
            runner.shutdown()
