"""Prebuilt ``load_inline`` extensions: built in a job of their own, found by the candidate's worker.

The real test builds a C++ extension with g++ and ninja (about 45 s on two cores) and checks,
by ninja's log, that the candidate worker that verifies the file afterwards builds nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.artifacts import Task
from stitch_graph.execution import LocalGPUExecutor, RunSettings, verify_candidate
from stitch_graph.execution.external import external_candidate, gpu_verifier
from stitch_graph.execution.prebuild import builds_extensions, prebuild_external
from tests.execution.cpu_programs import HOST, PROBLEM

EXTENSION_FILE = (
    """
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor relu_copy(torch::Tensor x) { return torch::clamp_min(x, 0); }"
ext = load_inline(name="sg_prebuild_relu", cpp_sources=CPP, functions=["relu_copy"])
"""
    + HOST.format(body="        return ext.relu_copy(self.lin(x))")
)


def _ninja_log(settings: RunSettings) -> list[str]:
    logs = list((settings.root() / "torch-extensions").glob("sg_prebuild_relu*/.ninja_log"))
    assert len(logs) == 1, logs
    return logs[0].read_text().splitlines()


def test_only_external_files_that_build_an_extension_are_prebuilt():
    assert builds_extensions(external_candidate(EXTENSION_FILE))
    assert not builds_extensions(external_candidate("import cupy\nclass ModelNew: pass\n"))
    project = external_candidate(EXTENSION_FILE).model_copy(update={"form": "nvrtc"})
    assert not builds_extensions(project)
    assert prebuild_external([external_candidate("class ModelNew: pass\n")]) == []


def test_a_file_that_fails_to_build_is_an_outcome_not_an_exception(tmp_path: Path):
    settings = RunSettings(work_dir=str(tmp_path), timeout_s=60)
    broken = external_candidate(
        "from torch.utils.cpp_extension import load_inline\n"
        "raise RuntimeError('no compiler today')\n"
    )
    (outcome,) = prebuild_external([broken, broken], settings)  # repeats build once
    assert outcome.status == "error"
    assert "no compiler today" in outcome.reason
    assert outcome.digest == broken.digest


def test_the_verifying_worker_loads_the_prebuilt_extension_without_building(tmp_path: Path):
    settings = RunSettings(work_dir=str(tmp_path), timeout_s=300)
    candidate = external_candidate(EXTENSION_FILE)
    (outcome,) = gpu_verifier(settings).prebuild([candidate])
    assert outcome.status == "ok", outcome.reason
    built_log = _ninja_log(settings)
    assert any("sg_prebuild_relu.so" in line for line in built_log)
    pool = LocalGPUExecutor(gpus=[])
    try:
        task = Task(name="lin_relu", source=PROBLEM)
        verdict = verify_candidate(task, candidate, settings, executor=pool, device="cpu")
    finally:
        pool.shutdown()
    assert verdict.test.status == "passed", verdict.test.reason
    assert _ninja_log(settings) == built_log  # ninja ran no step in the candidate's worker


@pytest.mark.parametrize("jobs", [0, 3])
def test_the_build_lands_where_the_candidate_worker_looks_whatever_the_jobs(
    tmp_path: Path, jobs: int
):
    settings = RunSettings(work_dir=str(tmp_path), timeout_s=60)
    marker = tmp_path / "ran"
    source = (
        "import os\nfrom torch.utils import cpp_extension\n"
        f"open({str(marker)!r}, 'w').write(os.environ['TORCH_EXTENSIONS_DIR'])\n"
        "class ModelNew: pass\n"
    )
    (outcome,) = prebuild_external([external_candidate(source)], settings, jobs=jobs)
    assert outcome.status == "ok", outcome.reason
    assert marker.read_text() == str(settings.root() / "torch-extensions")
