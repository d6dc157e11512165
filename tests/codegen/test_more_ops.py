"""Ops found missing by a probe of common ``torch`` and ``torch.nn.functional`` calls: pointwise
functions (inverse trigonometric and hyperbolic, special functions, NaN and infinity tests,
logical and comparison ops, floor division) and calls decomposed into registry ops (``logit``,
``softmin``, ``any``/``all``/``count_nonzero``, ``nanmean``, ``std_mean``, ``aminmax``, p-norms,
``baddbmm``, ``outer``, ``diff``, ``repeat``/``tile``/``repeat_interleave``), padding in
``reflect``, ``replicate`` and ``circular`` modes, and the losses ``hinge_embedding``,
``margin_ranking``, ``poisson_nll``, ``cosine_embedding`` and label-smoothed cross entropy; ``torch.linalg.norm``, ``take_along_dim``,
``channel_shuffle``, ``trapezoid``, ``rot90``, ``one_hot`` and ``cross``; reductions over
non-adjacent dims (a hand-written batch norm's statistics over N, H and W); ``logcumsumexp``, ``cummax``/``cummin`` and their indices, ``tensordot``, ``embedding_bag``,
``local_response_norm``, ``lp_pool``, ``bucketize``/``searchsorted`` (one sorted row, or one a row), ``histc``, ``masked_scatter``, ``cdist``, ``rrelu`` and the other dropouts
outside training; casts with ``.to(dtype)``; sums of masks and of int64 tensors; ``nansum``, ``dist``, ``matrix_norm`` (Frobenius, 1 and infinity), ``linalg.cross``, ``addr``,
``multi_dot``/``chain_matmul``, ``block_diag``, ``atleast_nd`` and factories too large to
bake (``zeros``, ``ones``, ``full``, ``new_zeros``, ...) and ``empty`` filled with ``fill_``. Each
must be fully
generated (nothing left to PyTorch) and match PyTorch in the CPU emulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x, y):
        return {expr}


def get_inputs():
    x = torch.randn(3, 5, 6, 8)
    y = torch.randn(3, 5, 6, 8)
    x[0, 0, 0, :3] = torch.tensor([float("inf"), -float("inf"), 0.0])
    y[0, 0, 0, 3] = 0.0
    return [x, y]


def get_init_inputs():
    return []
"""

EXPRS = [
    "torch.tan(y * 0.3) + torch.atan(y) + torch.asin(torch.tanh(y)) + torch.acos(torch.tanh(y * 2))",
    "torch.sinh(y) + torch.cosh(y) + torch.asinh(y) + torch.acosh(y.abs() + 1) + torch.atanh(torch.tanh(y) * 0.9)",  # noqa: E501
    "torch.erfc(y) + torch.erfinv(torch.tanh(y) * 0.9) + torch.special.erfcx(y.abs())",
    "torch.lgamma(y.abs() + 0.5) + torch.special.i0(y) + torch.special.ndtr(y)",
    "torch.special.ndtri(torch.sigmoid(y)) + torch.special.log_ndtr(y * 4)",
    "torch.sinc(y) + torch.special.entr(y) + torch.special.expit(y) + F.logsigmoid(y)",
    # a vector on a diagonal off the main one, below and above (the matrices summed back)
    "torch.diag_embed(y, offset=-1).sum(-1)[..., 1:] + torch.diag_embed(y, 2).sum(-2)[..., 2:]",
    # torch.special's names of ops generated under their own
    "torch.special.expm1(y) + torch.special.exp2(y) + torch.special.log1p(y.abs()) + torch.special.erf(y) + torch.special.logsumexp(y, dim=-1, keepdim=True)",  # noqa: E501
    "torch.nan_to_num(x - x) + torch.nan_to_num((x - x) * y, nan=1.0) + torch.nan_to_num(x, posinf=2.0, neginf=-2.0)",  # noqa: E501
    "(torch.isnan(x - x) | torch.isinf(x)).float() + torch.isfinite(x).float() + torch.signbit(y).float()",  # noqa: E501
    "torch.hypot(x, y) + torch.copysign(y, x) + torch.nextafter(y, x)",
    "torch.logaddexp(x, y)",  # summed, two infinities of opposite signs would make a NaN
    "torch.xlogy(y, x.abs())",
    "torch.special.xlog1py(y, x.abs())",
    "torch.heaviside(y, x) + torch.floor_divide(y * 7, 0.7) + torch.atan2(y, x)",
    "torch.logical_xor(x > 0, y > 0).float() + torch.logical_and(x, y).float() + torch.isclose(x, y * 0 + x).float()",  # noqa: E501
    "torch.logit(torch.sigmoid(y)) + torch.logit(torch.sigmoid(y * 8), eps=1e-3)",
    "F.softmin(y, dim=-1)",
    "(y > 1).any(dim=-1).float() + (y > -2).all(dim=-1).float()",
    "torch.count_nonzero(y > 0, dim=-1)",
    "torch.nanmean(torch.where(y > 0.5, torch.log(y * 0 - 1), y), dim=-1)",
    "torch.std_mean(y, dim=-1)[0] + torch.std_mean(y, dim=-1)[1]",
    "torch.aminmax(y, dim=2)[0] * torch.aminmax(y, dim=2)[1]",
    "y.norm(p=1, dim=-1) + torch.linalg.vector_norm(y, ord=3, dim=-1) + y.norm(p=float('inf'), dim=-1)",  # noqa: E501
    "torch.baddbmm(y.flatten(0, 1)[:, :, :6], y.flatten(0, 1), y.flatten(0, 1).transpose(1, 2), beta=0.5, alpha=2.0)",  # noqa: E501
    "torch.outer(y.flatten()[:10], x.flatten()[10:17])",
    "torch.diff(y, dim=2)",
    "y.repeat(1, 2, 1, 1) + torch.tile(y, (2, 1, 1)) * 0.5",
    "y.repeat_interleave(2, dim=1)",
    "F.pad(y, (2, 3, 1, 5), mode='reflect') * 2",
    "F.pad(torch.relu(y), (8, 1, 0, 2), mode='replicate')",
    "F.pad(y, (8, 3, 6, 0), mode='circular') + 1",
    "F.pad(y, (1, 2, 3, 1, 2, 4), mode='reflect')",
    "F.pad(y[0], (3, 3), mode='replicate')",
    "F.hinge_embedding_loss(y, torch.sign(x))",
    "F.margin_ranking_loss(y, x.clamp(-5, 5), torch.sign(y * 3 - 1), margin=0.2, reduction='sum')",  # noqa: E501
    "F.poisson_nll_loss(y, x.clamp(-5, 5).abs()) + F.poisson_nll_loss(y.abs(), y * y, log_input=False, reduction='sum')",  # noqa: E501
    "F.cosine_embedding_loss(y.flatten(1), x.clamp(-5, 5).flatten(1), torch.sign(y[:, 0, 0, 0]), margin=0.1)",  # noqa: E501
    "F.cross_entropy(y.flatten(0, 2), (x.clamp(-5, 5).abs() * 2).long().clamp(max=7).flatten(0, 2)[:, 0], label_smoothing=0.1)",  # noqa: E501
    "F.cross_entropy(y.flatten(0, 2), (x.clamp(-5, 5).abs() * 2).long().clamp(max=7).flatten(0, 2)[:, 0], label_smoothing=0.2, reduction='none')",  # noqa: E501
    "torch.linalg.norm(y, dim=-1) + torch.linalg.norm(y, ord=1, dim=2).sum() + torch.linalg.norm(y)",  # noqa: E501
    "torch.take_along_dim(y, (x.clamp(-5, 5).abs() * 2).long().clamp(max=7), dim=3)",
    # indices and input broadcast against each other outside the dim
    "torch.take_along_dim(y, (x[:, :1, :, :1].clamp(-5, 5).abs()).long(), dim=2) + torch.take_along_dim(y[:1], (x[..., :3].clamp(-5, 5).abs()).long(), dim=-1).sum(-1, keepdim=True)",  # noqa: E501
    "F.channel_shuffle(y.flatten(2).unsqueeze(-1)[:, :4], 2).squeeze(-1)",
    "torch.trapezoid(y, dim=2) + torch.trapezoid(y, dx=0.5, dim=-1).sum(-1, keepdim=True)",
    # at sample points (a tensor of y's shape, or a vector along dim), and trapz
    "torch.trapezoid(y, y.abs().cumsum(2), dim=2) + torch.trapz(y, dim=2) + torch.trapezoid(y, x[0, 0, :, 0].abs().cumsum(0), dim=2)",  # noqa: E501
    "torch.rot90(y, 1, (2, 3)) + torch.rot90(y, 3, (2, 3)) * 2",
    "torch.rot90(y, 2, (2, 3)) + torch.rot90(y, -1, (2, 3)).transpose(2, 3) + torch.rot90(y[0, 0], 2)[0]",  # noqa: E501
    "F.one_hot((x.clamp(-5, 5).abs() * 2).long().clamp(max=7), 8)",
    "torch.cross(y[..., :3], x.clamp(-5, 5)[..., 3:6], dim=-1)",
    "torch.nansum(torch.where(y > 1, torch.log(y - 2), y), dim=-1) + torch.nansum(x.clamp(-5, 5))",  # noqa: E501
    "torch.empty_like(y).fill_(2.0) * y + y.new_empty(3, 5, 6, 8).fill_(0.5) + torch.empty(6, 8).fill_(1.0)",  # noqa: E501
    # factories too large to bake (72000 elements): fill kernels
    "torch.zeros(300, 5, 6, 8, device=y.device)[:3] + torch.full((300, 5, 6, 8), 0.5, device=y.device)[1:4] * y",  # noqa: E501
    "torch.ones(300, 5, 6, 8, dtype=torch.long, device=y.device)[:3] * y + y.new_zeros(300, 5, 6, 8)[2:5] + y.new_full((3, 5, 6, 8), 2.0)",  # noqa: E501
    "torch.dist(x.clamp(-5, 5), y).reshape(1) + torch.dist(y, y * 2, p=1)",
    "torch.linalg.matrix_norm(y) + torch.linalg.matrix_norm(y, keepdim=True).sum(-1).sum(-1)",
    "torch.atleast_2d(y[0, 0, 0]) + torch.atleast_3d(y[0, 0, 1]).sum(-1) + torch.atleast_1d(y[0, 0, 0, 0])",  # noqa: E501
    "torch.logcumsumexp(y, dim=-1) + torch.logcumsumexp(x, dim=1)",  # warp and thread scans
    "torch.cummax(y, dim=-1)[0] + torch.cummin(x, dim=1)[0] * 0.5",
    # where the running extreme is: ties (rounded values) to the later, NaN (log of a negative)
    # kept; a warp a line along the last dim, a thread a line along dim 1
    "torch.cummax(torch.log(y), dim=-1)[1] + torch.cummin(x.round(), dim=1)[1] * 10 + y.round().cummax(-1)[1] * 100",  # noqa: E501
    "F.rrelu(y) + F.alpha_dropout(y, 0.3) + F.dropout2d(y, 0.3, training=False)",
    "F.lp_pool2d(y, 2, 2) + F.lp_pool2d(y.abs(), 3.0, (2, 2), stride=2)",  # odd p: NaN below 0
    "F.lp_pool1d(y.flatten(2), 2, 3, stride=2)",
    "torch.bucketize(y, torch.tensor([-1.0, 0.0, 0.5, 1.0])) + torch.bucketize(y, torch.tensor([-1.0, 0.0]), right=True)",  # noqa: E501
    "torch.searchsorted(torch.tensor([-1.0, 0.0, 0.5, 1.0]), y) * 2",
    # histograms: the data's range, a given one (values outside it dropped), a constant input
    "torch.histc(y, bins=7) + torch.tanh(y).histc(bins=7, min=-0.5, max=0.9) + torch.histc(y * 0 + 2, bins=7)",  # noqa: E501
    # the k-th selected position takes the source's k-th element; a mask broadcast along rows
    "y.masked_scatter(x > 0.5, torch.tanh(x)) + y.masked_scatter(x[..., :1] < 0, y * 2)",
    # a sorted row for each row of values (samples drawn from each ray's CDF), right side
    "torch.searchsorted(y.sort(dim=-1).values, x.clamp(-5, 5)[..., :5].contiguous(), right=True).float() * 0.5",
    "torch.cdist(y.flatten(1, 2), x.clamp(-5, 5).flatten(1, 2))",  # 30 rows: the product
    "torch.cdist(y[0], x.clamp(-5, 5)[1]) + torch.cdist(y[0], y[1], p=1) + torch.cdist(y[0], y[2], p=float('inf'))",  # noqa: E501
    "torch.tensordot(y, x.clamp(-5, 5), dims=([1, 3], [1, 3]))",
    "torch.tensordot(y.flatten(0, 1), x.clamp(-5, 5)[0].permute(1, 2, 0), dims=2)",
    "F.embedding_bag((x.clamp(-5, 5).abs() * 2).long().clamp(max=5)[0, 0], y[0, 0], mode='mean') + F.embedding_bag((x.clamp(-5, 5).abs() * 2).long().clamp(max=5)[0, 1], y[0, 0], mode='max')",  # noqa: E501
    "F.local_response_norm(y, 3) + F.local_response_norm(y[:, :, 0], 2, alpha=0.1, beta=0.5, k=2.0).unsqueeze(2)",  # noqa: E501
    # reductions over non-adjacent dims: rows gathered by index
    "y.mean(dim=(0, 2, 3), keepdim=True) * y",
    "(y - y.mean(dim=(0, 2, 3), keepdim=True)) / torch.sqrt(y.var(dim=(0, 2, 3), keepdim=True, unbiased=False) + 1e-5)",  # noqa: E501
    "y.sum(dim=(0, 2)) + y.amax(dim=(0, 2)) * y.std(dim=(0, 2))",
    "torch.logsumexp(y, dim=(1, 3)) + y.amin(dim=(1, 3))",
    # casts of masks and indices for arithmetic: .to(dtype), .type_as, .long()
    "(y > 0).to(y.dtype) * y + (y < 0).type_as(y) + (y.clamp(-3, 3) * 2).to(torch.int64)",
    # counts and integer sums, exact in int64 (a loss's count of targets not ignored)
    "y.sum() / (x > 0).sum() + (y > 0).sum(dim=1).float().unsqueeze(1) - (y * 3).long().sum(-1, keepdim=True)",  # noqa: E501
    "(y * 2).to(torch.bool).float() + (y.clamp(-1, 1) * 0).bool().float() + torch.count_nonzero(y > 0.5, dim=2).unsqueeze(2)",  # noqa: E501
    # diff of higher order and with edges joined on; distances of any order
    "torch.diff(y, n=2, dim=1).sum(1, keepdim=True) + torch.diff(y, dim=-1, prepend=y[..., :1], append=x[..., :2]).mean(-1, keepdim=True)",  # noqa: E501
    # a tuple of views joined again, an integer matrix's diagonal, a gather beside partial slices
    "torch.cat(y.unbind(1), 0).sum(0) + torch.stack(y.unbind(1), 2).mean((0, 2))",
    "torch.cat(y.chunk(2, dim=3), 1).sum(1, keepdim=True) + torch.stack(y.split(4, dim=3), 0).mean(0)",  # noqa: E501
    "torch.diag((y[0, 0] * 3).long()).float() + y[torch.tensor([2, 0, 1]), :, 1:4, ::2].sum((0, 1, 2)).sum()",  # noqa: E501
    # cross entropy against class probabilities (distillation, mixup)
    "F.cross_entropy(y, torch.softmax(y * 2, 1), label_smoothing=0.1) + F.cross_entropy(y, torch.softmax(-y, 1), reduction='none')",  # noqa: E501
    "F.pairwise_distance(y, y.flip(-1), p=1.0) + F.pairwise_distance(y, y * 0.5, p=3.0) + F.pairwise_distance(y, -y, p=float('inf'))",  # noqa: E501
    # matrix norms of orders 1 and infinity, over two named dims too; cross products that
    # broadcast; addr (beta 0 ignores an infinite input); chained products; block diagonals
    "torch.linalg.matrix_norm(y, ord=1) + torch.linalg.matrix_norm(y, ord=-float('inf'), keepdim=True).squeeze(-1).squeeze(-1) + torch.linalg.norm(y, dim=(1, 3)).sum(-1, keepdim=True)",  # noqa: E501
    "torch.linalg.cross(y[..., :3], x[:1, :1, :, 5:]) * 2",
    "torch.addr(y[0, 0], y[0, 1, :, 0], y[1, 0, 0, :], beta=0.5, alpha=2.0) + torch.addr(x[0, 0], y[0, 0, :, 0], y[1, 1, 1], beta=0)",  # noqa: E501
    "torch.linalg.multi_dot([y[0, 0, 0], y[0, 0].t(), y[1, 1]]) + torch.chain_matmul(y[0, 0], y[0, 1].t(), y[2, 2])[0]",  # noqa: E501
    "torch.block_diag(y[0, 0], y[1, 1, 0], x[0, 1, 2, 3]) * 2",
    # base-2 log-add-exp with infinities of one sign; torch.special's logit and softmaxes
    "torch.logaddexp2(x, y) + torch.logaddexp2(y, y * 0.5)",
    "torch.special.logit(torch.sigmoid(y), eps=0.1) + torch.special.log_softmax(y, 1) + torch.special.softmax(y, dim=-1)",  # noqa: E501
]


def test_a_gathered_reduction_splits_its_rows_into_chunks(tmp_path: Path) -> None:
    """Few rows over many elements (a batch norm's statistics): two stages, gathered chunks."""
    from stitch_graph.codegen import KernelTuning, Tuning

    expr = "torch.relu(y).mean(dim=(0, 2, 3)) + y.var(dim=(0, 2, 3))"
    split = Tuning(default=KernelTuning(split_reduction=True))
    task, program = generate_checked(_PROBLEM.format(expr=expr), split)
    assert "stage 1 of a split reduction" in program.kernel_source
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("expr", EXPRS)
def test_the_op_is_generated_and_matches_pytorch(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
