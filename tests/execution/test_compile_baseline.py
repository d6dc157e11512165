"""torch.compile's baseline deferred to the run's report: the reference worker times eager only,
a warm-up compiles beside the loop's jobs, and the figure is taken at the end and cached with
the reference (scripted executors; the GPU side is in tests/gpu/test_execution_gpu.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from stitch_graph.artifacts import Task
from stitch_graph.execution import Job, JobResult, LocalGPUExecutor, RunSettings
from stitch_graph.execution import executor as executor_module
from stitch_graph.execution.placement import Placement, shared_gpu_overlaps
from stitch_graph.execution.reference import complete_compile_baseline, ensure_reference

PROBLEM = Path(__file__).parents[1] / "fixtures" / "verify_corpus" / "problems" / "bias_relu.py"


class _Answering:
    """Answers each job kind with a scripted result and keeps the jobs it was given."""

    def __init__(self, answers: dict[str, JobResult]):
        self.answers = answers
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> Future:
        self.jobs.append(job)
        done: Future = Future()
        mode = "compile_only" if job.payload.get("compile_only") else job.kind
        done.set_result(self.answers[mode])
        return done

    def shutdown(self) -> None:
        pass


def _ok(**result) -> JobResult:
    return JobResult(status="ok", result=result, seconds=2.0, gpu="0")


@pytest.fixture
def task() -> Task:
    return Task(name="bias_relu", source=PROBLEM.read_text())


def test_a_deferred_baseline_is_warmed_beside_the_loop_and_timed_once_at_the_end(task, tmp_path):
    answers = {
        "reference": _ok(eager_ms=2.0),
        "warmup": _ok(compile_s=31.0),
        "compile_only": _ok(compile_ms=1.5, compile={"median_ms": 1.5}),
    }
    executor = _Answering(answers)
    settings = RunSettings(work_dir=str(tmp_path))
    first = ensure_reference(task, settings, executor=executor, defer_compile=True)
    reference, warmup = executor.jobs
    assert reference.kind == "reference" and reference.payload["compile"] is False
    assert warmup.kind == "warmup" and warmup.shares_gpu and not reference.shares_gpu
    assert int(warmup.env["TORCHINDUCTOR_COMPILE_THREADS"]) >= 1
    assert first.meta["compile_deferred"] and "compile_ms" not in first.meta

    # a candidate's ask in the loop finds the reference cached and starts nothing
    assert "compile_ms" not in ensure_reference(task, settings, executor=executor).meta
    assert len(executor.jobs) == 2

    done = complete_compile_baseline(task, settings, executor=executor)
    assert executor.jobs[2].payload["compile_only"] is True and not executor.jobs[2].shares_gpu
    assert done.meta["compile_ms"] == 1.5 and done.meta["eager_ms"] == 2.0
    assert done.meta["compile_warmup"]["compile_s"] == 31.0
    assert ensure_reference(task, settings, executor=executor).meta["compile_ms"] == 1.5
    complete_compile_baseline(task, settings, executor=executor)  # cached: no job
    assert len(executor.jobs) == 3


def test_a_baseline_that_fails_is_a_blank_with_its_reason(task, tmp_path):
    answers = {
        "reference": _ok(eager_ms=2.0),
        "warmup": _ok(compile_error="BackendCompilerFailed: no"),
        "compile_only": JobResult(status="timeout", reason="timeout: ran past 300 s"),
    }
    executor = _Answering(answers)
    settings = RunSettings(work_dir=str(tmp_path))
    ensure_reference(task, settings, executor=executor, defer_compile=True)
    done = complete_compile_baseline(task, settings, executor=executor)
    assert done.meta["compile_ms"] is None and "ran past 300 s" in done.meta["compile_error"]
    assert done.meta["eager_ms"] == 2.0  # what the reference measured stays


def test_baselines_and_runs_without_an_executor_never_defer(task, tmp_path):
    executor = _Answering({"reference": _ok(eager_ms=2.0, compile_ms=1.5)})
    settings = RunSettings(work_dir=str(tmp_path))
    data = ensure_reference(task, settings, executor=executor, baselines=True, defer_compile=True)
    assert [j.kind for j in executor.jobs] == ["reference"]
    assert "compile" not in executor.jobs[0].payload and data.meta["compile_ms"] == 1.5


def test_a_job_that_shares_the_gpu_runs_beside_the_slots_job(monkeypatch):
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def fake_run_job(job, *, gpu=None, warm=None):
        start = time.monotonic()
        time.sleep(0.4)
        with lock:
            spans[job.kind] = (start, time.monotonic())
        return JobResult(status="ok", gpu=gpu)

    monkeypatch.setattr(executor_module, "run_job", fake_run_job)
    pool = LocalGPUExecutor(gpus=["0"], prestart=False)
    try:
        timed = pool.submit(Job(kind="candidate"))
        beside = pool.submit(Job(kind="warmup", shares_gpu=True))
        queued = pool.submit(Job(kind="runner"))
        assert beside.result().gpu == "0" and timed.result().gpu == "0"
        queued.result()
    finally:
        pool.shutdown()
    assert spans["warmup"][0] < spans["candidate"][1]  # it did not wait for the slot
    assert spans["runner"][0] >= spans["candidate"][1]  # the slot still runs one job at a time


def test_a_warmup_sharing_a_gpu_is_no_clash_of_timings():
    records = [
        Placement(kind="candidate", node="n", gpu="0", start=0, end=2),
        Placement(kind="warmup", node="n", gpu="0", start=1, end=30),
    ]
    assert shared_gpu_overlaps(records) == []
