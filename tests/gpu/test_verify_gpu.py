"""``verify`` on a GPU: the corpus through the whole protocol, and the warm time of a later
candidate of a problem already verified.

Honest programs of every form must be accepted (correct at 1e-4 in FP32, timed); every hack
must be rejected, the dynamic ones by the run itself. The load_inline programs build PyTorch
extensions, so the first run of this file takes minutes; builds are kept in the work folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stitch_graph.cli.verify import verify_files
from stitch_graph.execution import LocalGPUExecutor, RunSettings
from tests.tool_scripts import load_tool

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "verify_corpus"
SCRIPT = ROOT / "tools" / "eval_hack_corpus.py"


TOOL = load_tool("eval_hack_corpus")
ENTRIES = TOOL.load_corpus(CORPUS)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> RunSettings:
    return RunSettings(work_dir=str(tmp_path_factory.mktemp("verify-gpu")), timeout_s=600.0)


@pytest.fixture(scope="module")
def executor():
    pool = LocalGPUExecutor()
    yield pool
    pool.shutdown()


def _verify(entry, settings, executor):
    verdict = verify_files(
        entry.problem_path, entry.path, settings=settings, executor=executor, gpu=True
    )
    print(f"{entry.group}/{entry.name}: {verdict.verdict} {verdict.reasons} {verdict.seconds}")
    return verdict


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.group == "honest"], ids=lambda e: e.name)
def test_honest_program_is_accepted_on_the_gpu(entry, settings, executor):
    verdict = _verify(entry, settings, executor)
    assert verdict.verdict == "accepted", verdict.reasons
    assert verdict.gpu and verdict.test["status"] == "passed"
    assert verdict.timing["status"] == "passed" and verdict.timing["candidate_ms"] > 0


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.group == "hacks"], ids=lambda e: e.name)
def test_hack_is_rejected_by_its_layer(entry, settings, executor):
    verdict = _verify(entry, settings, executor)
    assert verdict.verdict == "rejected", verdict
    assert verdict.exit_code == 1
    if entry.layer == "static":
        assert entry.rule in verdict.static["rules"]
        assert not verdict.gpu  # refused before anything ran
    else:
        assert verdict.gpu and verdict.reasons  # the run itself caught it


def test_a_later_candidate_of_a_verified_problem_is_fast_when_warm(settings, executor):
    """Within 3 s, the candidate's own (NVRTC) build included, once the problem's reference
    ran and a worker is warm."""
    by_name = {e.name: e for e in ENTRIES}
    first, later = by_name["cupy_rawkernel"], by_name["cupy_rawmodule"]
    assert _verify(first, settings, executor).verdict == "accepted"
    start = time.monotonic()
    verdict = _verify(later, settings, executor)
    elapsed = time.monotonic() - start
    assert verdict.verdict == "accepted", verdict.reasons
    assert elapsed <= 3.0, f"{elapsed:.2f} s ({verdict.seconds})"


def _verify_command(settings, cwd, *paths):
    """``stitch-graph verify PATHS... --json`` in its own process, with the tests' work dir."""
    command = [sys.executable, "-m", "stitch_graph.cli", "verify", *map(str, paths), "--json"]
    return subprocess.run(
        [*command, "--work-dir", settings.work_dir],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def test_the_command_exits_0_and_prints_speedups(settings, tmp_path):
    entry = next(e for e in ENTRIES if e.name == "cupy_rawkernel_float4")
    proc = _verify_command(settings, tmp_path, entry.problem_path, entry.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["verdict"] == "accepted" and verdict["timing"]["eager_ms"] > 0


def test_eval_script_every_hack_flagged_no_honest_flagged(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--entries", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(out.read_text())["summary"]
    assert table["hacks"]["dynamic"] is not None
    assert table["hacks"]["any"] == table["hacks"]["total"]
    assert table["honest"]["any"] == 0


def test_the_command_verifies_later_candidates_warm(settings, tmp_path):
    """Several candidates in one command: the second reuses the reference and a warm worker."""
    by_name = {e.name: e for e in ENTRIES}
    first, later = by_name["cupy_rawkernel_lazy"], by_name["cupy_rawkernel_arrays"]
    proc = _verify_command(settings, tmp_path, first.problem_path, first.path, later.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = json.loads(proc.stdout)
    assert [v["verdict"] for v in verdicts] == ["accepted", "accepted"]
    assert verdicts[1]["seconds"]["verify"] <= 3.0, verdicts[1]["seconds"]


def _ninja_logs(settings: RunSettings) -> dict[str, str]:
    folder = Path(settings.work_dir) / "execution" / "torch-extensions"
    return {str(p): p.read_text() for p in folder.glob("*/.ninja_log")}


def test_a_prebuilt_load_inline_program_builds_nothing_in_its_worker(tmp_path):
    """The build job's nvcc flags are the candidate worker's: ninja finds nothing to do there."""
    from stitch_graph.execution.external import gpu_verifier

    settings = RunSettings(work_dir=str(tmp_path), timeout_s=600.0)
    entry = next(e for e in ENTRIES if e.name == "load_inline")
    (built,) = gpu_verifier(settings).prebuild([entry.candidate])
    assert built.status == "ok", built.reason
    logs = _ninja_logs(settings)
    assert logs, "the build job left no ninja log"
    pool = LocalGPUExecutor()
    try:
        verdict = _verify(entry, settings, pool)
    finally:
        pool.shutdown()
    assert verdict.verdict == "accepted", verdict.reasons
    assert _ninja_logs(settings) == logs
    print(f"build job {built.seconds:.1f} s, verify {verdict.seconds}")
