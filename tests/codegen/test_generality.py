"""Generality of the rule-based generator on op patterns beyond the problem suite (CPU only).

Each case is a small self-written problem. It must be captured, planned and emitted without an
exception, with no op left to PyTorch and no hack finding, and the generated ``ModelNew`` must
match the reference on the CPU: its kernels run under ``CpuKernels(cooperative=True)`` (every
thread of a block a coroutine, so warp shuffles and block barriers keep their CUDA meaning) and
``_sgemm`` under the column-major emulation. All kernel sources are also built by nvcc as one
translation unit. Categories: capture fixes (``x.T``, constants made in ``forward``, ATen programs
from ``torch.export``, views as methods, strided ``linear`` inputs, instance-norm modules),
in-place writes seen through aliases (``c = b; b += 1``, ``nn.ReLU(inplace=True)``),
pooling, scans, 3-D and transposed convolutions, ops that read other positions (``cat``,
``stack``, ``flip``, ``gather``, ``triu``/``tril``), decomposed losses (with class or element
weights too), products with a vector (``mv``, ``dot``), weight-normalised layers, distances, attention,
``einsum``, ``normalize``, pixel shuffles and (bi)linear or nearest resizing, and the fallbacks
that keep unknown ops and failing items in PyTorch, declared.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import (
    KernelTuning,
    Tuning,
    capture_program,
    emit_candidate,
    plan_program,
)
from stitch_graph.codegen import _emit_conv as conv_mod
from stitch_graph.codegen import emit as emit_mod
from stitch_graph.codegen._cuda import PRELUDE
from stitch_graph.task import load_task
from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile
from tests.codegen.cpu_emulation import check_on_cpu, load_on_cpu

_TEMPLATE = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {params}):
{body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


def _problem(expr: str, inputs: str, init: str = "pass", params: str = "x") -> str:
    body = expr if "\n" in expr or expr.startswith("return") else f"return {expr}"
    return _TEMPLATE.format(
        init=textwrap.indent(init, " " * 8),
        body=textwrap.indent(body, " " * 8),
        params=params,
        inputs=inputs,
    )


R = "torch.randn"
_GENERATED_CONV = Tuning(default=KernelTuning(conv_library=False))
THREAD = Tuning(default=KernelTuning(rows_per_block=1))  # scans: a thread per line

# name -> (source, tuning or None)
CASES: dict[str, tuple[str, Tuning | None]] = {
    # ---- capture: calls that crashed or produced code the checker refused
    "transpose_attribute": (_problem("torch.matmul(x.T, w.mT) / 2.0", f"{R}(7, 5), {R}(3, 7)", params="x, w"), None),  # noqa: E501
    "constant_in_forward": (_problem("torch.min(x, torch.tensor(0.25, device=x.device)) * 2.0", f"{R}(4, 9)"), None),  # noqa: E501
    "baked_mask_of_infinities": (_problem("(x + torch.triu(torch.full((6, 6), float('-inf'), device=x.device), 1)).softmax(-1)", f"{R}(2, 6, 6)"), None),  # noqa: E501
    "item_in_init": (_problem("x * self.scale", f"{R}(4, 9)", "self.scale = float(torch.linspace(0, 1, 5)[3].item())"), None),  # noqa: E501
    "export_fallback": (_problem("x / math.sqrt(x.size(-1)) + torch.unsqueeze(x, 0).squeeze(0)", f"{R}(4, 16)"), None),  # noqa: E501
    "export_slices": (_problem("x[:, 2:10:2] / math.sqrt(x.size(-1)) - x[1:3].sum(0, keepdim=True)[:, :4]", f"{R}(4, 16)"), None),  # noqa: E501
    "max_values_indices": (_problem("torch.max(x, dim=1).values + torch.min(x, 1, keepdim=True).indices.float().squeeze(1)", f"{R}(4, 9)"), None),  # noqa: E501
    "vector_norm": (_problem("x / torch.linalg.vector_norm(x, dim=1, keepdim=True)", f"{R}(4, 9)"), None),  # noqa: E501
    "unfold_patches": (_problem("x.unfold(2, 2, 2).unfold(3, 2, 2).reshape(x.shape[0], -1, 4 * x.shape[1]) * 2.0", f"{R}(2, 3, 4, 6)"), None),  # noqa: E501
    "flatten_function": (_problem("self.fc(torch.flatten(torch.relu(x), 1))", f"{R}(4, 3, 2, 2)", "self.fc = nn.Linear(12, 5)"), None),  # noqa: E501
    "linear_strided_input": (_problem("self.fc(x[:, -1, :])", f"{R}(4, 6, 8)", "self.fc = nn.Linear(8, 5)"), None),  # noqa: E501
    "instance_norm_module": (_problem("self.norm(x) * 2.0", f"{R}(2, 3, 5, 6)", "self.norm = nn.InstanceNorm2d(3, affine=True)"), None),  # noqa: E501
    "inplace_rebinds": (_problem("z = x * 2\nz.relu_()\nw = z.clone()\nw.copy_(y)\nF.relu(w, inplace=True)\nreturn z + w", f"{R}(4, 8), {R}(4, 8)", params="x, y"), None),  # noqa: E501
    # ---- in-place writes seen through another name of the same tensor
    "alias_then_augmented_add": (_problem("b = x * 2\nc = b\nb += 1\nreturn c", f"{R}(4, 8)"), None),  # noqa: E501
    "alias_then_augmented_chain": (_problem("b = x * 2\nc = b\nb -= 0.5\nb *= 3.0\nb /= 2.0\nreturn c + x", f"{R}(4, 8)"), None),  # noqa: E501
    "whole_aliases_then_add_": (_problem("b = x * 2\nc = b.contiguous()\nd = b.detach()\nb.add_(1.0)\nreturn c * d", f"{R}(4, 8)"), None),  # noqa: E501
    "relu_module_inplace": (_problem("y = self.fc(x)\nz = self.act(y)\nreturn self.fc2(y) + z.sum(1, keepdim=True)", f"{R}(4, 8)", "self.fc = nn.Linear(8, 6)\nself.act = nn.ReLU(inplace=True)\nself.fc2 = nn.Linear(6, 3)"), None),  # noqa: E501
    "inplace_activations_in_sequential": (_problem("self.net(x)", f"{R}(4, 8)", "self.net = nn.Sequential(nn.Linear(8, 6), nn.ReLU(inplace=True), nn.Linear(6, 5), nn.LeakyReLU(0.1, inplace=True), nn.Hardtanh(-0.5, 0.5, inplace=True))"), None),  # noqa: E501
    "residual_add_then_inplace_relu": (_problem("idt = x\nout = torch.tanh(x * 2.0)\nout += idt\nreturn F.relu(out, inplace=True)", f"{R}(4, 8)"), None),  # noqa: E501
    # ---- pooling
    "max_pool2d_ceil_prologue": (_problem("torch.relu(self.p(torch.tanh(x) * 2.0)) + 1.0", f"{R}(2, 3, 11, 10)", "self.p = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)"), None),  # noqa: E501
    "max_pool1d_dilated": (_problem("self.p(x)", f"{R}(2, 3, 40)", "self.p = nn.MaxPool1d(4, stride=2, padding=2, dilation=3)"), None),  # noqa: E501
    "max_pool3d": (_problem("self.p(x)", f"{R}(2, 2, 9, 10, 11)", "self.p = nn.MaxPool3d(3, stride=2, padding=1, dilation=2, ceil_mode=True)"), None),  # noqa: E501
    "avg_pool1d": (_problem("self.p(x)", f"{R}(2, 3, 17)", "self.p = nn.AvgPool1d(4, stride=1, padding=2)"), None),  # noqa: E501
    "avg_pool2d_exclude_pad": (_problem("self.p(x)", f"{R}(2, 3, 11, 10)", "self.p = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)"), None),  # noqa: E501
    "avg_pool3d_divisor": (_problem("self.p(x)", f"{R}(2, 2, 6, 7, 8)", "self.p = nn.AvgPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), divisor_override=5)"), None),  # noqa: E501
    "adaptive_avg_pool2d": (_problem("self.p(x)", f"{R}(2, 3, 11, 13)", "self.p = nn.AdaptiveAvgPool2d((3, 5))"), None),  # noqa: E501
    "adaptive_max_pool1d": (_problem("self.p(x)", f"{R}(2, 3, 30)", "self.p = nn.AdaptiveMaxPool1d(7)"), None),  # noqa: E501
    "global_avg_pool_as_mean": (_problem("torch.sigmoid(self.p(x))", f"{R}(2, 3, 11, 13)", "self.p = nn.AdaptiveAvgPool2d(1)"), None),  # noqa: E501
    "global_max_pool3d": (_problem("self.p(x)", f"{R}(2, 3, 4, 5, 6)", "self.p = nn.AdaptiveMaxPool3d((1, 1, 1))"), None),  # noqa: E501
    # ---- scans
    "cumsum_warp_per_line": (_problem("torch.cumsum(x, dim=1)", f"{R}(3, 70)"), None),
    "cumsum_warp_32_a_step": (_problem("torch.cumsum(x, dim=1)", f"{R}(3, 70)"), Tuning(default=KernelTuning(vector_width=1))),  # noqa: E501
    "logcumsumexp_cummax_warp_runs": (_problem("torch.logcumsumexp(x, dim=-1) + torch.cummax(x * 3.0, dim=-1)[0]", f"{R}(5, 300)"), None),  # noqa: E501
    "cumsum_thread_per_line": (_problem("torch.cumsum(x, dim=1)", f"{R}(3, 70)"), THREAD),
    "cumsum_inner_dim": (_problem("torch.cumsum(x, dim=1)", f"{R}(4, 37, 40)"), None),
    # few long strided lines: each cut into chunks, the chunks' totals combined (4 and 3)
    "cumsum_in_chunks": (_problem("torch.cumsum(x.permute(0, 2, 1), dim=1) * 2.0", f"{R}(2, 40, 130)"), None),  # noqa: E501
    "logcumsumexp_in_chunks": (_problem("torch.logcumsumexp(x, dim=0)", f"{R}(100, 33)"), None),
    "cumprod_in_chunks_forced": (_problem("torch.cumprod(x, dim=1)", "torch.rand(3, 70) + 0.5"), Tuning(default=KernelTuning(rows_per_block=1, split_reduction=True))),  # noqa: E501
    "cumprod_epilogue": (_problem("torch.cumprod(x, dim=0) * 2.0", "torch.rand(6, 50) + 0.5"), None),  # noqa: E501
    "masked_cumsum": (_problem("torch.cumsum(x * m, dim=1)", f"{R}(4, 100), torch.rand(4, 100) > 0.5", params="x, m"), None),  # noqa: E501
    "reverse_cumsum": (_problem("torch.cumsum(x.flip(1), dim=1).flip(1)", f"{R}(3, 40)"), None),
    "exclusive_cumsum": (_problem("torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), torch.cumsum(x.narrow(dim=1, start=0, length=x.size(1) - 1), dim=1)), dim=1)", f"{R}(3, 40)"), None),  # noqa: E501
    # ---- convolutions the generated way (cuDNN is the default: test_conv_library.py):
    # 3-D, transposed (stride 1 as a flipped-weight conv, SGEMM + col2im, or direct)
    "conv3d_im2col": (_problem("self.c(x)", f"{R}(2, 3, 7, 8, 9)", "self.c = nn.Conv3d(3, 5, 3, stride=(1, 2, 1), padding=(1, 0, 2), dilation=(2, 1, 1))"), _GENERATED_CONV),  # noqa: E501
    "conv3d_grouped_direct": (_problem("torch.relu(self.c(x))", f"{R}(2, 6, 5, 6, 7)", "self.c = nn.Conv3d(6, 4, (2, 3, 1), groups=2, bias=False)"), _GENERATED_CONV),  # noqa: E501
    "conv3d_pointwise": (_problem("self.c(x) * 2.0", f"{R}(2, 8, 3, 4, 5)", "self.c = nn.Conv3d(8, 4, 1)"), _GENERATED_CONV),  # noqa: E501
    "conv2d_padding_same": (_problem("torch.relu(self.c(x))", f"{R}(2, 3, 7, 8)", "self.c = nn.Conv2d(3, 4, (3, 5), padding='same', dilation=(2, 1))"), _GENERATED_CONV),  # noqa: E501
    "conv1d_padding_same": (_problem("self.c(x) + 1.0", f"{R}(2, 4, 9)", "self.c = nn.Conv1d(4, 2, 3, padding='same', bias=False)"), _GENERATED_CONV),  # noqa: E501
    "conv_transpose1d_grouped": (_problem("self.c(x)", f"{R}(2, 4, 9)", "self.c = nn.ConvTranspose1d(4, 6, 5, stride=3, padding=2, dilation=2, groups=2)"), _GENERATED_CONV),  # noqa: E501
    "conv_transpose2d_small": (_problem("self.c(x)", f"{R}(2, 3, 5, 6)", "self.c = nn.ConvTranspose2d(3, 5, 3, stride=2, padding=1, output_padding=1)"), _GENERATED_CONV),  # noqa: E501
    "conv_transpose2d_gemm": (_problem("torch.tanh(self.c(x)) + 1.0", f"{R}(2, 20, 5, 6)", "self.c = nn.ConvTranspose2d(20, 6, (3, 4), stride=(2, 3), padding=(1, 2), dilation=(2, 1), output_padding=(1, 0))"), _GENERATED_CONV),  # noqa: E501
    "conv_transpose3d_gemm": (_problem("self.c(x) - 0.5", f"{R}(2, 16, 3, 4, 5)", "self.c = nn.ConvTranspose3d(16, 3, (2, 3, 3), stride=(2, 1, 2), padding=(0, 1, 1), output_padding=(1, 0, 1))"), _GENERATED_CONV),  # noqa: E501
    "conv_transpose3d_grouped": (_problem("self.c(x)", f"{R}(2, 4, 3, 4, 5)", "self.c = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, groups=2, dilation=2)"), _GENERATED_CONV),  # noqa: E501
    # ---- ops that read their operands at other positions
    "cat_fused_consumers": (_problem("torch.relu(torch.cat((x, y[:, 1:], x * 2.0), 1)) + 1.0", f"{R}(3, 4, 5), {R}(3, 4, 5)", params="x, y"), None),  # noqa: E501
    "cat_strided": (_problem("torch.cat([x.transpose(0, 1), y.transpose(0, 1)], dim=-1)", f"{R}(3, 4, 5), {R}(3, 4, 5)", params="x, y"), None),  # noqa: E501
    "stack_then_sum": (_problem("torch.stack([x, y, x + y], dim=1).sum(1)", f"{R}(3, 4, 5), {R}(3, 4, 5)", params="x, y"), None),  # noqa: E501
    "flip_two_dims": (_problem("torch.flip(x, dims=(0, 2)) * y", f"{R}(3, 4, 5), {R}(3, 4, 5)", params="x, y"), None),  # noqa: E501
    "gather": (_problem("torch.gather(x, 1, i) + 1.0", f"{R}(3, 5), torch.randint(0, 5, (3, 2))", params="x, i"), None),  # noqa: E501
    "triu_of_matmul": (_problem("torch.triu(torch.matmul(x, y))", f"{R}(5, 5), {R}(5, 5)", params="x, y"), None),  # noqa: E501
    "tril_diagonal": (_problem("torch.tril(x, diagonal=-1) * 3.0", f"{R}(2, 5, 6)"), None),
    "pad_constant": (_problem("F.pad(x, (1, 2, 0, 1), value=0.5) * 2.0", f"{R}(2, 3, 4, 5)"), None),  # noqa: E501
    "pad_crop": (_problem("F.pad(torch.relu(x), [-1, 1, 2, 0])", f"{R}(2, 4, 5)"), None),  # noqa: E501
    "roll": (_problem("torch.roll(x, shifts=(1, -2), dims=(1, 2)) + 1.0", f"{R}(2, 4, 5)"), None),  # noqa: E501
    "embedding": (_problem("self.emb(i) * 2.0", "torch.randint(0, 10, (3, 4))", "self.emb = nn.Embedding(10, 6)", params="i"), None),  # noqa: E501
    "max_pool_values_of_return_indices": (_problem("self.p(x)[0] + F.max_pool1d(x.flatten(2), 3, stride=2, return_indices=True)[0].sum()", f"{R}(2, 3, 6, 8)", "self.p = nn.MaxPool2d(2, return_indices=True)"), None),  # noqa: E501
    "bilinear_module": (_problem("self.b(x, torch.tanh(x[..., :3]))", f"{R}(2, 3, 4)", "self.b = nn.Bilinear(4, 3, 6)"), None),  # noqa: E501
    "bilinear_no_bias": (_problem("torch.nn.functional.bilinear(x, x, w)", f"{R}(3, 4), {R}(2, 4, 4)", params="x, w"), None),  # noqa: E501
    "embedding_before_lstm_exported": (_problem("o, _ = self.lstm(self.emb(i))\nreturn self.dec(o)", "torch.randint(0, 20, (2, 5))", "self.emb = nn.Embedding(20, 8)\nself.lstm = nn.LSTM(8, 8, 2, batch_first=True)\nself.dec = nn.Linear(8, 20)", params="i"), None),  # noqa: E501
    "embedding_padding_idx": (_problem("self.emb(i) + 1.0", "torch.randint(0, 10, (3, 4))", "self.emb = nn.Embedding(10, 6, padding_idx=3)", params="i"), None),  # noqa: E501
    "tensor_index": (_problem("x[:, i] * 2.0 + 1.0", f"{R}(4, 6), torch.randint(-6, 6, (2, 3))", params="x, i"), None),  # noqa: E501
    "index_select": (_problem("torch.index_select(x, 1, i) - x[:, :3]", f"{R}(4, 6), torch.randint(0, 6, (3,))", params="x, i"), None),  # noqa: E501
    "like_constants": (_problem("torch.full_like(x, 2.5) + torch.ones_like(x, dtype=torch.float32) - torch.zeros_like(x)", f"{R}(3, 8)"), None),  # noqa: E501
    # ---- decompositions
    "mse_loss": (_problem("F.mse_loss(x, y)", f"{R}(6, 10), {R}(6, 10)", params="x, y"), None),  # noqa: E501
    "smooth_l1_loss": (_problem("F.smooth_l1_loss(x, y, beta=0.5)", f"{R}(6, 10), {R}(6, 10)", params="x, y"), None),  # noqa: E501
    "huber_loss_sum": (_problem("F.huber_loss(x, y, reduction='sum', delta=0.7)", f"{R}(6, 10), {R}(6, 10)", params="x, y"), None),  # noqa: E501
    "kl_div_batchmean": (_problem("F.kl_div(torch.log(x), y, reduction='batchmean')", "torch.rand(6, 10).softmax(-1), torch.rand(6, 10).softmax(-1)", params="x, y"), None),  # noqa: E501
    "bce": (_problem("F.binary_cross_entropy(torch.sigmoid(x), y)", f"{R}(6, 10), torch.rand(6, 10)", params="x, y"), None),  # noqa: E501
    "bce_with_logits_none": (_problem("F.binary_cross_entropy_with_logits(x, y, reduction='none')", f"{R}(6, 10), torch.rand(6, 10)", params="x, y"), None),  # noqa: E501
    "cross_entropy": (_problem("F.cross_entropy(x, t)", f"{R}(6, 10), torch.randint(0, 10, (6,))", params="x, t"), None),  # noqa: E501
    "cross_entropy_class_weights": (_problem("F.cross_entropy(x, t, weight=self.w, ignore_index=1, label_smoothing=0.2) + F.cross_entropy(y, u, weight=self.w, ignore_index=3)", f"{R}(6, 5), torch.randint(0, 5, (6,)), {R}(2, 5, 3, 4), torch.randint(0, 5, (2, 3, 4))", "self.register_buffer('w', torch.rand(5) + 0.2)", params="x, t, y, u"), None),  # noqa: E501
    "nll_loss_class_weights": (_problem("F.nll_loss(torch.log_softmax(x, 1), t, weight=self.w, reduction='none')", f"{R}(6, 5), torch.randint(0, 5, (6,))", "self.register_buffer('w', torch.rand(5) + 0.2)", params="x, t"), None),  # noqa: E501
    "repeat_int_labels": (_problem("torch.where(t.view(1, -1).repeat(6, 1) == t.view(-1, 1).tile((1, 6)), x, 0.0).sum(1)", f"{R}(6, 6), torch.randint(0, 3, (6,))", params="x, t"), None),  # noqa: E501
    "bce_with_logits_weights": (_problem("F.binary_cross_entropy_with_logits(x, y, weight=self.w, pos_weight=self.pw) + F.binary_cross_entropy(torch.sigmoid(x), y, weight=self.w, reduction='sum')", f"4 * {R}(6, 10), torch.rand(6, 10)", "self.register_buffer('w', torch.rand(10))\nself.register_buffer('pw', 3 * torch.rand(10))", params="x, y"), None),  # noqa: E501
    "class_margin_losses": (_problem("F.multi_margin_loss(x, t) + F.multi_margin_loss(x, t, p=2, margin=0.5, weight=self.w, reduction='none').sum() + F.multilabel_soft_margin_loss(x, y, weight=self.w)", f"{R}(6, 10), torch.randint(0, 10, (6,)), torch.randint(0, 2, (6, 10)).float()", "self.register_buffer('w', torch.rand(10))", params="x, t, y"), None),  # noqa: E501
    "vector_products": (_problem("torch.mv(x, v) + x @ v + torch.addmv(b, x, v, beta=0.5, alpha=2.0) + torch.dot(v, v) + (v @ x.t()).sum() + torch.inner(v, v)", f"{R}(6, 10), {R}(10), {R}(6)", params="x, v, b"), None),  # noqa: E501
    "addbmm": (_problem("torch.addbmm(b, x, y, beta=0.5) + 1.0", f"{R}(3, 4, 5), {R}(3, 5, 6), {R}(4, 6)", params="x, y, b"), None),  # noqa: E501
    "weight_norm_conv1d": (_problem("torch.relu(self.c(x))", f"{R}(2, 4, 12)", "self.c = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=2, dilation=2))"), None),  # noqa: E501
    "nll_loss_sum": (_problem("F.nll_loss(torch.log_softmax(x, 1), t, reduction='sum')", f"{R}(6, 10), torch.randint(0, 10, (6,))", params="x, t"), None),  # noqa: E501
    "triplet_margin_module": (_problem("self.loss(a, p, n)", f"{R}(6, 10), {R}(6, 10), {R}(6, 10)", "self.loss = nn.TripletMarginLoss(margin=0.5)", params="a, p, n"), None),  # noqa: E501
    "cosine_similarity": (_problem("F.cosine_similarity(x, y, dim=1)", f"{R}(6, 10), {R}(6, 10)", params="x, y"), None),  # noqa: E501
    "attention": (_problem("F.scaled_dot_product_attention(q, k, v)", f"{R}(2, 3, 10), {R}(2, 4, 10), {R}(2, 4, 6)", params="q, k, v"), None),  # noqa: E501
    "attention_causal": (_problem("F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1.0", f"{R}(2, 3, 5, 8), {R}(2, 3, 7, 8), {R}(2, 3, 7, 4)", params="q, k, v"), None),  # noqa: E501
    "attention_bool_mask": (_problem("F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)", f"{R}(2, 5, 8), {R}(2, 6, 8), {R}(2, 6, 4), torch.rand(5, 6) > 0.3", params="q, k, v, m"), None),  # noqa: E501
    "attention_float_mask": (_problem("F.scaled_dot_product_attention(q, k, v, attn_mask=m)", f"{R}(2, 5, 8), {R}(2, 6, 8), {R}(2, 6, 4), {R}(2, 5, 6)", params="q, k, v, m"), None),  # noqa: E501
    "attention_grouped_query_heads": (_problem("F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)", f"{R}(2, 6, 5, 8), {R}(2, 2, 5, 8), {R}(2, 2, 5, 4)", params="q, k, v"), None),  # noqa: E501
    "joint_index_pick": (_problem("-x.log_softmax(-1)[torch.arange(x.shape[0], device=x.device), t].mean() + y[:, i, j].sum()", f"{R}(6, 10), torch.randint(0, 10, (6,)), {R}(2, 5, 7, 3), torch.randint(-5, 5, (4, 1)), torch.randint(0, 7, (1, 3))", params="x, t, y, i, j"), None),  # noqa: E501
    "cosine_similarity_broadcast": (_problem("F.cosine_similarity(x.unsqueeze(1), y.unsqueeze(0), dim=-1)", f"{R}(6, 10), {R}(5, 10)", params="x, y"), None),  # noqa: E501
    "normalize_p_norms": (_problem("F.normalize(x, p=1, dim=-1) + F.normalize(x, p=float('inf'), dim=0) + F.normalize(x, p=3)", f"{R}(6, 10)"), None),  # noqa: E501
    "interpolate_area_trilinear_nearest_exact": (_problem("F.interpolate(x, size=(2, 3, 2), mode='area').sum() + F.interpolate(x, scale_factor=2, mode='trilinear').sum() + F.interpolate(x, scale_factor=3, mode='nearest-exact')[:, :, :4, :5, :6]", f"{R}(2, 3, 4, 5, 6)"), None),  # noqa: E501
    "matmul_batches_broadcast_in_part": (_problem("(x @ y) + torch.matmul(w, x.transpose(-1, -2)).sum()", f"{R}(2, 1, 5, 7), {R}(3, 7, 4), {R}(3, 4, 7)", params="x, y, w"), None),  # noqa: E501
    "einsum_broadcast_matmul": (_problem("torch.einsum('bijl,lk->bijk', x, w)", f"{R}(2, 3, 4, 5), {R}(5, 6)", params="x, w"), None),  # noqa: E501
    "einsum_transposed": (_problem("torch.einsum('bij,bkj->bik', x, y)", f"{R}(2, 3, 10), {R}(2, 4, 10)", params="x, y"), None),  # noqa: E501
    "inverted_bool_mask": (_problem("x.masked_fill(~(x > 0.5), 0.0) * 2.0", f"{R}(6, 40)"), None),  # noqa: E501
    "glu_last_dim": (_problem("F.glu(x) * 2.0", f"{R}(4, 10)"), None),
    "glu_module_channels": (_problem("self.g(torch.tanh(x)) + 1.0", f"{R}(2, 6, 5)", "self.g = nn.GLU(dim=1)"), None),  # noqa: E501
    "normalize": (_problem("F.normalize(x, dim=-1) * 2.0 + F.normalize(x, dim=0, eps=0.5)", f"{R}(6, 10)"), None),  # noqa: E501
    "pixel_shuffle_module": (_problem("torch.tanh(self.ps(x)) + 1.0", f"{R}(2, 12, 3, 5)", "self.ps = nn.PixelShuffle(2)"), None),  # noqa: E501
    "pixel_unshuffle": (_problem("F.pixel_unshuffle(x * 2.0, 3)", f"{R}(2, 2, 6, 9)"), None),  # noqa: E501
    "nearest_upsample_2d": (_problem("F.interpolate(torch.relu(x), scale_factor=2) - 1.0", f"{R}(2, 3, 4, 5)"), None),  # noqa: E501
    "nearest_upsample_module_size": (_problem("self.up(x) * 3.0", f"{R}(2, 3, 4, 5, 3)", "self.up = nn.Upsample(size=(8, 20, 6), mode='nearest')"), None),  # noqa: E501
    "nearest_upsample_1d_mixed": (_problem("F.interpolate(x, scale_factor=4.0, mode='nearest')", f"{R}(2, 3, 7)"), None),  # noqa: E501
    "bilinear_upsample": (_problem("torch.relu(F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False)) + 1.0", f"{R}(2, 3, 5, 6)"), None),  # noqa: E501
    "bilinear_size_align_corners": (_problem("self.up(x)", f"{R}(2, 3, 5, 6)", "self.up = nn.Upsample(size=(9, 13), mode='bilinear', align_corners=True)"), None),  # noqa: E501
    "linear_downsample_1d": (_problem("F.interpolate(x, size=5, mode='linear') * 2.0", f"{R}(2, 3, 11)"), None),  # noqa: E501
    "bicubic_upsample": (_problem("F.interpolate(x, scale_factor=2, mode='bicubic', align_corners=False) + 1.0", f"{R}(2, 3, 5, 6)"), None),  # noqa: E501
    "bicubic_size_align_corners": (_problem("self.up(torch.relu(x))", f"{R}(2, 3, 5, 6)", "self.up = nn.Upsample(size=(9, 4), mode='bicubic', align_corners=True)"), None),  # noqa: E501
    # ---- pointwise ops added from sweeps
    "pointwise_grid_stride_capped": (_problem("torch.sigmoid(x) * y + 1.0", f"{R}(6, 40), {R}(6, 40)", params="x, y"), Tuning(default=KernelTuning(grid_waves=32))),  # noqa: E501
    "shrinks_and_frac": (_problem("F.softshrink(x, 0.3) + F.hardshrink(x, 0.7) + torch.frac(x * 3.0)", f"{R}(4, 33)"), None),  # noqa: E501
}


def _generate(source: str, tuning: Tuning | None = None) -> tuple[Any, Any]:
    task = load_task(source)
    ir = capture_program(task)
    cand = emit_candidate(ir, plan_program(ir), tuning=tuning)
    return task, cand


@pytest.mark.parametrize("name", list(CASES))
def test_generated_program_matches_pytorch(name: str, tmp_path: Path) -> None:
    source, tuning = CASES[name]
    task, cand = _generate(source, tuning)
    assert not cand.declared_torch_ops, cand.declared_torch_ops
    assert "left to PyTorch" not in cand.notes, cand.notes
    report = check_candidate(cand, reference_source=task.source)
    assert not report.rejected, [f.detail for f in report.findings]
    assert "torch.ops" not in cand.host_source
    check_on_cpu(task, cand, tmp_path, cooperative=True)


@pytest.mark.parametrize(("name", "chunks"), [
    ("cumsum_in_chunks", 4), ("logcumsumexp_in_chunks", 3), ("cumprod_in_chunks_forced", 2),
    ("cumsum_inner_dim", 0),  # 37 long: a thread a line
])
def test_few_long_lines_are_scanned_in_chunks(name: str, chunks: int) -> None:
    source, tuning = CASES[name]
    kernels = _generate(source, tuning)[1].kernel_source
    assert (f"{chunks} chunks a line" in kernels) == bool(chunks)
    assert ("chunks a line" in kernels) == bool(chunks)


@pytest.mark.parametrize(("name", "step"), [
    ("cumsum_warp_per_line", "four runs of 32"), ("logcumsumexp_cummax_warp_runs", "four runs of 32"),
    ("cumsum_warp_32_a_step", "32 elements a step"),
])
def test_a_warp_scans_a_line_in_runs_of_32(name: str, step: str) -> None:
    source, tuning = CASES[name]
    assert step in _generate(source, tuning)[1].kernel_source


def test_a_long_cumsum_carries_in_double(tmp_path: Path) -> None:
    """20000 positive terms a line: the float32 carry of 625 steps drifts by many of the
    output's ulps; the double carry stays within one of the float64 sum."""
    source = _problem("torch.cumsum(x, dim=1)", "torch.rand(2, 20000)")
    task, cand = _generate(source)
    assert "double carry" in cand.kernel_source
    _, host, _ = load_on_cpu(task, cand, tmp_path, cooperative=True)
    x = torch.rand(2, 20000)
    got = host["ModelNew"]()(x)
    exact = torch.cumsum(x.double(), dim=1)
    ulp = torch.finfo(torch.float32).eps * exact.abs().max().item()
    assert (got.double() - exact).abs().max().item() <= ulp


def test_conv_scratch_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Transposed and 3-D convolutions whose scratch exceeds the budget run image by image."""
    monkeypatch.setattr(conv_mod, "_CONV_SCRATCH_BYTES", 4000)
    for i, (init, shape, expr) in enumerate([
        ("nn.ConvTranspose2d(20, 6, 3, stride=2, padding=1)", "3, 20, 5, 6", "torch.tanh(self.c(x))"),  # noqa: E501
        ("nn.ConvTranspose3d(16, 3, 2, stride=2)", "3, 16, 2, 3, 4", "self.c(x)"),
        ("nn.Conv3d(20, 6, 3, padding=1)", "3, 20, 4, 7, 8", "self.c(x)"),
    ]):
        problem = _problem(expr, f"{R}({shape})", f"self.c = {init}")
        task, cand = _generate(problem, _GENERATED_CONV)
        assert "for _n0 in range(" in cand.host_source
        (tmp_path / str(i)).mkdir()
        check_on_cpu(task, cand, tmp_path / str(i), cooperative=True)


def test_global_pool_becomes_a_reduction() -> None:
    task = load_task(_problem("self.p(x)", f"{R}(2, 3, 4, 5)", "self.p = nn.AdaptiveAvgPool2d(1)"))
    ir = capture_program(task)
    assert [n.op for n in ir.nodes] == ["mean"]
    assert ir.nodes[0].args["dim"] == [-2, -1] and ir.nodes[0].args["keepdim"] is True


def test_unknown_ops_stay_in_pytorch_declared(tmp_path: Path) -> None:
    source = _problem(
        "y = torch.median(x, dim=-1)[1].float()\n"  # median's indices stay in PyTorch
        "return torch.relu(torch.digamma(y.abs() + 1)) + torch.mode(x, dim=1)[1].sum()",
        f"{R}(4, 9)",
    )
    task, cand = _generate(source)
    assert {"median", "digamma", "mode"} <= set(cand.declared_torch_ops)
    report = check_candidate(cand, reference_source=task.source)
    assert not report.rejected, [f.detail for f in report.findings]
    check_on_cpu(task, cand, tmp_path, cooperative=True)  # the declared ops' operands are kept


@pytest.mark.parametrize(
    "call",
    [
        "F.interpolate(x, scale_factor=2, mode='bicubic', antialias=True)",
        "F.interpolate(x, scale_factor=2, mode='bilinear', antialias=True)",
    ],
)
def test_calls_a_decomposition_does_not_reproduce_stay_in_pytorch(call: str, tmp_path: Path) -> None:  # noqa: E501
    task, cand = _generate(_problem(f"{call} * 2.0", f"{R}(2, 3, 4, 5)"))
    assert cand.declared_torch_ops and set(cand.declared_torch_ops) <= {"interpolate", "normalize"}
    check_on_cpu(task, cand, tmp_path, cooperative=True)


def test_an_item_that_fails_to_emit_stays_in_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("emitter bug")

    monkeypatch.setattr(emit_mod._Emitter, "reduction", broken)
    task, cand = _generate(_problem("torch.relu(x).sum(dim=1) * 2.0", f"{R}(4, 9)"))
    assert "sum" in cand.declared_torch_ops
    assert "left to PyTorch: RuntimeError: emitter bug" in cand.notes


@pytest.mark.parametrize(
    "body",
    [
        "b = x * 2\nc = b.view(-1)\nb += 1\nreturn c",
        "b = x * 2\nc = b[1:3]\nb.mul_(3)\nreturn c * 1.0",
        "b = x - 0.5\nc = b.t()\ntorch.relu_(b)\nreturn c + 1.0",
        "b = x * 2\nv = b[0]\nw = b.view(-1)\nv.add_(1)\nreturn w * 1.0",
        "b = x * 2\nparts = b.chunk(2, dim=1)\nb += 1\nreturn parts[0] * 1.0",
    ],
)
def test_writes_through_views_are_refused_clearly(body: str) -> None:
    """A view and its base share a storage the pure IR cannot: a write to one is refused when
    the other is read later, never lowered to a program that reads the old values."""
    from stitch_graph.codegen import CaptureError

    with pytest.raises(CaptureError, match="in-place|assignment"):
        capture_program(load_task(_problem(body, f"{R}(4, 8)")))


def test_odd_arguments_make_an_op_unsupported_not_an_exception() -> None:
    source = _problem("torch.nn.functional.adaptive_max_pool2d(x, (2, 2), return_indices=True)[1].float()", f"{R}(1, 2, 4, 4)")  # noqa: E501
    task, cand = _generate(source)
    assert cand.declared_torch_ops  # with indices: left to PyTorch, named
    plan = plan_program(capture_program(task))
    assert any("max_pool2d" in reason for reason in plan.unsupported_ops)


def _one_translation_unit(sources: list[str]) -> str:
    units = []
    for i, source in enumerate(sources):
        assert source.startswith(PRELUDE)
        body = source[len(PRELUDE) :].replace('extern "C" __global__', "__global__")
        units.append(f"namespace g{i} {{\n{body}\n}}\n")
    return PRELUDE + "\n".join(units)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_every_case_compiles_with_nvcc() -> None:
    sources = [_generate(source, tuning)[1].kernel_source for source, tuning in CASES.values()]
    result = nvcc_compile(_one_translation_unit(sources))
    assert result.ok, [d.message for d in result.errors][:5]
    assert not re.search(r"\bspill", " ".join(d.message for d in result.diagnostics))


_TENSOR_ATTRIBUTE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(24, 8)
        self.hidden = torch.randn(4, 8)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        return self.lin(torch.cat((x, self.hidden), dim=1))


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_a_trace_that_falls_back_prints_no_traceback(capsys, tmp_path: Path) -> None:
    """A plain tensor attribute fails fx's shape propagation, which prints the failing node's
    traceback itself; capture falls back to torch.export without that noise on stderr."""
    task = load_task(_TENSOR_ATTRIBUTE)
    program = emit_candidate(capture_program(task), plan_program(capture_program(task)))
    assert "Traceback" not in capsys.readouterr().err
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_model_whose_trace_falls_back_is_built_on_the_cpu_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The tensor attribute needs real values, so the model is built on the CPU (a vanilla
    RNN's weights: 2 GB); when fx's graph does not run, the export that follows takes that
    model back as it was built instead of building it again. The values stay right."""
    from stitch_graph.codegen import capture

    devices: list[str] = []
    build = capture._build_model

    def counted(namespace, init_args, device):  # noqa: ANN001, ANN202
        devices.append(device)
        return build(namespace, init_args, device)

    monkeypatch.setattr(capture, "_build_model", counted)
    task = load_task(_TENSOR_ATTRIBUTE)
    ir = capture_program(task)
    assert devices.count("cpu") == 1, devices
    monkeypatch.undo()
    check_on_cpu(task, emit_candidate(ir, plan_program(ir)), tmp_path, cooperative=True)
