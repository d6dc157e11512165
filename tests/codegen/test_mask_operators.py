"""``a & b``, ``a | b`` and ``a ^ b`` on masks make new masks and leave ``a`` as it was;
``a &= b`` and the like write ``a``, through a view into another mask too. fx traces
``a & b`` as ``operator.and_``, whose trailing underscore once read as an in-place write: every
later read of ``a`` then saw ``a & b``. On the ``torch.export`` path they are ATen's
``__and__`` and the like. Each checked against PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        {body}


def get_inputs():
    return [torch.randn(4, 64), torch.randn(4, 64)]


def get_init_inputs():
    return []
"""

BODIES = [
    """m = x > 0
        c = m & (y > 0)
        return x.masked_fill(m, 0.0) + c.float()""",
    """m = x > 0
        c = (m | (y > 1)) ^ (y < -1)
        return x.masked_fill(m, 0.0) * 2 + c.float()""",
    """m = x > 0
        v = m[:, :32]
        v &= y[:, :32] > 0
        return x.masked_fill(m, 0.0)""",
    """m = x > 0
        m |= y > 1
        return x.masked_fill(m, -1.0)""",
    # a loop over a traced size sends the capture to torch.export, where ``&`` and ``|`` are
    # ATen's ``__and__`` and ``__or__``
    """acc = x[:, 0]
        for t in range(1, x.shape[1]):
            acc = acc + x[:, t]
        m = ((x > 0) & (y > 0)) | (y < -1)
        return x.masked_fill(~m, 0.0) + acc[:, None]""",
]


@pytest.mark.parametrize("body", BODIES)
def test_mask_operators_write_only_what_they_assign(body: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
