"""LSTM, GRU and Elman RNN layers generated as cuBLAS GEMMs plus one kernel for every time step
(W_hh held in registers) or one gate kernel a time step.

Every case runs the generated program on the CPU (kernels under g++, the GEMMs emulated with
cuBLAS's column-major arguments) against PyTorch's own ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN``:
multi-layer, bidirectional, batch-first or time-first, with and without biases, every output
returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import (
    KernelTuning,
    Tuning,
    capture_program,
    emit_candidate,
    plan_program,
)
from stitch_graph.codegen._rnn_fit import persistent_fit as _persistent_fit
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.{cls}(4, 6, {layers}, bias={bias}, batch_first={batch_first},
                            bidirectional={bidirectional}, dropout={dropout})

    def forward(self, x{state_args}):
        {body}


def get_inputs():
    x = torch.randn({x_shape})
    return [x{state_inputs}]


def get_init_inputs():
    return []
"""


def _problem(cls: str, *, layers: int = 2, bias: bool = True, batch_first: bool = True,
             bidirectional: bool = False, dropout: float = 0.0, given_state: bool = True,
             body: str = "return self.rnn(x{hx})[0]") -> str:
    dirs = 2 if bidirectional else 1
    x_shape = "3, 5, 4" if batch_first else "5, 3, 4"
    state = ["h0", "c0"] if cls == "LSTM" else ["h0"]
    hx = ""
    if given_state:
        hx = ", (h0, c0)" if cls == "LSTM" else ", h0"
    return _PROBLEM.format(
        cls=cls, layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
        dropout=dropout, x_shape=x_shape, body=body.format(hx=hx),
        state_args="".join(f", {s}" for s in state) if given_state else "",
        state_inputs="".join(f", torch.randn({layers * dirs}, 3, 6)" for _ in state)
        if given_state else "",
    )


CASES = {  # name: (problem, layers x directions)
    "lstm_two_layers": (_problem("LSTM"), 2),
    "lstm_bidirectional_all_outputs": (_problem(
        "LSTM", bidirectional=True, body="out, (h, c) = self.rnn(x{hx})\n        return out, h, c"),
        4),
    "lstm_time_first_no_bias": (_problem("LSTM", batch_first=False, bias=False, layers=1), 1),
    "lstm_zero_state": (_problem("LSTM", given_state=False, body="return self.rnn(x)[1][1]"), 2),
    "gru_two_layers_time_first": (_problem("GRU", batch_first=False), 2),
    "gru_bidirectional_hidden": (_problem("GRU", bidirectional=True, layers=3,
                                          body="return self.rnn(x{hx})[1]"), 6),
    "gru_no_bias": (_problem("GRU", bias=False), 2),
    "rnn_tanh_two_layers": (_problem("RNN"), 2),
    "rnn_relu_bidirectional_time_first": (_problem(
        "RNN", batch_first=False, bidirectional=True, body="return self.rnn(x{hx})[1]"
    ).replace("dropout=0.0)", "dropout=0.0, nonlinearity='relu')"), 4),
}


VARIANTS = {  # name: the tuning
    "persistent": KernelTuning(),
    "fused_step": KernelTuning(rnn_persistent=False),
    "sgemm_step": KernelTuning(fuse=False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(CASES))
def test_rnn_matches_pytorch(name: str, variant: str, tmp_path: Path) -> None:
    source, layers = CASES[name]
    task, program = generate_checked(source, Tuning(default=VARIANTS[variant]))
    assert not program.declared_torch_ops, program.notes
    host = program.host_source
    kernel = "_seq" if variant == "persistent" else "_step"
    assert f"{kernel}(" in host and ("_step(" in host) != (variant == "persistent")
    # fused: the hidden projection is computed in the step kernel, no SGEMM inside the loop
    if variant != "persistent":
        assert ("_sgemm(1, 0, " in host.split("for _")[-1]) != (variant == "fused_step")
    kernels = check_on_cpu(task, program, tmp_path, cooperative=variant != "sgemm_step")
    launches = len([k for k in kernels.launched if k.endswith(kernel)])
    assert launches == (1 if variant == "persistent" else 5) * layers  # 5 steps


@pytest.mark.parametrize("name", list(CASES))
def test_the_cudnn_anchor_leaves_the_layer_to_pytorch_declared(name: str, tmp_path: Path) -> None:
    """``rnn_library``: the layer is PyTorch's own RNN (cuDNN on a GPU), declared, and the
    program still matches; the tuner takes it only by time. PyTorch returns a batch-first
    layer's output as a transposed view, which the kernels after it read as dense: the host
    makes it so (every batch-first case here was wrong before)."""
    source, _ = CASES[name]
    task = load_task(source)
    ir = capture_program(task)
    plan = plan_program(ir)
    program = emit_candidate(ir, plan, tuning=Tuning(default=KernelTuning(rnn_library=True)))
    op = {"gru": "gru", "lst": "lstm"}.get(name[:3]) or ("rnn_relu" if "relu" in name else "rnn_tanh")
    assert op in program.declared_torch_ops and "_step(" not in program.host_source
    # its weights reach cuDNN as one buffer (PyTorch would compact separate ones every call)
    mode = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}[op]
    assert f"torch.{op}(" in program.host_source
    assert "KERNELS.rnn_weights([_get(self, 'rnn.weight_ih_l0'), " in program.host_source
    assert f"], {mode}, 4, 6, " in program.host_source
    check_on_cpu(task, program, tmp_path)


def test_dropout_between_layers_in_training_stays_in_pytorch() -> None:
    source = _problem("LSTM", dropout=0.5).replace("super().__init__()",
                                                    "super().__init__()\n        self.train()")
    task = load_task(source)
    ir = capture_program(task)
    plan = plan_program(ir)
    assert any("dropout between layers" in reason for reason in plan.unsupported_ops)
    assert "lstm" in emit_candidate(ir, plan).declared_torch_ops


def test_a_strided_input_and_state_are_copied_and_generated(tmp_path: Path) -> None:
    source = _problem("GRU", body="return self.rnn(x.transpose(0, 1).contiguous().transpose(0, 1)"
                                  ", h0.transpose(1, 2).contiguous().transpose(1, 2))[0]")
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_plan_asks_for_graph_replay() -> None:
    ir = capture_program(load_task(CASES["gru_two_layers_time_first"][0]))
    plan = plan_program(ir)
    assert plan.host.cuda_graph
    assert [item.kind for item in plan.items if "gru" in item.ops] == ["gemm"]


def test_a_state_left_at_its_default_is_not_an_input(tmp_path: Path) -> None:
    source = _problem("GRU", given_state=False,
                      body="if h0 is None:\n            h0 = torch.zeros(2, 3, 6, device=x.device)"
                           "\n        return self.rnn(x, h0)[0]").replace(
        "def forward(self, x)", "def forward(self, x, h0=None)")
    task, program = generate_checked(source)
    assert "def forward(self, x):" in program.host_source
    # traced by fx with the default as a constant, not by torch.export through the steps
    assert capture_program(task).method == "fx"
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_the_persistent_kernel_fits_w_hh_in_registers_or_steps_are_launched() -> None:
    # (lanes a hidden unit, threads, batch rows a block)
    assert _persistent_fit(4, 64, 16, 0) == (8, 512, 1)  # 4 x 8 weights a thread
    assert _persistent_fit(4, 64, 300, 0) == (8, 512, 3)
    assert _persistent_fit(1, 128, 10, 0) == (4, 512, 1)
    assert _persistent_fit(1, 256, 10, 0) is None  # 64K weights: the whole register file
    assert _persistent_fit(4, 256, 10, 0) is None  # KernelBench L3's LSTMs: a launch a step
    assert _persistent_fit(3, 64, 1000, 0) is None  # eight batch rows a block


@pytest.mark.parametrize(("cls", "hidden", "split"), [
    ("GRU", 40, "3 x 10 weights a thread, 4"),
    ("LSTM", 40, "4 x 5 weights a thread, 8"),
    ("LSTM", 33, "4 x 5 weights a thread, 8"),  # 8 x 5 lanes: rows padded from 33 to 40
])
def test_a_hidden_unit_split_over_threads_and_two_batch_rows_a_block(
    cls: str, hidden: int, split: str, tmp_path: Path
) -> None:
    source = _problem(cls, bidirectional=True).replace(f"nn.{cls}(4, 6",
                                                       f"nn.{cls}(4, {hidden}")
    source = source.replace("3, 6)", f"3, {hidden})")
    task, program = generate_checked(source, Tuning(default=KernelTuning(rows_per_block=2)))
    assert "2 batch row(s) a block" in program.kernel_source
    assert f"({split} thread(s) a hidden unit)" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len([k for k in kernels.launched if k.endswith("_seq")]) == 4


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_an_lstm_with_projections_reaches_cudnn_with_its_weights_in_one_buffer(
    tmp_path: Path,
) -> None:
    """``proj_size`` is left to PyTorch; its weights (``weight_hr`` last in each layer) are
    still laid out once for cuDNN, which would otherwise compact them on every call."""
    source = _problem("LSTM").replace("dropout=0.0)", "dropout=0.0, proj_size=3)")
    source = source.replace("torch.randn(2, 3, 6), torch.randn(2, 3, 6)",
                            "torch.randn(2, 3, 3), torch.randn(2, 3, 6)")
    task = load_task(source)
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir))
    assert "lstm" in program.declared_torch_ops
    assert "_get(self, 'rnn.weight_hr_l1')], 2, 4, 6, 2, True, False, True, 3)" in (
        program.host_source
    )
    check_on_cpu(task, program, tmp_path)
