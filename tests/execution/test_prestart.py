"""Pre-started workers without a GPU: same results as cold starts, faster, and never left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stitch_graph.artifacts import Candidate, Task, TestResult
from stitch_graph.execution import Job, JobResult, LocalGPUExecutor, RunSettings, run_job
from stitch_graph.execution.candidate import candidate_job, judge_candidate, prepare_for_run
from stitch_graph.execution.executor import job_environment
from tests.execution.cpu_programs import HONEST, HOST, PROBLEM

DUMP_ENV = (
    "        import json, os\n"
    "        json.dump(dict(os.environ), open(os.path.join(os.getcwd(), 'env.json'), 'w'))\n"
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _probe(executor: LocalGPUExecutor, **job: object) -> tuple[JobResult, float]:
    """Submit a ``probe`` job; its result and the seconds from submission to result."""
    start = time.perf_counter()
    result = executor.submit(Job(kind="probe", timeout_s=60, **job)).result()
    return result, time.perf_counter() - start


def _ready_pid(executor: LocalGPUExecutor) -> int:
    """Wait until the executor's idle worker has imported everything; its pid."""
    assert executor.warm is not None
    assert executor.warm.wait_ready(None, timeout_s=60)
    return executor.warm.idle_pids()[None]


@pytest.fixture
def warm_executor():
    executor = LocalGPUExecutor(gpus=[])
    yield executor
    executor.shutdown()


def test_second_job_is_picked_up_by_a_prestarted_worker(warm_executor):
    first, _ = _probe(warm_executor)
    assert first.status == "ok" and not first.warm_start
    idle = _ready_pid(warm_executor)
    second, _ = _probe(warm_executor)
    assert second.status == "ok" and second.warm_start
    assert second.worker_pid == idle == second.result["pid"]
    assert not _alive(idle)  # one job per process, then gone
    assert _ready_pid(warm_executor) != idle  # and the next one is already waiting
    for result in (first, second):  # a warm worker looks like a cold one from inside
        scratch = result.scratch_dir
        assert result.result["cwd"] == result.result["tmpdir"] == scratch
        assert result.result["sys_path0"] == scratch
        assert result.result["cuda_initialized"] is False
    assert first.result["env_names"] == second.result["env_names"]


def test_warm_start_is_faster_than_cold(warm_executor):
    cold_executor = LocalGPUExecutor(gpus=[], prestart=False)
    try:
        colds = [_probe(cold_executor) for _ in range(2)]
    finally:
        cold_executor.shutdown()
    _probe(warm_executor)
    warms = []
    for _ in range(2):
        _ready_pid(warm_executor)
        warms.append(_probe(warm_executor))
    assert not any(r.warm_start for r, _ in colds) and all(r.warm_start for r, _ in warms)
    cold_s = min(s for _, s in colds)
    warm_s = max(s for _, s in warms)
    assert warm_s <= 0.6 * cold_s, (warm_s, cold_s)
    cold_import = min(r.result["import_s"] for r, _ in colds)
    warm_import = max(r.result["import_s"] for r, _ in warms)
    assert warm_import <= 0.1 * cold_import, (warm_import, cold_import)


def test_idle_worker_killed_is_replaced_by_cold_start(warm_executor):
    _probe(warm_executor)
    idle = _ready_pid(warm_executor)
    os.kill(idle, signal.SIGKILL)
    result, _ = _probe(warm_executor)
    assert result.status == "ok" and not result.warm_start
    assert result.worker_pid != idle
    assert _ready_pid(warm_executor) not in (idle, result.worker_pid)


def test_changed_environment_falls_back_to_cold_start(warm_executor, monkeypatch, tmp_path):
    _probe(warm_executor)
    idle = _ready_pid(warm_executor)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result, _ = _probe(warm_executor)
    assert result.status == "ok" and not result.warm_start
    assert not _alive(idle)  # discarded, not kept for later
    other_env, _ = _probe(warm_executor, env={"STITCH_OTHER": "1"})
    assert not other_env.warm_start and "STITCH_OTHER" in other_env.result["env_names"]


def test_prefixed_job_starts_cold_and_keeps_the_idle_worker(warm_executor):
    _probe(warm_executor)
    idle = _ready_pid(warm_executor)
    result, _ = _probe(warm_executor, command_prefix=["env"])
    assert result.status == "ok" and not result.warm_start
    assert warm_executor.warm.idle_pids()[None] == idle and _alive(idle)


def test_shutdown_leaves_no_idle_worker():
    ready = LocalGPUExecutor(gpus=[])
    _probe(ready)
    ready_pid = _ready_pid(ready)
    importing = LocalGPUExecutor(gpus=[])
    _probe(importing)
    importing_pid = importing.warm.idle_pids()[None]  # probably still importing torch
    ready.shutdown()
    importing.shutdown()
    assert not _alive(ready_pid) and not _alive(importing_pid)
    assert ready.warm.idle_pids() == {} and importing.warm.idle_pids() == {}


def test_interpreter_exit_leaves_no_idle_worker(tmp_path):
    script = (
        "from stitch_graph.execution import Job, LocalGPUExecutor\n"
        "executor = LocalGPUExecutor(gpus=[])\n"
        "executor.submit(Job(kind='probe', timeout_s=60)).result()\n"
        "print(executor.warm.idle_pids()[None], flush=True)\n"
    )  # no shutdown: the idle worker is still importing when the interpreter exits
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert not _alive(int(done.stdout.strip()))


# ------------------------------------------------------------------------------------------
# Candidate jobs: a pre-started worker gives the same structured results as a cold one


@pytest.fixture(scope="module")
def candidates(tmp_path_factory):
    """A task whose reference has been run, settings, and an executor with pre-started workers."""
    settings = RunSettings(work_dir=str(tmp_path_factory.mktemp("prestart")), timeout_s=30)
    task = Task(name="lin_relu", source=PROBLEM)
    executor = LocalGPUExecutor(gpus=[])
    yield task, settings, executor
    executor.shutdown()


def _candidate_job(task: Task, body: str, settings: RunSettings, scratch: Path):
    """The ``candidate`` job of a host-code candidate, and the reference it is judged against."""
    candidate = Candidate(kernel_source="", host_source=HOST.format(body=body))
    prepared = prepare_for_run(task, candidate, settings, device="cpu")
    assert not isinstance(prepared, TestResult), prepared.reason
    built, reference = prepared
    job = candidate_job(
        task.source, candidate, built, reference, settings, device="cpu", scratch_dir=str(scratch)
    )
    return job, reference


@pytest.mark.parametrize(
    ("body", "timeout_s", "status", "reason"),
    [
        (DUMP_ENV + HONEST, 30, "passed", ""),
        ("        import time\n        time.sleep(60)", 3, "error", "timeout"),
        ("        import ctypes\n        ctypes.string_at(0)", 30, "error", "SIGSEGV"),
        ("        raise ValueError('nope')", 30, "error", "Python exception: ValueError: nope"),
    ],
    ids=["secrets", "hang", "segfault", "exception"],
)
def test_prestarted_candidate_matches_cold(
    candidates, tmp_path, monkeypatch, body, timeout_s, status, reason
):
    task, settings, executor = candidates
    settings = dataclasses.replace(settings, timeout_s=timeout_s)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-key")  # in the parent as workers start
    cold_job, reference = _candidate_job(task, body, settings, tmp_path / "cold")
    warm_job, _ = _candidate_job(task, body, settings, tmp_path / "warm")
    # the executor pre-starts after a job; the environment (PYTEST_CURRENT_TEST) changed since
    executor.warm.prepare(None, job_environment(warm_job))
    cold = judge_candidate(run_job(cold_job), reference, settings)
    idle = _ready_pid(executor)
    warm = judge_candidate(executor.submit(warm_job).result(), reference, settings)
    assert not cold.job.warm_start
    assert warm.job.warm_start and warm.job.worker_pid == idle
    for run in (cold, warm):
        assert run.test.status == status, run.test.reason
        assert reason in run.test.reason
    assert warm.test.reason == cold.test.reason
    assert warm.job.status == cold.job.status
    if body.startswith(DUMP_ENV):
        seen = {
            name: json.loads((tmp_path / name / "env.json").read_text())
            for name in ("cold", "warm")
        }
        assert "OPENAI_API_KEY" not in seen["cold"] and "OPENAI_API_KEY" not in seen["warm"]
        assert sorted(seen["cold"]) == sorted(seen["warm"])
        assert seen["warm"]["TMPDIR"] == str(tmp_path / "warm")
