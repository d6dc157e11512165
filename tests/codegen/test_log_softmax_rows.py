"""A ``softmax`` or ``log_softmax`` that is only reduced (read by gathers and row sums or means
along its dim, or by pointwise ops whose chains end in reductions along it or in a ``kl_div``) is
written from the row's logsumexp: no probability tensor is stored. One read another way keeps the tensor. Every
case matches PyTorch in the CPU emulation."""

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
    "return (F.log_softmax(x, 1) * F.softmax(x, 1)).sum(1)",  # an entropy
    # fairseq's label-smoothed NLL: the rows regrouped by a view, its size read for epsilon
    """lp = F.log_softmax(x.transpose(1, 2), dim=-1).view(-1, x.size(1))
        eps = 0.1 / (lp.size(-1) - 1)
        tt = t.view(-1, 1)
        return (-lp.gather(-1, tt) * 0.8 - eps * lp.sum(-1, keepdim=True)).sum()""",
    # distillation through F.kl_div: summed whole, and elementwise then summed along the rows
    """kd = F.kl_div(F.log_softmax(x / 2.0, 1), F.softmax(x * 0.5, 1), reduction="batchmean")
        p, q = F.log_softmax(x, 1), F.log_softmax(x * 0.7, 1)
        sym = F.kl_div(p, q, reduction="none", log_target=True).sum(1)
        return kd + sym.mean()""",
    # a calibration's top probability and its class
    """conf, pred = torch.max(F.softmax(x, dim=1), 1)
        return conf * pred.float()""",
    # a distillation KL of two tempered softmaxes, each tempered input written twice
    """p = F.softmax(x / 2.0, dim=1)
        kl = (p * (F.log_softmax(x / 2.0, dim=1) - F.log_softmax(x * 0.3, dim=1))).sum(1)
        return kl.mean() * 4.0""",
]
KEPT = [
    """lp = torch.log_softmax(x, 1)
        return lp, lp.mean(1)""",  # returned as well
    """lp = F.log_softmax(x, dim=1)
        return lp.mean(dim=(1,)) + lp.sum(2)[:, :30]""",  # a sum along another dim
    """p = torch.softmax(x, 1)
        return (p * x).sum(1), p + 1""",  # a chain that is returned
    "return torch.softmax(x, 2) @ x.transpose(1, 2)",  # a matmul
    "return F.log_softmax(x, 2).view(8, 1500).sum(-1)",  # a view that merges the rows
    """p = torch.softmax(x, 1)
        return (p * x).sum(2) + p.sum(2)""",  # sums along another dim: the tensor is read twice
]


@pytest.mark.parametrize(("body", "rewritten"), [(b, True) for b in FROM_LSE] + [(b, False) for b in KEPT])  # noqa: E501
def test_a_softmax_only_reduced_comes_from_the_logsumexp(
    body: str, rewritten: bool, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops
    anchors = {item.fusion.split(" (")[0] for item in plan_program(capture_program(task)).items}
    assert bool({"anchor log_softmax", "anchor softmax"} & anchors) is not rewritten, anchors
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_tempered_input_is_computed_by_each_pass_that_reads_it() -> None:
    """``x / 2.0`` read by the logsumexp and by the KL's sum is divided in both passes, and
    the two logsumexps of the teacher's one tempered value are one: no tensor is stored but
    the row results."""
    task, _ = generate_checked(_PROBLEM.format(body=FROM_LSE[-1]))
    items = plan_program(capture_program(task)).items
    assert [item.kind for item in items] == ["reduction"] * 3, [i.fusion for i in items]
    # the two logsumexps (the student's, the teacher's) share a pass: its anchor and sibling
    assert sum(item.fusion.count("logsumexp") for item in items) == 2
