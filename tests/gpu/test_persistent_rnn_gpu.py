"""A small LSTM's every time step in one kernel (W_hh in registers), on a real GPU: the program
matches PyTorch at 1e-4 (TF32 off) on three draws and is timed in turns, in one process,
against the same program with a launch a step (``rnn_persistent=False``), and against eager
PyTorch (cuDNN's RNN)."""

from __future__ import annotations

import pytest

from tests.gpu.test_codegen_layouts_gpu import _matched_then_timed

pytestmark = pytest.mark.gpu

_LSTM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def get_inputs():
    return [torch.randn(16, 50, 32)]


def get_init_inputs():
    return []
"""


def test_every_step_in_one_kernel_beats_a_launch_a_step() -> None:
    from stitch_graph.codegen import (
        KernelTuning,
        Tuning,
        capture_program,
        emit_candidate,
        plan_program,
    )
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_LSTM))
    plan = plan_program(ir)
    persistent = emit_candidate(ir, plan)
    stepped = emit_candidate(ir, plan, tuning=Tuning(default=KernelTuning(rnn_persistent=False)))
    assert "_seq(" in persistent.host_source and "_step(" in stepped.host_source
    ours, theirs = _matched_then_timed(_LSTM, persistent, stepped)
    print(f"LSTM 2 x 50 steps, hidden 64: one kernel a layer {ours:.3f} ms, a launch a step "
          f"{theirs:.3f} ms ({theirs / ours:.2f}x)")
    assert theirs >= 1.5 * ours
    ours, eager = _matched_then_timed(_LSTM, persistent)
    print(f"  against eager (cuDNN): {ours:.3f} ms, {eager:.3f} ms ({eager / ours:.2f}x)")
    assert eager >= ours  # a recurrent layer at least at eager's speed
