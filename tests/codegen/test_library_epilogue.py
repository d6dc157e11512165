"""A library anchor whose only reader is a row kernel hands it its bias and epilogue.

``conv -> softmax``, ``conv -> group_norm``, ``linear -> * scale -> layer_norm``: cuDNN or cuBLAS
writes its result once, and the row kernel adds the bias (and runs the rest of the epilogue) as it
loads, instead of a pointwise kernel reading and writing the whole result in between. Such row
ops over the channels of NCHW read strided rows: many short ones take a thread each. Checked on
the CPU against PyTorch, and compiled with nvcc where it is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _emit_softmax_norm, capture_program, plan_program
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = {layer}
        self.norm = {norm}
        self.scale = nn.Parameter(torch.randn({channels}))

    def forward(self, x):
{body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

CASES = {
    "conv_softmax": (
        "nn.Conv2d(3, 8, 3)",
        "None",
        "return torch.softmax(self.layer(x), dim=1)",
        (2, 3, 9, 9),
        8,
    ),
    "conv3d_relu_group_norm": (
        "nn.Conv3d(2, 8, 3)",
        "nn.GroupNorm(4, 8)",
        "return self.norm(torch.relu(self.layer(x)))",
        (2, 2, 5, 6, 6),
        8,
    ),
    "linear_scale_layer_norm": (
        "nn.Linear(32, 24)",
        "nn.LayerNorm(24)",
        "return self.norm(self.layer(x) * self.scale)",
        (16, 32),
        24,
    ),
    "conv_transpose_max_pool": (
        "nn.ConvTranspose2d(4, 6, 3, stride=2)",
        "nn.MaxPool2d(2)",
        "return self.norm(self.layer(x) - 0.5)",
        (2, 4, 5, 5),
        6,
    ),
}


def _source(name: str) -> str:
    layer, norm, body, shape, channels = CASES[name]
    lines = "\n".join(f"        {line}" for line in body.splitlines())
    return _PROBLEM.format(
        layer=layer, norm=norm, body=lines, shape=", ".join(map(str, shape)), channels=channels
    )


@pytest.mark.parametrize("name", list(CASES))
def test_the_row_kernel_adds_the_bias_as_it_loads(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_source(name))
    plan = plan_program(capture_program(task))
    library, row = plan.items[0], plan.items[1]
    assert library.kind in ("conv", "gemm") and library.ops == [library.ops[0]]
    assert library.ops[0].endswith("_nobias")
    assert "prologue add" in row.fusion, row.fusion
    assert not program.declared_torch_ops
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    # the library call, then straight into the row kernel: no pointwise pass in between
    assert not any(k.startswith("k0_") for k in kernels.launched), kernels.launched


def test_a_second_reader_keeps_the_bias_with_the_library_call() -> None:
    source = _source("conv_softmax").replace(
        "return torch.softmax(self.layer(x), dim=1)",
        "y = self.layer(x)\n        return torch.softmax(y, dim=1) + y",
    )
    ir = capture_program(load_task(source, run_reference=False))
    conv = next(n for n in ir.nodes if n.op == "conv2d")
    assert conv.args["bias"] is not None and not conv.name.endswith("_nobias")


@pytest.mark.parametrize(
    ("name", "tuning", "mode"),
    [
        ("conv_softmax", None, "thread per row"),
        ("conv_softmax", Tuning(default=KernelTuning(rows_per_block=2)), "warp per row"),
    ],
)
def test_many_short_strided_rows_take_a_thread_each(
    name: str, tuning: Tuning | None, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_emit_softmax_norm, "_THREAD_ROWS", 16)  # what a CPU check can afford
    task, program = generate_checked(_source(name), tuning)
    assert f"row(s) of 8, {mode}" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)



_CAUSAL = """
import math
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        mask = torch.tril(torch.ones(12, 12)).view(1, 1, 12, 12)
        self.register_buffer("bias", mask, persistent=False)  # not perturbed by the check

    def forward(self, q, k):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        t = q.size(2)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return torch.softmax(att, dim=-1)


def get_inputs():
    return [torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)]


def get_init_inputs():
    return []
"""


def test_a_causal_mask_from_a_buffer_runs_on_the_softmax_load(tmp_path: Path) -> None:
    """The mask is a smaller tensor broadcast into the scores and read from a buffer: the GEMM
    writes its product once, and the softmax scales and masks it as it loads."""
    task, program = generate_checked(_CAUSAL)
    plan = plan_program(capture_program(task))
    softmax = next(i for i in plan.items if "softmax" in i.ops)
    assert {"mul", "eq", "masked_fill"} <= set(softmax.ops)
    check_on_cpu(task, program, tmp_path, cooperative=True)
