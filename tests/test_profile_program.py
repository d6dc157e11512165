"""The ncu report of a generated program: kernels by duration, library against generated time."""

from __future__ import annotations

from tests.tool_scripts import load_tool


def test_kernels_are_ranked_and_library_time_is_split_from_generated(capsys):
    tool = load_tool("profile_program")
    row = {
        "problem": "19_MobileNetV1",
        "status": "passed",
        "bottleneck": "latency",
        "kernels": [
            {"name": "k3_batch_norm_v4", "duration_us": 10.0, "dram_pct": 80.0},
            {"name": "sm80_xmma_fprop_implicit_gemm", "duration_us": 30.0, "sm_pct": 59.0},
            {"name": "cudnn::conv2d_grouped_direct_kernel", "duration_us": 20.0},
        ],
    }
    tool.print_report(row, top=2)
    out = capsys.readouterr().out
    assert "3 kernels, 60.0 us" in out and "library kernels 83%, generated 17%" in out
    lines = out.splitlines()
    assert lines[3].startswith("sm80_xmma") and lines[4].startswith("cudnn::")  # by duration
    assert "k3_batch_norm" not in out.split("limit", 1)[1]  # beyond the top two


def test_a_problem_without_kernels_prints_its_reason(capsys):
    load_tool("profile_program").print_report(
        {"problem": "p", "status": "not_run", "reason": "no GPU"}, top=5
    )
    assert capsys.readouterr().out.strip() == "## p: not_run no GPU"
