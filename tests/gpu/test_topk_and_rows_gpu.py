"""Two kernel layouts on a real GPU, each matched against PyTorch at 1e-4 (TF32 off) on three
draws and timed in turns in one process against the layout it replaced:

- a top-k of a few long lines cut into chunks of a block each (``_emit_sort._topk_chunks``),
  against a block a line;
- a linear over a sequence-first view of a batch-first activation as 8 GEMMs of 256 rows
  (``ir.rows_layout``), against 256 GEMMs of 8 rows: no slower (both are one strided-batched
  call)."""

from __future__ import annotations

import pytest

from tests.gpu.test_codegen_layouts_gpu import _matched_then_timed

pytestmark = pytest.mark.gpu

_TOPK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, scores):
        values, index = torch.topk(scores.flatten(1), 300, dim=1)
        return torch.sigmoid(values), index


def get_inputs():
    return [torch.randn(8, 80, 8400)]


def get_init_inputs():
    return []
"""

_SEQUENCE_FIRST = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(512, 1024)

    def forward(self, x):
        return torch.relu(self.proj(x.transpose(0, 1)))


def get_inputs():
    return [torch.randn(8, 256, 512)]


def get_init_inputs():
    return []
"""


def test_a_top_k_of_few_long_lines_in_chunks_beats_a_block_a_line() -> None:
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.codegen.tuning import KernelTuning, Tuning
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_TOPK))
    plan = plan_program(ir)
    split = emit_candidate(ir, plan)
    whole = emit_candidate(ir, plan, tuning=Tuning(default=KernelTuning(split_reduction=False)))
    assert "first stage" in split.kernel_source and "first stage" not in whole.kernel_source
    ours, theirs = _matched_then_timed(_TOPK, split, whole)
    print(f"top 300 of 8 x 672000: chunks {ours:.4f} ms, a block a line {theirs:.4f} ms "
          f"({theirs / ours:.2f}x)")
    assert ours * 2.0 < theirs
    ours, eager = _matched_then_timed(_TOPK, split)
    print(f"  against eager: {ours:.4f} ms, {eager:.4f} ms ({eager / ours:.2f}x)")


def test_sequence_first_rows_are_a_few_tall_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitch_graph.codegen import _emit_gemm, capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_SEQUENCE_FIRST))
    tall = emit_candidate(ir, plan_program(ir))
    assert ", 8)" in tall.host_source.split("_sgemm(", 2)[2].split("\n")[0]
    monkeypatch.setattr(_emit_gemm, "rows_layout", lambda *args: None)
    short = emit_candidate(ir, plan_program(ir))
    assert ", 256)" in short.host_source.split("_sgemm(", 2)[2].split("\n")[0]
    ours, theirs = _matched_then_timed(_SEQUENCE_FIRST, tall, short)
    print(f"linear over x.transpose(0, 1): 8 GEMMs {ours:.4f} ms, 256 GEMMs {theirs:.4f} ms "
          f"({theirs / ours:.2f}x)")
    assert ours < theirs
    ours, eager = _matched_then_timed(_SEQUENCE_FIRST, tall)
    print(f"  against eager: {ours:.4f} ms, {eager:.4f} ms ({eager / ours:.2f}x)")
