"""Losses as training code writes them: a loss module built inside forward
(``nn.KLDivLoss(reduction="batchmean")(a, b)``, fx would stop at it), and ATen's loss calls
on the ``torch.export`` path (a program with ``nn.MultiheadAttention``), whose reductions are
enums and whose elementwise losses broadcast through ``broadcast_tensors``. Each must be
generated whole and match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_MODULE_IN_FORWARD = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, student, teacher, labels):
        soft = nn.KLDivLoss(reduction="batchmean")(
            F.log_softmax(student / 4.0, dim=1), F.softmax(teacher / 4.0, dim=1))
        return soft * 14.4 + nn.CrossEntropyLoss()(student, labels) * 0.1


def get_inputs():
    return [torch.randn(6, 10), torch.randn(6, 10), torch.randint(0, 10, (6,))]


def get_init_inputs():
    return []
"""

_EXPORTED = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)

    def forward(self, x, t, labels):
        y = self.attn(x, x, x, need_weights=False)[0].sum(0)
        return {expr}


def get_inputs():
    return [torch.randn(5, 4, 16), torch.randn(4, 16), torch.randint(0, 16, (4,))]


def get_init_inputs():
    return []
"""

EXPORTED_LOSSES = [
    "F.kl_div(F.log_softmax(y, 1), F.softmax(t, 1), reduction='batchmean') + F.cross_entropy(y, labels, label_smoothing=0.1)",  # noqa: E501
    "F.mse_loss(y, t) + F.smooth_l1_loss(y, t, beta=0.5, reduction='sum') + F.l1_loss(y, t * 2.0)",
    "F.binary_cross_entropy_with_logits(y, torch.sigmoid(t)) + F.huber_loss(y, t, delta=0.3, reduction='none')",  # noqa: E501
]


def test_a_loss_module_built_in_forward_is_traced_through(tmp_path: Path) -> None:
    task, program = generate_checked(_MODULE_IN_FORWARD)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("expr", EXPORTED_LOSSES)
def test_exported_losses_are_generated(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_EXPORTED.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "broadcast_tensors" not in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
