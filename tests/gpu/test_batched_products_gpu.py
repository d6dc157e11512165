"""A recurrent loop's products batched (``_capture_batched_products``), on a real GPU: the
program matches PyTorch at 1e-4 (TF32 off) on three draws and is timed in turns, in one
process, against the program captured in the reference's order (``exact_order``), which keeps
each step's concatenation and both of its products."""

from __future__ import annotations

import pytest

from tests.gpu.test_codegen_layouts_gpu import _matched_then_timed

pytestmark = pytest.mark.gpu

_LOOP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(512 + 256, 256)
        self.h2o = nn.Linear(256, 128)

    def forward(self, x, h):
        outputs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.i2h(torch.cat((x[t], h), dim=1)))
            outputs.append(self.h2o(h))
        return torch.stack(outputs, dim=0)


def get_inputs():
    return [torch.rand(64, 8, 512), torch.rand(8, 256)]


def get_init_inputs():
    return []
"""


def test_a_loop_with_its_products_batched_beats_the_loop_as_written() -> None:
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    task = load_task(_LOOP)
    programs = []
    for exact in (False, True):
        ir = capture_program(task, exact_order=exact)
        programs.append(emit_candidate(ir, plan_program(ir)))
    batched, as_written = programs
    assert batched.kernel_source.count("__global__") < as_written.kernel_source.count("__global__")
    ours, theirs = _matched_then_timed(_LOOP, batched, as_written)
    print(f"RNN loop: products batched {ours:.3f} ms, as written {theirs:.3f} ms "
          f"({theirs / ours:.2f}x)")
    assert theirs >= 1.2 * ours
