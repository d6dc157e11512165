"""Results of ops left to PyTorch are read with our (contiguous) layout.

``torch.einsum`` with more than a matrix product returns a permuted view of its product; the
kernels after it index the result as a contiguous buffer, so the host makes it one. (An einsum
whose sizes broadcast, as here, stays in PyTorch; plain ones are generated, see
``test_einsum.py``.)
"""

from __future__ import annotations

from pathlib import Path

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        y = torch.einsum("bhzc,bchp->bzhp", a, b)
        return torch.relu(y[:, :-1]) * 2.0


def get_inputs():
    return [torch.randn(2, 3, 4, 5), torch.randn(2, 5, 1, 6)]


def get_init_inputs():
    return []
"""


def test_permuted_einsum_result_matches_pytorch(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM)
    assert "torch.einsum" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_atens_einsum_contraction_path_is_left_out_of_the_torch_call() -> None:
    """With opt_einsum installed, export records ``aten.einsum(eq, ops, path=[...])``; the
    public ``torch.einsum`` takes no ``path``."""
    import torch

    from stitch_graph.codegen._capture_names import _rewrite_call

    graph = torch.fx.Graph()
    a, b, c = (graph.placeholder(n) for n in "abc")
    args, kwargs = ("ij,jk,kl->il", [a, b, c]), {"path": [0, 1, 0, 1]}
    node = graph.call_function(torch.ops.aten.einsum.default, args, kwargs)
    op, call, call_args, call_kwargs = _rewrite_call(None, node, list(args), dict(kwargs))
    assert (op, call, call_kwargs) == ("einsum", "torch.einsum", {})
    x = [torch.randn(2, 3), torch.randn(3, 4), torch.randn(4, 5)]
    torch.testing.assert_close(torch.einsum(call_args[0], x, **call_kwargs), x[0] @ x[1] @ x[2])
