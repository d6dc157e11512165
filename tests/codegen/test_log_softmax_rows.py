"""A ``log_softmax`` read only by gathers and row sums or means along its dim is written from
the row's logsumexp (no log-probability tensor is stored); one read another way keeps the
tensor. Every case matches PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, plan_program
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x, t):
        {body}


def get_inputs():
    return [torch.randn(8, 50, 30), torch.randint(0, 50, (8, 30))]


def get_init_inputs():
    return []
"""

FROM_LSE = [
    # a label-smoothed cross entropy written by hand
    """logp = F.log_softmax(x, dim=1)
        nll = -logp.gather(1, t[:, None, :]).squeeze(1)
        return (0.9 * nll - 0.1 * logp.mean(dim=1)).mean()""",
    # an NLL of the picked log-probabilities, a kept-dim sum beside it
    """lp = x.log_softmax(1)
        return lp.sum(1, keepdim=True) * 2 + lp.gather(1, t[:, None, :])""",
    "return -torch.log_softmax(x.transpose(1, 2), -1).gather(-1, t[..., None]).mean()",
]
KEPT = [
    """lp = torch.log_softmax(x, 1)
        return lp, lp.mean(1)""",  # returned as well
    """lp = F.log_softmax(x, dim=1)
        return lp.mean(dim=(1,)) + lp.sum(2)[:, :30]""",  # a sum along another dim
    "return (F.log_softmax(x, 1) * F.softmax(x, 1)).sum(1)",  # a product
]


@pytest.mark.parametrize(("body", "rewritten"), [(b, True) for b in FROM_LSE] + [(b, False) for b in KEPT])  # noqa: E501
def test_log_softmax_read_by_gathers_and_row_sums_comes_from_the_logsumexp(
    body: str, rewritten: bool, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops
    anchors = {item.fusion.split(" (")[0] for item in plan_program(capture_program(task)).items}
    assert ("anchor log_softmax" not in anchors) is rewritten, anchors
    check_on_cpu(task, program, tmp_path, cooperative=True)
