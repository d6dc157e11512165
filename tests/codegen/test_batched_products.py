"""Products that share a weight and read nothing any of them computes run as one GEMM.

A recurrent cell written as a Python loop: the input's part of the concatenated product is one
GEMM over every step, the output products one GEMM over the stacked states. Each case runs the
generated program in the CPU emulation against PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, plan_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_LOOP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(24 + 16, 16)
        self.h2o = nn.Linear(16, 8)

    def forward(self, x, h):
        outputs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.i2h(torch.cat({pieces}, dim=1)))
            outputs.append(self.h2o(h))
        return {result}


def get_inputs():
    return [torch.randn(6, 4, 24), torch.randn(4, 16)]


def get_init_inputs():
    return []
"""

CASES = {
    "input_first": ("(x[t], h)", "torch.stack(outputs, dim=0)"),
    "state_first": ("(h, x[t])", "torch.stack(outputs, dim=0)"),
    "summed_outputs": ("(x[t], h)", "sum(outputs) + h.sum()"),
}


def _gemms(source: str, **capture: bool) -> list[tuple[int, ...]]:
    ir = capture_program(load_task(source), **capture)
    return [n.shape for n in ir.nodes if n.op == "linear"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_loop_products_are_batched(case: str, tmp_path: Path) -> None:
    pieces, result = CASES[case]
    source = _LOOP.format(pieces=pieces.replace("(", "[").replace(")", "]"), result=result)
    shapes = _gemms(source)
    # 6 steps: the state's product stays in the loop; the input's and the output's are batched
    assert shapes.count((4, 16)) == 6
    assert (6, 4, 16) in shapes and (6, 4, 8) in shapes
    assert len(shapes) == 8
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_exact_order_keeps_each_product_of_the_loop() -> None:
    source = _LOOP.format(pieces="[x[t], h]", result="torch.stack(outputs, dim=0)")
    task = load_task(source)
    assert capture_program(task).reordered == ["batch_shared_products"]
    exact = capture_program(task, exact_order=True)
    assert exact.reordered == []
    assert [n.shape for n in exact.nodes if n.op == "linear"].count((4, 8)) == 6
    assert plan_program(exact).exact_order


def test_products_that_feed_each_other_stay_apart() -> None:
    source = _LOOP.format(pieces="[x[t], h]", result="h").replace(
        "outputs.append(self.h2o(h))", "h = torch.tanh(self.i2h(torch.cat([x[0], h], dim=1)))"
    )
    shapes = _gemms(source)
    # the input's products (x[t] and x[0] twelve times over) are batched; the state's are not
    assert shapes.count((4, 16)) == 12
    assert (12, 4, 16) not in shapes


def test_batch_first_steps_are_batched_along_their_dim(tmp_path: Path) -> None:
    source = (
        _LOOP.format(pieces="[x[:, t], h]", result="torch.stack(outputs, dim=1)")
        .replace("range(x.size(0))", "range(x.size(1))")
        .replace("torch.randn(6, 4, 24)", "torch.randn(4, 6, 24)")
    )
    ir = capture_program(load_task(source))
    shapes = [n.shape for n in ir.nodes if n.op == "linear"]
    assert shapes.count((4, 16)) == 6
    assert (4, 6, 16) in shapes  # the input's products: one GEMM over x as it lies
    assert ir.outputs[0].name in {n.name for n in ir.nodes if n.op == "linear"}
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)


_LSTM_LOOP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.x2h = nn.Linear(24, 64)
        self.h2h = nn.Linear(16, 64, bias=False)

    def forward(self, x, h, c):
        for t in range(x.size(1)):
            i, f, g, o = (self.x2h(x[:, t]) + self.h2h(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h


def get_inputs():
    return [torch.randn(4, 6, 24), torch.randn(4, 16), torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_an_lstm_cell_loop_projects_its_inputs_once(tmp_path: Path) -> None:
    shapes = _gemms(_LSTM_LOOP)
    assert shapes.count((4, 64)) == 6  # the state's products, one a step
    assert (4, 6, 64) in shapes  # the input's, one GEMM over x as it lies
    task, program = generate_checked(_LSTM_LOOP)
    check_on_cpu(task, program, tmp_path, cooperative=True)


_GRU_LOOP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.wr = nn.Linear(24 + 16, 16)
        self.wz = nn.Linear(24 + 16, 16)
        self.wn = nn.Linear(24 + 16, 16)

    def forward(self, x, h):
        for t in range(x.size(0)):
            xh = torch.cat([x[t], h], dim=1)
            r = torch.sigmoid(self.wr(xh))
            z = torch.sigmoid(self.wz(xh))
            n = torch.tanh(self.wn(torch.cat([x[t], r * h], dim=1)))
            h = (1 - z) * n + z * h
        return h


def get_inputs():
    return [torch.randn(6, 4, 24), torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_gates_that_share_a_concatenation_each_split_it(tmp_path: Path) -> None:
    shapes = _gemms(_GRU_LOOP)
    assert shapes.count((6, 4, 16)) == 3  # each gate's input part: one GEMM over every step
    assert shapes.count((4, 16)) == 18  # each gate's state part, each step
    task, program = generate_checked(_GRU_LOOP)
    assert not [n for n in capture_program(task).nodes if n.op == "cat"]
    check_on_cpu(task, program, tmp_path, cooperative=True)
