"""Attention fused into one kernel (``_fusion_attention``, ``_emit_attention``): the scores,
their chain, the softmax and the product with the values, matched against PyTorch in the
cooperative CPU emulation, fused and unfused; what is not an attention stays as it was."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from stitch_graph.codegen._emit_attention import _tiles
from stitch_graph.codegen.tuning import KernelTuning
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_FUNCTIONAL = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("keep", torch.tril(torch.ones(70, 70, dtype=torch.bool)))

    def forward(self, q, k, v, bias):
        {body}


def get_inputs():
    return [torch.randn({q}), torch.randn({k}), torch.randn({v}), torch.randn({bias})]


def get_init_inputs():
    return []
"""

CASES = {
    # SDPA's causal mask, fewer queries than keys, values narrower than keys: tiles skipped
    "causal": (
        "return F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        "2, 3, 50, 16", "2, 3, 70, 16", "2, 3, 70, 24", "1",
    ),
    # an additive mask broadcast over the batch, and an epilogue on the product
    "additive": (
        "return F.scaled_dot_product_attention(q, k, v, attn_mask=bias) * 2.0 + 1.0",
        "2, 2, 33, 64", "2, 2, 40, 64", "2, 2, 40, 64", "1, 2, 33, 40",
    ),
    # a bool buffer's triangle hides keys, a ReLU instead of a softmax: no normalisation
    "relu": (
        "s = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))\n"
        "        s = s.masked_fill(~self.keep[:70, :70], float('-inf'))\n"
        "        return F.relu(s) @ v",
        "2, 4, 70, 12", "2, 4, 70, 12", "2, 4, 70, 12", "1",
    ),
    # batched products of three-dimensional tensors, keys shared by the batch (broadcast)
    "bmm": (
        "return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 3.0, dim=-1,"
        " dtype=torch.float32) @ v",
        "3, 7, 30", "70, 30", "3, 70, 20", "1",
    ),
    # q scaled and k rotated (a rotary embedding) by kernels of their own before: computed
    # where the attention kernel loads them
    "operands": (
        "q2 = q * 0.125\n"
        "        k2 = k * torch.cos(bias) + torch.cat((-k[..., 8:], k[..., :8]), -1) * torch.sin(bias)\n"
        "        return torch.softmax(q2 @ k2.transpose(-2, -1), dim=-1) @ v",
        "2, 3, 40, 16", "2, 3, 50, 16", "2, 3, 50, 16", "50, 16",
    ),
    # a sliding causal window built before the scores: computed with their chain
    "early_mask": (
        "at = torch.arange(70)\n"
        "        keep = (at[:, None] >= at[None, :]) & (at[:, None] - at[None, :] < 16)\n"
        "        s = (q @ k.transpose(-2, -1)) * 0.25\n"
        "        return torch.softmax(s.masked_fill(~keep, float('-inf')), dim=-1) @ v",
        "2, 2, 70, 16", "2, 2, 70, 16", "2, 2, 70, 16", "1",
    ),
    # a head's gate on the probabilities (computed in the kernel from an input): applied to
    # each tile's unnormalised probabilities
    "gate": (
        "s = (q @ k.transpose(-2, -1)).masked_fill(~self.keep, float('-inf'))\n"
        "        return (torch.softmax(s, dim=-1) * torch.sigmoid(bias) / 2.0) @ v",
        "2, 3, 70, 16", "2, 3, 70, 16", "2, 3, 70, 24", "1, 3, 1, 1",
    ),
    # ALiBi: a bias from integer positions (key - query) in the chain, and v read through a
    # transpose cuBLAS cannot batch (its copy, written after the scores, computed on load)
    "alibi": (
        "pos = torch.arange(70)\n"
        "        rel = (pos[None, :] - pos[:, None]).to(q.dtype)\n"
        "        s = (q @ k.transpose(-2, -1)) * 0.25 + bias.view(-1, 1, 1) * rel\n"
        "        s = s.masked_fill(~self.keep, float('-inf'))\n"
        "        return torch.softmax(s, dim=-1) @ v.transpose(1, 2)",
        "2, 3, 70, 16", "2, 3, 70, 16", "2, 70, 3, 16", "3",
    ),
    # rows of 128: fewer queries a block fit in shared memory
    "wide": (
        "return torch.softmax(q @ k.transpose(-1, -2) * 0.05 + bias, dim=-1) @ v",
        "2, 40, 128", "2, 45, 128", "2, 45, 96", "2, 40, 45",
    ),
}


def _source(case: str) -> str:
    body, q, k, v, bias = CASES[case]
    return _FUNCTIONAL.format(body=body, q=q, k=k, v=v, bias=bias)


def _library_products(host: str) -> int:
    """How many cuBLAS calls the host code makes."""
    return len(re.findall(r"^\s+_sgemm\(", host, re.M))


def _kinds(source: str) -> list[str]:
    from stitch_graph.codegen import capture_program
    from stitch_graph.codegen.schedule import schedule_program
    from stitch_graph.task import load_task

    return [g.kind for g in schedule_program(capture_program(load_task(source)))]


_MASKED = ("alibi", "causal", "early_mask", "gate", "relu")  # a mask hides whole tiles of keys: fused by default


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_is_one_kernel_and_matches_pytorch(case: str, tmp_path: Path) -> None:
    from stitch_graph.codegen.tuning import KernelTuning, Tuning

    source = _source(case)
    assert _kinds(source) == ["attention"]
    fused = Tuning(default=KernelTuning(fused_attention=True))
    task, program = generate_checked(source, fused)
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
    assert _library_products(program.host_source) == 0
    skips = "__syncthreads_or" in program.kernel_source
    assert skips == (case in _MASKED)


@pytest.mark.parametrize("case", sorted(CASES))
def test_by_default_only_masked_attention_is_one_kernel(case: str, tmp_path: Path) -> None:
    """Unmasked, the three kernels (and the operands' own kernels) run by default."""
    task, program = generate_checked(_source(case))
    check_on_cpu(task, program, tmp_path, cooperative=True)
    assert _library_products(program.host_source) == (0 if case in _MASKED else 2)


def test_unfused_attention_is_the_three_kernels_it_replaced(tmp_path: Path) -> None:
    from stitch_graph.codegen import capture_program, plan_program
    from stitch_graph.codegen.tuning import KernelTuning, Tuning
    from stitch_graph.task import load_task

    source = _source("causal")
    plan = plan_program(capture_program(load_task(source)))
    (item,) = [i.id for i in plan.items if i.kind == "gemm" and len(i.ops) > 3]
    unfused = Tuning(kernels={item: KernelTuning(fuse=False)})
    task, program = generate_checked(source, unfused)
    assert "__syncthreads_or" not in program.kernel_source
    assert _library_products(program.host_source) == 2
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_plan_item_of_an_attention_is_read_back_as_one() -> None:
    from stitch_graph.codegen import capture_program, plan_program
    from stitch_graph.codegen.schedule import groups_from_plan, schedule_program
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_source("additive")))
    assert groups_from_plan(ir, plan_program(ir)) == schedule_program(ir)


@pytest.mark.parametrize(
    "body",
    [
        # the probabilities are returned: they must be stored
        "p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)\n        return p @ v, p",
        # a softmax over the queries is not attention's
        "return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v",
        # a gate that reads the probabilities themselves is not linear in them
        "p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)\n        return (p * p) @ v",
    ],
)
def test_what_is_not_an_attention_is_not_fused(body: str) -> None:
    source = _FUNCTIONAL.format(
        body=body, q="2, 30, 16", k="2, 40, 16", v="2, 40, 16", bias="1"
    )
    kinds = _kinds(source)
    assert "attention" not in kinds and "softmax" in kinds


def test_few_queries_over_many_keys_stay_three_kernels() -> None:
    """Two blocks would each walk 2048 keys alone: the GPU would idle."""
    source = _FUNCTIONAL.format(
        body="return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v",
        q="2, 16, 16", k="2, 2048, 16", v="2, 2048, 16", bias="1",
    )
    assert _kinds(source) == ["gemm", "softmax", "gemm"]


@pytest.mark.parametrize("rows", [16, 32])
def test_fewer_queries_a_block_as_tuned(rows: int, tmp_path: Path) -> None:
    from stitch_graph.codegen.tuning import KernelTuning, Tuning

    tuning = Tuning(default=KernelTuning(fused_attention=True, rows_per_block=rows))
    task, program = generate_checked(_source("causal"), tuning)
    assert f"__launch_bounds__({rows * 2})" in program.kernel_source  # 8 lanes a 4-row group
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(("rows", "split"), [(16, True), (32, False)])
def test_keys_and_values_a_tile_each_where_both_fit(rows: int, split: bool, tmp_path: Path) -> None:
    """Rows of 128 keys and 96 values: at 16 queries a block the k and v tiles both fit (loaded
    together; a warp reads back its own probabilities after ``__syncwarp``), at 32 they share
    one (loaded in turn, four barriers a key tile)."""
    from stitch_graph.codegen.tuning import KernelTuning, Tuning

    tuning = Tuning(default=KernelTuning(fused_attention=True, rows_per_block=rows))
    task, program = generate_checked(_source("wide"), tuning)
    body = next(k for k in program.kernel_source.split('extern "C"') if "float sp[" in k)
    assert ("float sv[" in body) is split
    assert ("__syncwarp();" in body) is split
    assert body.count("__syncthreads();") == (2 if split else 4)
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("offset", [0, 1])
def test_tiles_load_float4s_where_the_operands_are_aligned(offset: int, tmp_path: Path) -> None:
    """Rows of 16 contiguous floats: whole float4s where q, k and v start on a 16-byte
    boundary, one float at a time where they do not (views one float into their inputs)."""
    # q, k and v viewed from flat inputs, one float into them where ``offset`` is 1
    sizes = {"q": (2, 3, 50, 16), "k": (2, 3, 70, 16), "v": (2, 3, 70, 24)}
    views = "\n        ".join(
        f"{n} = {n}[{offset}:{offset} + {math.prod(s)}].view{s}" for n, s in sizes.items()
    )
    flat = ", ".join(str(math.prod(s) + 1) for s in sizes.values())
    body = f"{views}\n        return F.scaled_dot_product_attention(q, k, v, is_causal=True)"
    source = _FUNCTIONAL.format(body=body, q=flat.split(", ")[0], k=flat.split(", ")[1],
                                v=flat.split(", ")[2], bias="1")
    from stitch_graph.codegen.tuning import KernelTuning, Tuning

    tuning = Tuning(default=KernelTuning(fused_attention=True))
    task, program = generate_checked(source, tuning)
    body = next(k for k in program.kernel_source.split('extern "C"') if "float sp[" in k)
    assert body.count("x = *reinterpret_cast<const float4*>") == 3  # q, k and v
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_attention_written_into_a_concatenation(tmp_path: Path) -> None:
    """The kernel stores its output into its slice of the concatenation that reads it."""
    source = _FUNCTIONAL.format(
        body="o = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        "        return torch.cat([o, q], dim=-1) * 2.0",
        q="2, 3, 40, 16", k="2, 3, 40, 16", v="2, 3, 40, 16", bias="1",
    )
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    assert "__syncthreads_or" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(("head", "lq", "entries", "rows"), [
    (80, 200, 20, 64),  # 80 blocks, one wave: the most rows (fewest rows idle gave 16, one warp)
    (64, 197, 768, 64),  # many waves: 4 x (64 + 32) rows of work against 7 x (32 + 32)
    (64, 17, 4000, 32),  # one block of 32 computes 17 rows with 15 idle; one of 64, 47 idle
    (128, 1024, 128, 32),  # 64 rows of 128 do not fit beside their tiles
])
def test_queries_a_block_by_default(head: int, lq: int, entries: int, rows: int) -> None:
    assert _tiles(head, head, lq, entries, KernelTuning())[0] == rows
