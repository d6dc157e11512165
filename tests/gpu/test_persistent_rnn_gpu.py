"""A small LSTM's every time step in one kernel (W_hh in registers), on a real GPU: the program
matches PyTorch at 1e-4 (TF32 off) on three draws and is timed in turns, in one process,
against the same program with a launch a step (``rnn_persistent=False``); tuned, it is at
eager PyTorch's (cuDNN's RNN) speed."""

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


def test_a_tuned_recurrent_layer_is_at_eager_speed(tmp_path) -> None:
    """The persistent kernel and cuDNN's RNN (a declared library anchor) are timed against each
    other; the faster one is at eager's speed, within the timings' noise."""
    from stitch_graph.codegen import capture_program, plan_program
    from stitch_graph.execution.autotune import TuningCache, tune_program
    from stitch_graph.task import load_task

    task = load_task(_LSTM)
    ir = capture_program(task)
    tuned, _, _ = tune_program(
        task, ir, plan_program(ir), cache=TuningCache(tmp_path), budget_s=20.0
    )
    ours, eager = _matched_then_timed(_LSTM, tuned)
    on_cudnn = "lstm" in tuned.declared_torch_ops
    print(f"LSTM tuned ({'cuDNN' if on_cudnn else 'one kernel a layer'}) {ours:.3f} ms, "
          f"eager (cuDNN) {eager:.3f} ms ({eager / ours:.2f}x)")
    assert ours <= eager * 1.05
