"""Scans on a real GPU, matched against PyTorch on the same device:

- a warp scanning a line 128 elements a step as four runs of 32 (``_warp_scan4``), a float
  ``cumsum`` carrying in double, against steps of 32: no slower, and at least as close to
  float64 as PyTorch's own ``cumsum``;
- the indices of ``cummax`` and ``cummin`` with ties and NaN, and ``histc``, exactly as
  PyTorch's CUDA kernels give them."""

from __future__ import annotations

import pytest

from tests.gpu.test_codegen_layouts_gpu import _matched_then_timed, _matches_pytorch, _on_the_gpu

pytestmark = pytest.mark.gpu

_LONG_CUMSUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.rand(4096, 8192)]


def get_init_inputs():
    return []
"""

_INDEXED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        r = (x * 2).round()  # ties
        r[0, 3] = float("nan")
        _, up = torch.cummax(r, dim=-1)
        _, down = torch.cummin(r, dim=0)
        wide = torch.histc(x, bins=37)
        narrow = torch.histc(torch.tanh(x), bins=11, min=-0.5, max=0.5)
        return up, down, wide, narrow


def get_inputs():
    return [torch.randn(64, 1000)]


def get_init_inputs():
    return []
"""


def _generated(source: str, tuning=None):  # noqa: ANN001, ANN202
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    ir = capture_program(load_task(source))
    return emit_candidate(ir, plan_program(ir), tuning=tuning)


def test_a_warp_scans_four_runs_no_slower_and_closer_to_float64() -> None:
    import torch

    from stitch_graph.codegen.tuning import KernelTuning, Tuning

    runs = _generated(_LONG_CUMSUM)
    steps = _generated(_LONG_CUMSUM, Tuning(default=KernelTuning(vector_width=1)))
    assert "four runs of 32" in runs.kernel_source
    assert "32 elements a step" in steps.kernel_source
    ours, theirs = _matched_then_timed(_LONG_CUMSUM, runs, steps)
    print(f"cumsum of 4096 x 8192: four runs {ours:.4f} ms, steps of 32 {theirs:.4f} ms "
          f"({theirs / ours:.2f}x)")
    assert ours <= theirs * 1.05
    namespace, reference, model = _on_the_gpu(_LONG_CUMSUM, runs)
    torch.manual_seed(0)
    x = namespace["get_inputs"]()[0].cuda()
    exact = torch.cumsum(x.double(), dim=1)
    with torch.no_grad():
        ours_err = (model(x).double() - exact).abs().max().item()
        eager_err = (reference(x).double() - exact).abs().max().item()
    print(f"  from float64: ours {ours_err:.2e}, PyTorch {eager_err:.2e}")
    assert ours_err <= eager_err


def test_cummax_indices_and_histc_match_pytorch_exactly() -> None:
    program = _generated(_INDEXED)
    assert not program.declared_torch_ops, program.declared_torch_ops
    _matches_pytorch(_INDEXED, program)
