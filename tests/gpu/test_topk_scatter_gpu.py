"""``topk`` of lines too long to sort in a block, and a scatter of a tensor, on a real GPU.

Such a ``topk`` is a radix select of the k-th key per line (a block a line), with the k keys
sorted in shared memory; a scatter of a tensor (a router's weights put back at its top
indices) is a copy of the input and a thread per source element. A sampler's top-k filter over
a 32000-token vocabulary, a MoE router and a long line's values and positions are each fully
generated and match PyTorch at 1e-4 (TF32 off) on three draws; the sampler is no slower than
eager PyTorch, and the long line's time against eager is printed.
"""

from __future__ import annotations

import pytest

from tests.gpu.test_codegen_layouts_gpu import _matched_then_timed, _matches_pytorch

pytestmark = pytest.mark.gpu

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, {arg}):
        {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

_SAMPLER = _PROBLEM.format(
    arg="logits",
    shape="512, 32000",
    body="""logits = logits / 0.8
        v, _ = torch.topk(logits, 50, dim=-1)
        logits = logits.masked_fill(logits < v[:, [-1]], float('-inf'))
        return F.softmax(logits, dim=-1)""",
)
_ROUTER = _PROBLEM.format(
    arg="x",
    shape="16384, 64",
    body="""top_vals, top_idx = torch.topk(x, 2, dim=-1)
        return torch.zeros_like(x).scatter(-1, top_idx, torch.softmax(top_vals, -1))""",
)
_LONG_LINE = _PROBLEM.format(
    arg="x",
    shape="256, 100000",
    body="""v, i = torch.topk(x, 16, dim=1)
        return v * 2 + i.float()""",
)


def _generated(source: str, marker: str = ""):  # noqa: ANN202
    """The problem's program, fully generated (nothing left to PyTorch), with ``marker``."""
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    ir = capture_program(load_task(source))
    program = emit_candidate(ir, plan_program(ir))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert marker in program.kernel_source
    return program


def test_a_samplers_top_k_filter_matches_pytorch_at_eagers_speed() -> None:
    program = _generated(_SAMPLER, "radix select")
    ours, eager = _matched_then_timed(_SAMPLER, program)
    print(f"top-k filter of 32000: program {ours:.3f} ms, eager {eager:.3f} ms")
    assert ours <= eager * 1.1


def test_a_routers_weights_scattered_to_its_top_experts_match_pytorch() -> None:
    _matches_pytorch(_ROUTER, _generated(_ROUTER))


def test_topk_values_and_positions_of_a_long_line_match_pytorch() -> None:
    program = _generated(_LONG_LINE, "radix select")
    ours, eager = _matched_then_timed(_LONG_LINE, program)
    print(f"topk 16 of 100000: program {ours:.3f} ms, eager {eager:.3f} ms")
