"""Pooling windows as fixed, unrolled loops: inside the input, clipped by padding or ceil mode.

A window that never leaves the input loops its fixed count without bounds checks; one that can
reach padding loops the same count and skips what lies outside, while the divisor still follows
PyTorch (``count_include_pad``, ``divisor_override``, ceil-mode windows past the padding).
Windows that slide by one along rows of whole float4s take a thread per four outputs, which
loads their span once. Every case runs the generated program on the CPU against PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x):
        return {call}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

CASES = {
    "avg1d_inside": ("F.avg_pool1d(x, 4, 4)", "2, 3, 16", True),
    "avg1d_padded": ("F.avg_pool1d(x, 8, 1, padding=4)", "2, 3, 20", False),
    "avg1d_padded_excluded": (
        "F.avg_pool1d(x, 5, 2, padding=2, count_include_pad=False)", "2, 3, 17", False
    ),
    "avg2d_inside_uneven": ("F.avg_pool2d(x, 3, 3)", "2, 3, 11, 10", True),
    "avg2d_ceil": ("F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True)", "1, 2, 10, 9", False),
    "avg2d_divisor": ("F.avg_pool2d(x, 2, 2, padding=1, divisor_override=3)", "1, 2, 7, 6", False),
    "avg3d_padded": ("F.avg_pool3d(x, 3, 2, padding=1)", "1, 2, 6, 7, 5", False),
    "max2d_inside": ("F.max_pool2d(x, 2, 2)", "2, 3, 8, 8", True),
    "max2d_padded_dilated": ("F.max_pool2d(x, 3, 2, padding=1, dilation=2)", "1, 2, 11, 9", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pool_windows_match_pytorch(case: str, tmp_path: Path) -> None:
    from stitch_graph.codegen import KernelTuning, Tuning

    call, shape, inside = CASES[case]
    per_output = Tuning(default=KernelTuning(vector_width=1))  # not the sliding kernel below
    task, program = generate_checked(_PROBLEM.format(call=call, shape=shape), per_output)
    assert "#pragma unroll" in program.kernel_source
    # bounds are checked only where a window can leave the input
    assert ("continue;" not in program.kernel_source) == inside
    check_on_cpu(task, program, tmp_path)


# rows of a warp of outputs or more: a block per run of outputs, each window row's input span
# staged in shared memory (the prologue applied on the way in, the epilogue on the way out)
STAGED = {
    "avg1d_overlapping_padded": ("F.avg_pool1d(x, 8, 1, padding=4)", "2, 3, 70"),
    "avg1d_excluded_strided": (
        "F.avg_pool1d(x, 5, 3, padding=2, count_include_pad=False)", "2, 2, 140"
    ),
    "avg2d_wide_window": ("F.avg_pool2d(x, 11)", "1, 2, 23, 400"),
    "avg2d_ceil": ("F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True)", "1, 2, 7, 81"),
    "max1d_dilated_padded": ("F.max_pool1d(x, 8, 1, padding=4, dilation=3)", "2, 3, 60"),
    "max2d_prologue_epilogue": ("torch.sigmoid(F.max_pool2d(torch.relu(x) * 2, 3, 2, 1))", "1, 2, 9, 70"),  # noqa: E501
    "max3d_dilated": ("F.max_pool3d(x, 3, 2, padding=1, dilation=2)", "1, 2, 5, 6, 72"),
    "avg3d_padded": ("F.avg_pool3d(x, 3, 2, padding=1)", "1, 2, 5, 4, 90"),
}


@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("case", sorted(STAGED))
def test_staged_pooling_matches_pytorch(case: str, staged: bool, tmp_path: Path) -> None:
    from stitch_graph.codegen import KernelTuning, Tuning

    call, shape = STAGED[case]
    tuning = Tuning(default=KernelTuning(stage_window=staged))
    task, program = generate_checked(_PROBLEM.format(call=call, shape=shape), tuning)
    assert ("__shared__ float tile[" in program.kernel_source) == staged
    check_on_cpu(task, program, tmp_path, cooperative=True)


# windows sliding by one along rows of whole float4s: a thread per four outputs, their span
# loaded once (float4s inside the row, scalar loads at its ends and when misaligned); over 1-D
# windows a warp's results are stored through shared memory by consecutive lanes
SLIDING = {
    "max1d_dilated_padded": ("F.max_pool1d(x, 8, 1, padding=4, dilation=3)", "2, 3, 64"),
    "avg1d_padded": ("F.avg_pool1d(x, 8, 1, padding=4) * 2", "2, 3, 64"),
    "avg1d_ceil_odd_window": ("F.avg_pool1d(x, 5, 1, padding=2, ceil_mode=True)", "2, 3, 36"),
    "max2d_inception_branch": ("torch.relu(F.max_pool2d(x, 3, 1, 1))", "2, 3, 9, 16"),
    "avg2d_padded": ("F.avg_pool2d(x, 3, 1, 1)", "2, 3, 9, 16"),
    "max3d_dilated": ("F.max_pool3d(x, 3, 1, 1, dilation=(1, 2, 1))", "2, 2, 5, 6, 8"),
    "max1d_unpadded": ("F.max_pool1d(x, 3, 1)", "2, 3, 64"),
}


@pytest.mark.parametrize("case", sorted(SLIDING))
def test_sliding_windows_match_pytorch(case: str, tmp_path: Path) -> None:
    call, shape = SLIDING[case]
    task, program = generate_checked(_PROBLEM.format(call=call, shape=shape))
    assert "windows sliding by one" in program.kernel_source
    assert ("staged in shared memory" in program.kernel_source) == ("1d" in case)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_sliding_windows_read_a_misaligned_input_with_scalar_loads(tmp_path: Path) -> None:
    source = _PROBLEM.format(call="F.max_pool1d(x, 4, 1, padding=2)", shape="2, 3, 64").replace(
        "return [torch.randn(2, 3, 64)]", "return [torch.randn(2 * 3 * 64 + 1)[1:].view(2, 3, 64)]"
    )
    task, program = generate_checked(source)
    assert "windows sliding by one" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_windows_that_do_not_slide_by_one_keep_a_thread_per_output() -> None:
    for call, shape in [
        ("F.max_pool1d(x, 3, 2)", "2, 3, 64"),  # stride 2
        ("F.max_pool1d(x, 3, 1)", "2, 3, 62"),  # rows not whole float4s
        ("F.avg_pool1d(x, 3, 1, 1, count_include_pad=False)", "2, 3, 64"),  # divisor per window
        ("F.max_pool1d(torch.relu(x), 3, 1)", "2, 3, 64"),  # a prologue on the window's loads
    ]:
        _task, program = generate_checked(_PROBLEM.format(call=call, shape=shape))
        assert "windows sliding by one" not in program.kernel_source, call


def test_short_rows_are_not_staged_and_small_inputs_not_by_default() -> None:
    """Fewer than a warp of outputs a row would idle most of a staged block; below 2**31
    input elements the thread-per-output kernel is the default."""
    from stitch_graph.codegen import KernelTuning, Tuning

    short = _PROBLEM.format(call="F.max_pool2d(x, 2)", shape="1, 2, 8, 62")
    _task, program = generate_checked(short, Tuning(default=KernelTuning(stage_window=True)))
    assert "tile[" not in program.kernel_source
    _task, program = generate_checked(_PROBLEM.format(call="F.avg_pool2d(x, 11)", shape="1, 2, 23, 400"))  # noqa: E501
    assert "tile[" not in program.kernel_source
