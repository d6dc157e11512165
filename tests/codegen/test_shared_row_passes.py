"""Reductions of the same rows that different kernels read are taken in one pass: their results
concatenated, each reader reading its slice, or one stored beside the other's
(``_fusion_passes.join_row_passes``). Every case matches PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _capture_shared_rows, capture_program, plan_program, schedule
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x, t):
        {body}


def get_inputs():
    return [torch.randn(6, 40), torch.randint(0, 40, (6,))]


def get_init_inputs():
    return []
"""

# a standardisation per sample whose statistics are read apart
_STANDARDIZE = """d = tuple(range(1, x.dim()))
        m = x.mean(d, keepdim=True)
        return (x - m) / (x.std(d, keepdim=True) + 1e-5)"""
# a channels-first layer norm: one kernel reads the rows once and writes them normalised
_LAYER_NORM = """u = x.mean(1, keepdim=True)
        return (x - u) / torch.sqrt((x - u).pow(2).mean(1, keepdim=True) + 1e-5)"""

SHARED = [
    # a label-smoothed cross entropy: the logsumexp is read by both terms
    """lp = F.log_softmax(x, dim=-1)
        nll = -lp.gather(-1, t[:, None]).squeeze(1)
        return (0.9 * nll - 0.1 * lp.mean(-1)).mean()""",
    "return x.mean(1), x.std(1)",  # statistics returned apart
    _STANDARDIZE,
]
KEPT = [
    "return x.mean(1) - x.amax(1)",  # one reader of both: siblings already
    "return x.mean(1), x.amax(0)",  # other rows
]


def _passes_over_x(task) -> int:  # noqa: ANN001
    items = plan_program(capture_program(task)).items
    return sum(item.kind == "reduction" and "x" in item.shapes for item in items)


@pytest.mark.parametrize(("body", "shared"), [(b, True) for b in SHARED] + [(b, False) for b in KEPT])
def test_reductions_of_the_same_rows_read_apart_share_one_pass(
    body: str, shared: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_capture_shared_rows, "_LARGE", 0)  # the emulation's inputs are small
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_SMALL", 0)  # ... too small to matter else
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops
    plan = plan_program(capture_program(task))
    concatenated = any("siblings" in i.fusion and "epilogue cat" in i.fusion for i in plan.items)
    if shared:  # one pass: results concatenated, or one stored beside the other's
        assert _passes_over_x(task) == 1, [item.fusion for item in plan.items]
    else:
        assert not concatenated, [item.fusion for item in plan.items]
    check_on_cpu(task, program, tmp_path, cooperative=True)


# a standardisation per sample whose statistics are read apart: one pass at any size (the
# scheduler joins them; concatenating at capture was weighed by the estimate); a layer norm
# written by hand is its mean and variance, siblings of one pass already
@pytest.mark.parametrize(
    ("body", "shape"),
    [(_STANDARDIZE, (128, 64, 64, 64)), (_STANDARDIZE, (6, 40)), (_LAYER_NORM, (32, 96, 64, 64))],
)
def test_statistics_read_apart_share_a_pass(body: str, shape: tuple) -> None:
    from stitch_graph.task import load_task

    source = _PROBLEM.format(body=body).replace("torch.randn(6, 40)", f"torch.randn{shape}")
    assert _passes_over_x(load_task(source)) == 1
