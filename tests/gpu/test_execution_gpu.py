"""End-to-end checks of isolated execution on a real GPU: honest candidates, faults, export."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stitch_graph.artifacts import Task
from stitch_graph.execution import (
    LocalGPUExecutor,
    RunSettings,
    export_kernelbench,
    load_candidate_dir,
    profile_candidate,
    reference_timeline,
    verify_candidate,
)

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = sorted(p for p in (ROOT / "examples" / "candidates").iterdir() if p.is_dir())
FAULTY = sorted(
    p for p in (ROOT / "tests" / "fixtures" / "faulty_candidates").iterdir() if p.is_dir()
)
HEALTHY = ROOT / "examples" / "candidates" / "add_relu"


def _task(problem: str) -> Task:
    path = Path(problem)
    return Task(name=path.stem, source=path.read_text(), path=str(path))


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> RunSettings:
    return RunSettings(work_dir=str(tmp_path_factory.mktemp("gpu-exec")), timeout_s=30.0)


@pytest.fixture(scope="module")
def executor() -> LocalGPUExecutor:
    pool = LocalGPUExecutor()
    yield pool
    pool.shutdown()


def _verify(folder: Path, settings: RunSettings, executor: LocalGPUExecutor, **kw):
    candidate, meta = load_candidate_dir(folder)
    outcome = verify_candidate(_task(meta["problem"]), candidate, settings, executor=executor, **kw)
    print(
        f"{folder.name}: {outcome.test.status} ({outcome.test.reason}); "
        f"timing {outcome.timing.model_dump(exclude_none=True)}; {outcome.seconds:.2f} s"
    )
    return outcome, meta


@pytest.mark.parametrize("folder", CANDIDATES, ids=lambda p: p.name)
def test_honest_candidate_passes_and_is_timed(folder, settings, executor):
    outcome, _ = _verify(folder, settings, executor)
    assert outcome.test.status == "passed", outcome.test.reason
    assert outcome.test.trials == settings.correctness_trials
    timing = outcome.timing
    assert timing.status == "passed", timing.reason
    assert timing.candidate_ms and timing.candidate_ms > 0
    assert timing.eager_ms and timing.eager_ms > 0
    assert timing.compile_ms and timing.compile_ms > 0
    assert timing.runs == settings.timing_runs
    assert timing.device


def test_cubin_from_nvcc_is_used(settings, executor):
    from stitch_graph.toolchain.nvcc import nvcc_compile

    candidate, meta = load_candidate_dir(HEALTHY)
    compiled = nvcc_compile(
        candidate.kernel_source,
        arch=settings.gpu_arch,
        mode="cubin",
        work_dir=str(Path(settings.work_dir) / "nvcc"),
    )
    assert compiled.ok, compiled.log
    outcome = verify_candidate(
        _task(meta["problem"]), candidate, settings, executor=executor, compile_result=compiled
    )
    assert outcome.test.status == "passed", outcome.test.reason


@pytest.mark.parametrize("folder", FAULTY, ids=lambda p: p.name)
def test_faulty_candidate_is_caught_and_next_one_passes(folder, settings, executor):
    quick = dataclasses.replace(settings, timeout_s=12.0)
    outcome, meta = _verify(folder, quick, executor)
    expect = meta["expect"]
    assert outcome.test.status == expect["status"], outcome.test
    assert re.search(expect["reason"], outcome.test.reason), outcome.test.reason
    assert outcome.timing.status != "passed"
    healthy, _ = _verify(HEALTHY, settings, executor)
    assert healthy.test.status == "passed", healthy.test.reason


def _generated_conv() -> tuple:
    """A rule-generated program whose convolution goes through cuDNN."""
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    task = load_task(str(ROOT / "problems" / "conv" / "02_conv2d_bias_bn_relu.py"))
    ir = capture_program(task)
    return emit_candidate(ir, plan_program(ir)), task


@pytest.mark.parametrize("which", ["example", "generated_cudnn_conv"])
def test_exported_model_runs_standalone(tmp_path, settings, which):
    if which == "example":
        candidate, meta = load_candidate_dir(HEALTHY)
        task = _task(meta["problem"])
    else:
        candidate, task = _generated_conv()
        assert "KERNELS.conv(" in candidate.host_source
    (tmp_path / "model_new.py").write_text(export_kernelbench(candidate, task))
    (tmp_path / "problem.py").write_text(task.source)
    script = tmp_path / "kernelbench_style.py"
    script.write_text(
        "import json, torch\n"
        "torch.backends.cudnn.allow_tf32 = False  # FP32 on both sides\n"
        "ref_ns, new_ns = {}, {}\n"
        "exec(open('problem.py').read(), ref_ns)\n"
        "exec(open('model_new.py').read(), new_ns)\n"
        "assert 'stitch_graph' not in __import__('sys').modules\n"
        "init = ref_ns['get_init_inputs']()\n"
        "torch.manual_seed(0); ref = ref_ns['Model'](*init).cuda()\n"
        "torch.manual_seed(0); new = new_ns['ModelNew'](*init).cuda()\n"
        "x = [t.cuda() for t in ref_ns['get_inputs']()]\n"
        "with torch.no_grad():\n"
        "    a, b = ref(*x), new(*x)\n"
        "ok = torch.allclose(a, b, atol=1e-4, rtol=1e-4)\n"
        "print(json.dumps({'ok': ok, 'max_abs': (a - b).abs().max().item()}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"]


def test_reference_timeline_has_hotspots(settings, executor):
    task = _task(str(ROOT / "examples" / "problems" / "layer_norm.py"))
    report = reference_timeline(task, settings, executor=executor)
    print(report.model_dump())
    assert report.status == "passed", report.reason
    assert report.hotspots and report.hotspots[0].cuda_time_us > 0
    times = [h.cuda_time_us for h in report.hotspots]
    assert times == sorted(times, reverse=True)


def test_a_deferred_compile_baseline_is_warmed_beside_a_candidate_and_timed_last(
    tmp_path, executor
):
    """The reference worker times eager only; the warm-up compiles while a candidate runs on
    the GPU's slot; the baseline then compiles from warm caches and times torch.compile."""
    from stitch_graph.execution.reference import complete_compile_baseline, ensure_reference

    settings = RunSettings(work_dir=str(tmp_path), timeout_s=60.0)
    candidate, meta = load_candidate_dir(HEALTHY)
    task = _task(meta["problem"])
    reference = ensure_reference(task, settings, executor=executor, defer_compile=True)
    assert reference.meta["eager_ms"] > 0 and "compile_ms" not in reference.meta
    outcome = verify_candidate(task, candidate, settings, executor=executor)
    assert outcome.test.status == "passed" and outcome.timing.compile_ms is None
    done = complete_compile_baseline(task, settings, executor=executor)
    print({k: v for k, v in done.meta.items() if k.startswith("compile")})
    assert done.meta["compile_warmup"]["status"] == "ok", done.meta["compile_warmup"]
    assert done.meta["compile_ms"] > 0, done.meta.get("compile_error")
    later = verify_candidate(task, candidate, settings, executor=executor)
    assert later.timing.compile_ms == done.meta["compile_ms"]


def test_ncu_profiles_candidate_kernels(settings, executor):
    candidate, meta = load_candidate_dir(HEALTHY)
    report = profile_candidate(_task(meta["problem"]), candidate, settings, executor=executor)
    print(report.model_dump())
    assert report.status == "passed", report.reason
    assert any("add_relu" in k.name for k in report.kernels)


def test_work_left_on_a_side_stream_is_caught_by_the_timer():
    import torch

    from stitch_graph.execution.timing import escaped, time_cuda

    side = torch.cuda.Stream()

    def on_side_stream():
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)  # about a millisecond of GPU time

    hidden = time_cuda(on_side_stream, warmup=1, runs=5)
    assert escaped(hidden), hidden
    honest = time_cuda(lambda: torch.cuda._sleep(2_000_000), warmup=1, runs=5)
    assert not escaped(honest), honest
    assert honest["median_ms"] > 0.3


def test_a_slow_call_is_timed_fewer_times_under_a_time_cap():
    import torch

    from stitch_graph.execution.timing import time_cuda

    def slow():
        torch.cuda._sleep(60_000_000)  # tens of milliseconds

    capped = time_cuda(slow, warmup=1, runs=20, max_s=0.05)
    assert capped["runs"] == 3  # the floor, each run being past the cap already
    assert capped["median_ms"] > 5
    fast = time_cuda(lambda: torch.cuda._sleep(20_000), warmup=1, runs=20, max_s=0.05)
    assert fast["runs"] == 20
