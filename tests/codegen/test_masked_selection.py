"""Selections by a boolean mask that are only reduced (``loss[mask].mean()``, ``x[m].sum(0)``).

Their size depends on the data, so shape propagation on meta tensors stopped on them and the
whole problem failed to capture. Each is now the masked tensor with the unselected elements
filled (zero for a sum or a mean, an infinity for a max or a min), and a mean divides by the
mask's count; elementwise ops between the selection and the reduction are applied before it.
Every case must be fully generated and match PyTorch in the CPU emulation; a
selection put to another use fails with an error that says what to write instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import CaptureError, capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, y, m):
        {body}


def get_inputs():
    return [torch.randn(8, 6, 16), torch.rand(8, 6, 16), torch.rand(8, 6) > 0.4]


def get_init_inputs():
    return []
"""

CASES = {
    "masked_loss_mean": "l = (x - y) ** 2\n        return l[y > 0.3].mean()",
    "selection_sum_and_count": "d = (x - y).abs()\n        v = y > 0.5\n        return d[v].sum() / v.sum()",  # noqa: E501
    "masked_select_and_inverse": "k = x > 0\n        return torch.masked_select(y, k).mean() + torch.mean(y[~k])",  # noqa: E501
    "rows_mean_over_selection": "return x[m].mean(0) + x[m].sum(dim=0)",
    "extremes": "return x[x > 0.5].max() - torch.min(y[m]) + x[m].amax(0)",
    "empty_mask_sum": "return x[x > 100.0].sum() + y",
    # elementwise ops between the selection and its reduction (VICReg's off-diagonal term)
    "squared_then_summed": "return x[m].pow(2).sum() + (y[y > 0.2] * 2.0).abs().mean()",
    # torch.cov has no meta kernel: its steps, then a selection of its off-diagonal
    "covariance_off_diagonal": "c = torch.cov(x[0].T)\n        off = ~torch.eye(16, dtype=torch.bool)\n        return c[off].pow(2).sum() / 16",  # noqa: E501
    # torch.corrcoef tests a value on the host: its steps, the covariance over the deviations
    "correlation": "return torch.corrcoef(x[0].T) + x[1].T.corrcoef()",
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_reduced_selection_is_generated_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=CASES[name]))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("body", [
    "return torch.nonzero(x > 0).float().sum()",
    "return x[m].max(0).values",  # values and indices of the selected rows
    "return x[x > 0] * 2.0",  # the selection itself is the output
])
def test_a_size_from_the_data_is_refused_with_its_fix(body: str) -> None:
    with pytest.raises(CaptureError, match="torch.where"):
        capture_program(load_task(_PROBLEM.format(body=body)))
