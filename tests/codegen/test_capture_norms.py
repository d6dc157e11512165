"""Hand-written layer norms and softmaxes become one row-op node, and only the exact forms do.

Written with ``mean`` and the mean of squared deviations (or a biased ``var``), a layer norm is
two dependent row reductions that would be two kernels, and so is a softmax written with
``amax``, ``exp`` and ``sum``; as one node each is one row kernel. A form that computes
something else (an unbiased variance, ``eps`` outside the root, a middle dim, a softmax without
its maximum subtracted, an intermediate read elsewhere) keeps its nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn({last}))
        self.bias = nn.Parameter(torch.randn({last}))

    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

MEAN_FORM = (
    "m = x.mean(-1, keepdim=True); c = x - m; v = (c * c).mean(-1, keepdim=True); "
    "return c / torch.sqrt(v + 1e-5) * self.weight + self.bias"
)
RECOGNISED = {
    "mean_of_squares": MEAN_FORM,
    "pow_and_rsqrt": (
        "c = x - x.mean(dim=-1, keepdim=True); "
        "return torch.rsqrt(c.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * c"
    ),
    "biased_var": (
        "v = x.var(-1, unbiased=False, keepdim=True); "
        "return (x - x.mean(-1, keepdim=True)) / (v + 1e-5).sqrt() + self.bias"
    ),
}
SOFTMAX = {
    "max_getitem": (
        "m = x.max(dim=-1, keepdim=True)[0]; e = torch.exp(x - m); "
        "return e / e.sum(dim=-1, keepdim=True)",
        "softmax",
    ),
    "over_channels": (
        "e = (x - x.amax(1, keepdim=True)).exp(); return e / e.sum(1, keepdim=True) * 2.0",
        "softmax",
    ),
    "log_softmax": (
        "s = x - x.amax(-1, keepdim=True); "
        "return s - torch.log(torch.exp(s).sum(-1, keepdim=True))",
        "log_softmax",
    ),
}
KEPT = {
    "softmax_without_max": "e = torch.exp(x); return e / e.sum(-1, keepdim=True)",
    "exp_also_returned": (
        "e = torch.exp(x - x.amax(-1, keepdim=True)); return e / e.sum(-1, keepdim=True), e"
    ),
    "sum_over_another_dim": (
        "e = torch.exp(x - x.amax(-1, keepdim=True)); return e / e.sum(1, keepdim=True)"
    ),
    "unbiased_var": (
        "v = x.var(-1, keepdim=True); return (x - x.mean(-1, keepdim=True)) / torch.sqrt(v + 1e-5)"
    ),
    "eps_outside_root": (
        "c = x - x.mean(-1, keepdim=True); "
        "return c / (torch.sqrt((c * c).mean(-1, keepdim=True)) + 1e-5)"
    ),
    "middle_dim": (
        "m = x.mean(1, keepdim=True); c = x - m; v = (c * c).mean(1, keepdim=True); "
        "return c / torch.sqrt(v + 1e-5)"
    ),
    "centred_also_returned": (
        "m = x.mean(-1, keepdim=True); c = x - m; v = (c * c).mean(-1, keepdim=True); "
        "return c / torch.sqrt(v + 1e-5), c"
    ),
}


def _source(body: str, shape: tuple[int, ...]) -> str:
    body = body.replace("; ", "\n        ")
    return _PROBLEM.format(body=body, shape=", ".join(map(str, shape)), last=shape[-1])


def _ops(body: str, shape: tuple[int, ...]) -> list[str]:
    return [n.op for n in capture_program(load_task(_source(body, shape))).nodes]


@pytest.mark.parametrize("body", RECOGNISED.values(), ids=RECOGNISED.keys())
def test_hand_written_layer_norm_becomes_one_node(body: str) -> None:
    ops = _ops(body, (3, 4, 32))
    assert ops.count("layer_norm") == 1
    assert not {"mean", "var", "sub", "sqrt", "rsqrt"} & set(ops)


@pytest.mark.parametrize("body", KEPT.values(), ids=KEPT.keys())
def test_other_forms_keep_their_nodes(body: str) -> None:
    ops = _ops(body, (3, 4, 32))
    assert not {"layer_norm", "softmax", "log_softmax"} & set(ops)
    assert {"mean", "var", "sum"} & set(ops)


@pytest.mark.parametrize("name", sorted(SOFTMAX))
def test_hand_written_softmax_becomes_one_node(name: str, tmp_path: Path) -> None:
    body, op = SOFTMAX[name]
    shape = (2, 40, 4, 16) if name == "over_channels" else (3, 5, 48)
    source = _source(body, shape)
    ops = [n.op for n in capture_program(load_task(source)).nodes]
    assert ops.count(op) == 1
    assert not {"amax", "exp", "sum", "sub", "log"} & set(ops)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_two_trailing_dims_normalise_both() -> None:
    body = MEAN_FORM.replace("(-1, keepdim=True)", "((-2, -1), keepdim=True)")
    body = body.replace(" * self.weight + self.bias", "")
    ir = capture_program(load_task(_source(body, (2, 3, 8, 16))))
    (norm,) = [n for n in ir.nodes if n.op == "layer_norm"]
    assert tuple(norm.args["normalized_shape"]) == (8, 16)


@pytest.mark.parametrize("name", ["mean_of_squares", "pow_and_rsqrt", "biased_var"])
def test_recognised_layer_norm_matches_pytorch(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_source(RECOGNISED[name], (3, 5, 48)))
    assert not program.declared_torch_ops
    assert program.kernel_source.count('extern "C" __global__') <= 2  # a kernel and its float4 twin
    check_on_cpu(task, program, tmp_path, cooperative=True)


CHANNELS_FIRST = (
    "u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True); "
    "return (x - u) / torch.sqrt(s + 1e-6) * 2.0 + 1.0"
)


@pytest.mark.parametrize("body", [
    CHANNELS_FIRST,
    "c = x - x.mean(0, keepdim=True); return (c * c).mean(0)",  # an ensemble's spread
])
def test_mean_of_squared_deviations_is_a_biased_var(body: str) -> None:
    """Over other than trailing dims no layer norm is taken, but the variance is: it then
    reads the input itself, beside the mean, instead of the mean's deviations after it."""
    ir = capture_program(load_task(_source(body, (3, 40, 32))))
    (var,) = [n for n in ir.nodes if n.op == "var"]
    assert var.args["correction"] == 0 and var.args["input"].name == "x"
    assert "pow" not in [n.op for n in ir.nodes]


def test_channels_first_layer_norm_is_one_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Mean and variance as sibling reductions of the channels, then the rewrite: one kernel
    (three passes, two kernels, before)."""
    from stitch_graph.codegen import schedule

    monkeypatch.setattr(schedule, "_BROADCAST_BACK_THREAD_ROWS", 1)
    task, program = generate_checked(_source(CHANNELS_FIRST, (2, 96, 4, 32)))
    assert "SgPair<SgSum, SgWelford>" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched


_GROUP_NORM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(12))
        self.bias = nn.Parameter(torch.randn(12))

    def forward(self, x):
        b, c, h, w = x.shape
        g = x.view({grouped})
        g = (g - g.mean(-1, keepdim=True)) / torch.sqrt(g.var(-1, unbiased=False, keepdim=True) + 1e-5)
        return g.view(b, c, h, w) * self.weight.view(1, c, 1, 1) + self.bias.view(1, c, 1, 1)


def get_inputs():
    return [torch.randn(2, 12, 5, 8)]


def get_init_inputs():
    return []
"""


def test_hand_written_group_norm_is_one_kernel_with_its_affine(tmp_path: Path) -> None:
    """Grouped by a view, normalised as a layer norm and viewed back, it is a group norm; the
    per-channel scale and shift, which read the norm through the view, become its epilogue."""
    source = _GROUP_NORM.format(grouped="b, 3, -1")
    ops = [n.op for n in capture_program(load_task(source)).nodes]
    assert ops.count("group_norm") == 1 and "layer_norm" not in ops
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched


def test_rows_that_do_not_group_channels_stay_a_layer_norm() -> None:
    source = _GROUP_NORM.format(grouped="b * 4, 3, -1")  # the batch split too: no group norm
    ops = [n.op for n in capture_program(load_task(source)).nodes]
    assert "group_norm" not in ops and "layer_norm" in ops


RMS = {
    "llama": "v = x.pow(2).mean(-1, keepdim=True); return x * torch.rsqrt(v + 1e-6) * self.weight",
    "t5_product_and_sqrt": "return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5))",
    "two_trailing_dims": "return torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * x",
}
RMS_KEPT = {
    "no_eps": "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))",
    "a_middle_dim": "return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)",
    "another_tensors_squares": "return x * torch.rsqrt((x + 1).pow(2).mean(-1, keepdim=True) + 1e-6)",
    "mean_also_returned": (
        "v = x.pow(2).mean(-1, keepdim=True); return x * torch.rsqrt(v + 1e-6), v"
    ),
}


@pytest.mark.parametrize("name", sorted(RMS))
def test_hand_written_rms_norm_is_one_row_kernel(name: str, tmp_path: Path) -> None:
    """An RMS norm written as LLaMA or T5 write it: the rms_norm row kernel (the row held in
    registers, one read and one write), its weight fused as the epilogue."""
    source = _source(RMS[name], (3, 5, 48))
    assert [n.op for n in capture_program(load_task(source)).nodes].count("rms_norm") == 1
    task, program = generate_checked(source)
    assert program.kernel_source.count('extern "C" __global__') <= 2  # a kernel and its float4 twin
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("body", RMS_KEPT.values(), ids=RMS_KEPT.keys())
def test_other_rms_forms_keep_their_nodes(body: str) -> None:
    assert "rms_norm" not in _ops(body, (3, 4, 32))


def test_a_layer_norm_that_centres_twice_is_generated_whole(tmp_path: Path) -> None:
    """``x - mu`` written twice is no one centred node, so no layer_norm: the mean (over dim
    -1) and the biased var it becomes (over dim 2) are siblings of one pass, which the emitter
    must take as the same dim (it had left the whole norm to PyTorch)."""
    body = (
        "mu = x.mean(dim=-1, keepdim=True); var = ((x - mu) ** 2).mean(dim=-1, keepdim=True); "
        "return (x - mu) * torch.rsqrt(var + 1e-5)"
    )
    task, program = generate_checked(_source(body, (3, 5, 48)))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
