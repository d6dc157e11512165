"""Where and when each job ran, and a check that no two timings shared a GPU at once.

A sweep spread over many GPUs is only as trustworthy as its isolation: two timed jobs on one GPU
at the same moment slow each other down, and nothing in their numbers shows it. Every executor's
jobs can be recorded (``RecordingExecutor``) as a :class:`Placement` (node, GPU, start, end), and
:func:`shared_gpu_overlaps` finds any two records of one GPU whose intervals overlap, so a
multi-GPU run can show afterwards that its timings were taken alone.

``RunnerOn`` turns any executor into what ``StitchContext.executor`` expects (an object with
``verify_candidate``, ``profile_candidate`` and ``tune_candidate``), so the graph's candidate
evaluations go to that executor.
"""

from __future__ import annotations

import platform
import threading
import time
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel

from stitch_graph.execution.executor import Executor, Job, JobResult

__all__ = [
    "GPU_JOB_KINDS",
    "PlacedJobResult",
    "Placement",
    "RecordingExecutor",
    "RunnerOn",
    "job_needs_gpu",
    "shared_gpu_overlaps",
]

GPU_JOB_KINDS = frozenset({"reference", "candidate", "runner", "tune", "warmup"})
"""Job kinds that use the GPU unless their payload says ``device: cpu``."""


def job_needs_gpu(job: Job) -> bool:
    """Whether ``job`` must have a GPU of its own (a CPU-device job or a probe needs none)."""
    return job.kind in GPU_JOB_KINDS and job.payload.get("device", "cuda") != "cpu"


class Placement(BaseModel):
    """Where and when one job ran.

    Attributes:
        kind: The job's kind.
        node: The machine (Ray node id, else the host name).
        host: The host name.
        gpu: The GPU ids the job saw (``CUDA_VISIBLE_DEVICES``), None for a CPU job.
        start: Wall-clock start, seconds since the epoch.
        end: Wall-clock end, seconds since the epoch.
        tag: What the job was for (a problem), set by ``RecordingExecutor``.
    """

    kind: str
    node: str
    host: str = ""
    gpu: str | None = None
    start: float
    end: float
    tag: str = ""


class PlacedJobResult(JobResult):
    """A ``JobResult`` that says where it ran (executors that know it return this)."""

    placement: Placement | None = None


def shared_gpu_overlaps(records: list[Placement]) -> list[tuple[Placement, Placement]]:
    """Pairs of records that used one GPU of one node at the same time.

    A ``problem`` record (a Ray task that held a GPU for a whole problem) does not clash with
    the jobs of the same problem that ran inside it, and a ``warmup`` job (torch.compile's cold
    compile, which times nothing) shares its GPU by design.

    Args:
        records: Placements of a run; records without a GPU are ignored.

    Returns:
        Each overlapping pair (earlier start first); empty when every GPU ran one job at a time.
    """
    by_gpu: dict[tuple[str, str], list[Placement]] = {}
    for record in records:
        if record.gpu is None or record.gpu == "" or record.kind == "warmup":
            continue
        for gpu in record.gpu.split(","):
            by_gpu.setdefault((record.node, gpu.strip()), []).append(record)
    pairs: list[tuple[Placement, Placement]] = []
    for group in by_gpu.values():
        group.sort(key=lambda r: r.start)
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                if second.start >= first.end:
                    break
                inside = "problem" in (first.kind, second.kind) and first.tag == second.tag
                if not inside:
                    pairs.append((first, second))
    return pairs


class RecordingExecutor:
    """Wraps an executor and records a :class:`Placement` for each job it ran.

    Args:
        inner: The executor that runs the jobs.
        tag: Written into every record (e.g. the problem).
        records: Where records go; a shared list lets several wrappers feed one run's records.
    """

    def __init__(
        self, inner: Executor, *, tag: str = "", records: list[Placement] | None = None
    ) -> None:
        self.inner = inner
        self.tag = tag
        self.records: list[Placement] = records if records is not None else []
        self._lock = threading.Lock()

    def submit(self, job: Job) -> Future[JobResult]:
        """Queue ``job`` on the inner executor; its placement is recorded before the returned
        future resolves, so whoever waits on it finds the record already there."""
        outer: Future[JobResult] = Future()

        def done(inner: Future[JobResult]) -> None:
            if inner.cancelled():
                outer.cancel()
                return
            error = inner.exception()
            if error is not None:
                outer.set_exception(error)
                return
            self._record(job, inner.result())
            outer.set_result(inner.result())

        self.inner.submit(job).add_done_callback(done)
        return outer

    def _record(self, job: Job, result: JobResult) -> None:
        placement = getattr(result, "placement", None)
        if placement is None:
            end = time.time()
            placement = Placement(
                kind=job.kind,
                node=platform.node(),
                host=platform.node(),
                gpu=result.gpu,
                start=end - result.seconds,
                end=end,
            )
        placement = placement.model_copy(update={"tag": self.tag})
        with self._lock:
            self.records.append(placement)

    def shutdown(self) -> None:
        """Leave the inner executor running: it is shared, and its owner shuts it down."""


class RunnerOn:
    """What ``StitchContext.executor`` takes, with every job sent to ``executor``.

    Args:
        executor: Where the graph's candidate evaluations run (local, Ray, recorded, ...).
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def verify_candidate(self, task: Any, candidate: Any, ctx: Any = None, **kwargs: Any) -> Any:
        """``execution.verify_candidate`` on this executor."""
        from stitch_graph.execution.round import verify_candidate

        return verify_candidate(task, candidate, ctx, executor=self.executor, **kwargs)

    def profile_candidate(self, task: Any, candidate: Any, ctx: Any = None, **kwargs: Any) -> Any:
        """``execution.profile_candidate`` on this executor."""
        from stitch_graph.execution.profiling import profile_candidate

        return profile_candidate(task, candidate, ctx, executor=self.executor, **kwargs)

    def tune_candidate(self, *args: Any, **kwargs: Any) -> Any:
        """``execution.tune_candidate`` on this executor."""
        from stitch_graph.execution.autotune import tune_candidate

        return tune_candidate(*args, executor=self.executor, **kwargs)

    def reference_timeline(self, task: Any, ctx: Any = None, **kwargs: Any) -> Any:
        """``execution.reference_timeline`` on this executor (the Planner's reference run)."""
        from stitch_graph.execution.profiling import reference_timeline

        return reference_timeline(task, ctx, executor=self.executor, **kwargs)

    def compile_baseline(self, task: Any, ctx: Any = None) -> Any:
        """``execution.compile_baseline`` on this executor (the report's torch.compile time)."""
        from stitch_graph.execution.reference import compile_baseline

        return compile_baseline(task, ctx, executor=self.executor)
