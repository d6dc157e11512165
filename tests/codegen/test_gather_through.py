"""A gather of a pointwise op's result reads the op's operands instead
(``_capture_gather_through``): a cross entropy written out no longer stores its log-softmax."""

from __future__ import annotations

from pathlib import Path

from stitch_graph.codegen import capture_program, plan_program
from stitch_graph.codegen._capture_gather_through import _move
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, logits, target, bias):
        {body}


def get_inputs():
    return [torch.randn(8, 300), torch.randint(0, 300, (8,)), torch.randn(1, 300)]


def get_init_inputs():
    return []
"""

# label smoothing written out: the gather and the mean both read ``logits - lse``
SMOOTHED = """lse = torch.logsumexp(logits, dim=-1)
        log_probs = logits - lse.unsqueeze(-1)
        nll = -log_probs.gather(dim=-1, index=target.unsqueeze(-1)).squeeze(-1)
        return (0.9 * nll - 0.1 * log_probs.mean(dim=-1)).mean() + 0.0 * bias.sum()"""


def test_a_written_out_cross_entropy_stores_no_log_softmax(tmp_path: Path) -> None:
    source = _PROBLEM.format(body=SMOOTHED)
    ir = capture_program(load_task(source))
    full = [n.name for n in ir.nodes if tuple(n.shape) == (8, 300)]
    gathered = [n for n in ir.nodes if n.op == "gather"]
    assert gathered and all(n.args["input"].kind == "input" for n in gathered)
    # the subtraction is left for the mean alone, which computes it as it loads
    plan = plan_program(ir)
    assert not any(item.ops == full for item in plan.items)
    assert not any(item.kind == "pointwise" and set(full) & set(item.ops) for item in plan.items)
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_operand_that_varies_along_the_gathered_dim_keeps_the_gather_where_it_is() -> None:
    # ``bias`` has a value for every class: the gather must read the sum
    body = "return (logits - bias).gather(1, target.unsqueeze(1)) + (logits - bias).mean()"
    ir = capture_program(load_task(_PROBLEM.format(body=body)))
    gather = next(n for n in ir.nodes if n.op == "gather")
    assert ir.node(gather.args["input"].name).op == "sub"
    assert _move(ir, gather) is None
