"""Reductions of the same rows that read an earlier one's per-row result, taken in one kernel
(``_fusion_row_stages``): a label-smoothing term ``mean(x - lse)``, an entropy of a softmax, a
softmax written by hand and reduced again. Checked on the CPU with CUDA's block semantics
(``cooperative=True``); ``generate_checked`` compiles every program with nvcc where installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, groups_from_plan, plan_program, schedule
from stitch_graph.codegen._fusion_row_stages import stages
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
{body}


def get_inputs():
    return [torch.randn({shape}) * 3.0]


def get_init_inputs():
    return []
"""


def _source(body: str, shape: tuple[int, ...]) -> str:
    lines = "\n".join(f"        {line}" for line in body.strip().splitlines())
    return _PROBLEM.format(body=lines, shape=", ".join(map(str, shape)))


SMOOTHING = """
lse = torch.logsumexp(x, dim=-1)
smooth = -(x - lse.unsqueeze(-1)).mean(dim=-1)
return 0.9 * smooth + 0.1 * lse.pow(2)
"""

ENTROPY = """
p = F.softmax(x / 0.7, dim=-1)
return -(p * torch.log(p + 1e-9)).sum(-1)
"""

THREE_STAGES = """
m = x.amax(-1, keepdim=True)
s = (x - m).abs().sum(-1, keepdim=True)
return ((x - m) / s).pow(2).sum(-1) + m.squeeze(-1)
"""

# SupCon's shape: the last stage sums a mask beside the masked log-probabilities, a sum that
# reads no earlier stage, and the mask is computed there, for both
MASKED_LOG_PROBS = """
n = x.shape[0]
labels = (x[: n // 2, 0] > 0).long()
logits = x @ x.T
logits = logits - logits.max(dim=1, keepdim=True)[0]
mask = torch.eq(labels.view(-1, 1), labels.view(1, -1)).float().repeat(2, 2)
keep = torch.scatter(torch.ones_like(mask), 1, torch.arange(n).view(-1, 1), 0)
mask = mask * keep
log_prob = logits - torch.log((torch.exp(logits) * keep).sum(1, keepdim=True))
return (mask * log_prob).sum(1) / mask.sum(1).clamp_min(1.0)
"""

CONFIDENCE = """
confidence, predicted = torch.max(F.softmax(x, dim=1), 1)
return confidence * 2.0, predicted
"""

# (body, shape, stages): rows long enough for a block each, and short ones several to a warp,
# their count not a multiple of the rows a block takes (lanes past the last row)
CASES: dict[str, tuple[str, tuple[int, ...], int]] = {
    "smoothing": (SMOOTHING, (24, 1000), 2),
    "smoothing_short_rows": (SMOOTHING, (333, 40), 2),
    "entropy": (ENTROPY, (6, 4, 257), 2),
    "three_stages": (THREE_STAGES, (50, 96), 3),
    "confidence": (CONFIDENCE, (37, 300), 2),
    "masked_log_probs": (MASKED_LOG_PROBS, (128, 16), 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_staged_reductions_read_the_rows_in_one_kernel_and_match_pytorch(
    name: str, tmp_path: Path
) -> None:
    body, shape, count = CASES[name]
    task, program = generate_checked(_source(body, shape))
    ir = capture_program(task)
    staged = [g for g in schedule.schedule_program(ir) if g.before is not None]
    assert staged and len(stages(staged[0])) == count
    assert "after the first from cache" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert staged[0].id in " ".join(kernels.launched)


def test_the_plan_rebuilds_the_stages() -> None:
    ir = capture_program(load_task(_source(THREE_STAGES, (50, 96))))
    plan = plan_program(ir)
    scheduled = {g.id: g for g in schedule.schedule_program(ir)}
    (item,) = [i for i in plan.items if i.stages]
    assert len(item.stages) == 3  # the plan names each stage's anchors
    for group in groups_from_plan(ir, plan):
        mine = scheduled[group.id]
        assert group.members == mine.members
        assert [s.anchors for s in stages(group)] == [s.anchors for s in stages(mine)]
        assert [s.prologue for s in stages(group)] == [s.prologue for s in stages(mine)]


def test_a_result_read_per_element_or_over_other_rows_is_not_staged() -> None:
    rewritten = "return x - torch.logsumexp(x, -1, keepdim=True)"  # a row rewrite, no reduction
    other_rows = "m = x.amax(0, keepdim=True)\nreturn (x - m).sum(-1)"  # columns, then rows
    for body in (rewritten, other_rows):
        ir = capture_program(load_task(_source(body, (64, 96))))
        assert all(g.before is None for g in schedule.schedule_program(ir)), body


def test_a_plan_whose_stages_cannot_be_rebuilt_says_so() -> None:
    """Without the stages it names, the rebuilt first stage would compute the mask the last
    one reads: an error that says to re-plan, never a program that reads what no kernel
    stored."""
    ir = capture_program(load_task(_source(MASKED_LOG_PROBS, (128, 16))))
    plan = plan_program(ir)
    for item in plan.items:
        item.stages = []
    with pytest.raises(ValueError, match="re-plan"):
        groups_from_plan(ir, plan)

