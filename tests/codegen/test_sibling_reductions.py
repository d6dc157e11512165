"""Sibling reductions: several reductions of the same rows taken in one pass over them.

A smooth-max pooling's logsumexp beside the row's mean, TripletMarginLoss's two distances from
one anchor, a standardisation's mean beside its std: each pair read its rows in two kernels.
The scheduler now joins reductions of the same dims of inputs of one shape where a pointwise
node combines them or a concatenation takes their results, and the kernel carries their
accumulators together (``SgPair``, ``SgTriple``), storing concatenated results into their slices. Checked on the CPU with CUDA's block semantics (``cooperative=True``);
``generate_checked`` compiles every program with nvcc where installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitch_graph.codegen import capture_program, groups_from_plan, plan_program, schedule
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, {names}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


@pytest.fixture(autouse=True)
def few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite rows in place at the row counts a CPU check can afford (the GPU wants 512)."""
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_ROWS", 1)


def _source(body: str, shape: tuple[int, ...], count: int = 1) -> str:
    names = ["x", "p", "n"][:count]
    inputs = ", ".join(f"torch.rand({', '.join(map(str, shape))})" for _ in names)
    return _PROBLEM.format(names=", ".join(names), body=body, inputs=inputs)


SMOOTH_MAX = "torch.logsumexp(x / 0.7, dim=-1) - x.mean(dim=-1)"

CASES: dict[str, tuple[str, tuple[int, ...], int, str]] = {
    "lse_beside_mean": (SMOOTH_MAX, (4, 8, 256), 1, "SgPair<SgLse, SgSum>"),
    "range_and_total": (
        "x.amax(-1) - x.amin(-1) + 0.5 * x.sum(-1)", (6, 100), 1, "SgTriple<SgMax, SgMin, SgSum>"
    ),
    "two_distances": ("F.triplet_margin_loss(x, p, n, margin=0.2)", (16, 96), 3,
                      "SgPair<SgSum, SgSum>"),
    "standardise": ("(x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)", (8, 130), 1,
                    "SgPair<SgSum, SgWelford>"),
    # a top value and its index (``torch.max(x, dim)``): a float and an int64 result
    "value_and_index": ("x.amax(-1) + x.argmax(-1).float()", (6, 100), 1,
                        "SgPair<SgMax, SgArgMax>"),
    # strided rows (channels of NCHW): outputs side by side, a thread or a tile of them each
    "channels": ("x.mean(1) * x.amax(1)", (2, 40, 8, 8), 1, "SgPair<SgSum, SgMax>"),
    "channels_tiled": ("x.mean(1) * x.amax(1)", (2, 256, 4, 4), 1, "SgPair<SgSum, SgMax>"),
    # few long rows: two stages, the workspace holding both accumulators
    "split_rows": ("x.sum(-1) + x.amax(-1)", (2, 65536), 1, "SgPair<SgSum, SgMax>"),
    "split_statistics": ("x.std(-1) / x.mean(-1)", (3, 65536), 1, "SgPair<SgWelford, SgSum>"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_siblings_read_the_rows_once_and_match_pytorch(name: str, tmp_path: Path) -> None:
    body, shape, count, accumulator = CASES[name]
    task, program = generate_checked(_source(body, shape, count))
    assert accumulator in program.kernel_source
    if name.startswith("split"):
        assert "stage 1 of a split reduction" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    reads = [k for k in kernels.launched if "_part" not in k]
    # one kernel reduces the rows; a loss's batch mean is a second reduction of its own
    assert len(reads) == (2 if name == "two_distances" else 1), kernels.launched


# results concatenated (CBAM's channel mean and max, a concatenated pooling, statistics pooling):
# one pass, each result stored into its slice of the concatenation
CONCATENATED = {
    "channel_mean_and_max": ("torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)", (2, 40, 8, 8)),  # noqa: E501
    "channel_tiles": ("torch.cat([x.mean(1, keepdim=True), torch.max(x, 1, keepdim=True)[0]], dim=1)", (2, 256, 4, 4)),  # noqa: E501
    "pooled_rows": ("torch.cat([x.mean((2, 3)), x.amax((2, 3))], 1)", (4, 8, 16, 16)),
    "three_on_dim0": ("torch.cat([x.amin(-1), x.amax(-1), x.sum(-1)], 0)", (6, 100)),
    "split_statistics": ("torch.cat([x.mean(-1), x.std(-1)], -1)", (2, 65536)),
}


@pytest.mark.parametrize("name", list(CONCATENATED))
def test_concatenated_siblings_store_their_slices_in_one_pass(name: str, tmp_path: Path) -> None:
    body, shape = CONCATENATED[name]
    task, program = generate_checked(_source(body, shape))
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    reads = [k for k in kernels.launched if "_part" not in k]
    assert len(reads) == 1, kernels.launched  # no kernel of its own for the concatenation
    assert "Sg" + ("Triple" if "three" in name else "Pair") in program.kernel_source


@pytest.mark.parametrize("tuning", [
    Tuning(default=KernelTuning(fuse=False)),
    Tuning(default=KernelTuning(rows_per_block=1, vector_width=1)),
    Tuning(default=KernelTuning(split_reduction=True)),
])
def test_concatenated_siblings_tuned_variants_stay_correct(tuning: Tuning, tmp_path: Path) -> None:
    body, shape = CONCATENATED["pooled_rows"]
    task, program = generate_checked(_source(body, shape), tuning)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_epilogue_may_read_the_other_sums_result(tmp_path: Path) -> None:
    """A calibration error's confidence and accuracy sums over the same rows, their difference
    taken by one's epilogue and the other also read elsewhere: one pass reads the rows."""
    body = "(x * 2.0).sum(0) - (x * x).sum(0), (x * x).sum(0) / 3.0"
    ir = capture_program(load_task(_source(body, (300, 15))))
    groups = [g for g in schedule.schedule_program(ir) if g.kind == "reduction"]
    assert len(groups) == 1 and len(groups[0].anchors) == 2, groups
    task, program = generate_checked(_source(body, (300, 15)))
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_concatenated_result_read_elsewhere_keeps_its_own_kernel(tmp_path: Path) -> None:
    body = "torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1) * x.mean(1, keepdim=True)"  # noqa: E501
    ir = capture_program(load_task(_source(body, (2, 40, 8, 8))))
    assert all(not g.siblings or ir.node(g.output).op != "cat" for g in schedule.schedule_program(ir))  # noqa: E501


def test_the_plan_names_the_siblings_and_rebuilds_them() -> None:
    ir = capture_program(load_task(_source(SMOOTH_MAX, (4, 8, 256))))
    plan = plan_program(ir)
    (item,) = [i for i in plan.items if i.kind == "reduction"]
    assert "siblings in the same pass mean" in item.fusion
    (group,) = [g for g in groups_from_plan(ir, plan) if g.kind == "reduction"]
    assert group.anchors == ["logsumexp", "mean"]
    assert group.prologue == ["truediv"]
    assert group.members == item.ops


@pytest.mark.parametrize("tuning", [
    Tuning(default=KernelTuning(fuse=False)),  # the tuner's unfused variant: a kernel each
    Tuning(default=KernelTuning(rows_per_block=1, vector_width=1)),  # a block a row, scalar
    Tuning(default=KernelTuning(split_reduction=True)),
])
def test_tuned_variants_stay_correct(tuning: Tuning, tmp_path: Path) -> None:
    task, program = generate_checked(_source(SMOOTH_MAX, (4, 8, 256)), tuning)
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    if not tuning.default.fuse:
        assert "SgPair" not in program.kernel_source.split("sg_warp_reduce")[-1]
        assert len(kernels.launched) >= 3  # prologue, two reductions, epilogue


@pytest.mark.parametrize("body", [
    "x.sum(-1) + x.sum(-2)",  # other dims
    "x.sum(-1) + x[:, :, :4].sum(-1)",  # other rows
    "x.argmax(-1) + x.amax(-1)",  # an index beside a value: not carried together
])
def test_reductions_of_other_rows_stay_apart(body: str, tmp_path: Path) -> None:
    task, program = generate_checked(_source(body, (3, 8, 8)))
    kernels = program.kernel_source.split("sg_warp_reduce")[-1]
    assert "SgPair" not in kernels and "SgTriple" not in kernels
    check_on_cpu(task, program, tmp_path, cooperative=True)


def _groups(body: str, shape: tuple[int, ...]) -> list[Any]:
    ir = capture_program(load_task(_source(body, shape)))
    return [g for g in schedule.schedule_program(ir) if g.kind == "reduction"]


def test_at_most_three_accumulators_ride_together() -> None:
    groups = _groups("x.sum(-1) + x.amax(-1) + x.amin(-1) + x.mean(-1)", (4, 32))
    assert sorted(len(g.anchors) for g in groups) == [1, 3]


def test_the_estimate_counts_an_input_that_siblings_reduce_once() -> None:
    """One pass reads the rows for every sibling: the scheduler's estimate of the kernel's bytes
    is the input once and the output, as for a single reduction of the same rows."""
    source = _PROBLEM.format(
        names="x", body="x.mean(1) - x.amax(1)", inputs="torch.randn(4096, 1024)"
    )
    ir = capture_program(load_task(source))
    (group,) = [g for g in schedule.schedule_program(ir) if g.siblings]
    nbytes, _ = schedule._bytes_and_flops(ir, group)
    assert nbytes == 4.0 * (4096 * 1024 + 4096)


# reductions of the same rows that nothing combines row by row, their results read apart:
# one pass, the earlier result stored beside (a loss's ``sum(p * t)`` and ``sum(p * log p)``)
JOINED = {
    "two_sums_read_apart": (
        "torch.stack([(x * p).sum(-1).mean(), -(x * torch.log(p + 0.1)).sum(-1).amax()])"
    ),
    "a_loss_and_its_entropy_returned": (
        "(F.softmax(x, -1) * p).sum(-1), (F.softmax(x, -1) * F.log_softmax(x, -1)).sum(-1)"
    ),
}


@pytest.mark.parametrize("name", sorted(JOINED))
def test_reductions_read_apart_share_one_pass(name: str, tmp_path: Path) -> None:
    source = _source(JOINED[name], (6, 40), count=2)
    ir = capture_program(load_task(source))
    groups = [g for g in schedule.schedule_program(ir) if g.kind == "reduction"]
    assert any(len(g.anchors) >= 2 for g in groups), [g.anchors for g in groups]
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_result_read_before_the_later_pass_keeps_its_own() -> None:
    # the first sum scales what the second sums: the second cannot run before it
    groups = _groups("(x * x.sum(-1, keepdim=True)).sum(-1) + x.amax(-1)", (4, 32))
    sums = [g for g in groups if "sum" in [o.split("_")[0] for o in g.anchors]]
    assert all(len(g.anchors) <= 2 for g in sums)
